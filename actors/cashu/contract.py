"""Cashu NUT-17 between gateways and topic shards: each object's last state, retained and versioned.

An object is the core topic ``cashu/<kind>/<id>`` in the topic shard that owns it; its
subscribers are kept in the core pub/sub table (unsubscribe with ``router.contract.unsubscribe``).
"""

from __future__ import annotations

from typing import NamedTuple

from actors.cashu.retained import Retained

__all__ = ["Op", "Retained", "RetainedEvent", "Stored", "subscribe", "set_state", "init_state"]


class Op:
    SUBSCRIBE = "cashu.subscribe"
    SET = "cashu.set"
    INIT = "cashu.init"


class Stored(NamedTuple):
    """The answer to ``set_state``."""

    version: int
    subscribers: int


class RetainedEvent(NamedTuple):
    """A ``DELIVER_EVENT`` payload: an object's new state, to its subscribers."""

    key: str
    version: int
    payload: bytes
    meta: tuple | None  # EventMeta of the push that stored it


def subscribe(key: str, connection_id: int) -> tuple:
    """Subscribe and read the current state in one step; answers a :class:`Retained` or None."""
    return (Op.SUBSCRIBE, key, connection_id)


def set_state(key: str, payload: bytes, meta: tuple | None = None) -> tuple:
    """Store a new state and deliver it to the subscribers; answers :class:`Stored`."""
    return (Op.SET, key, payload, meta)


def init_state(key: str, payload: bytes, meta: tuple | None = None) -> tuple:
    """Store a state fetched from the mint unless one arrived meanwhile; answers the :class:`Retained` now."""
    return (Op.INIT, key, payload, meta)
