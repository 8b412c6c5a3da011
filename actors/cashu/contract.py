"""Cashu NUT-17 between gateways and topic shards: each object's last state, retained and versioned.

An object is the core topic ``cashu/<kind>/<id>`` in the topic shard that owns it; its
subscribers are kept in the core pub/sub table (unsubscribe with ``router.contract.unsubscribe``).
"""

from __future__ import annotations

from typing import NamedTuple

from actors.cashu.retained import Retained

__all__ = ["Op", "Retained", "RetainedEvent", "Stored", "subscribe_many", "unsubscribe_many", "set_state",
           "init_many"]


class Op:
    SUBSCRIBE_MANY = "cashu.subscribe_many"
    UNSUBSCRIBE_MANY = "cashu.unsubscribe_many"
    SET = "cashu.set"
    INIT_MANY = "cashu.init_many"


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


def subscribe_many(keys: tuple[str, ...], connection_id: int) -> tuple:
    """Subscribe to several keys of one shard and read their current states in one step (a
    subscription's filters: one command per shard, not per filter); answers a list, one
    :class:`Retained` or None per key. Later states are delivered after it."""
    return (Op.SUBSCRIBE_MANY, keys, connection_id)


def unsubscribe_many(keys: tuple[str, ...], connection_id: int) -> tuple:
    """Unsubscribe from several keys of one shard; answers how many subscriptions there were."""
    return (Op.UNSUBSCRIBE_MANY, keys, connection_id)


def set_state(key: str, payload: bytes, meta: tuple | None = None) -> tuple:
    """Store a new state and deliver it to the subscribers; answers :class:`Stored`."""
    return (Op.SET, key, payload, meta)


def init_many(keys: tuple[str, ...], payloads: tuple[bytes, ...]) -> tuple:
    """Store states fetched from the mint for several keys of one shard, each unless one arrived
    meanwhile; answers a list, the :class:`Retained` of each key now."""
    return (Op.INIT_MANY, keys, payloads)
