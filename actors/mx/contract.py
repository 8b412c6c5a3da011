"""mx-notifier hub between gateways and topic shards: consumers' filters, and blocks matched once.

A consumer's filters live in one topic shard (placed by its connection); every block goes to every
topic shard in one ``publish`` each, and each shard matches it against the filters it holds.
"""

from __future__ import annotations

import pickle
from typing import Any, NamedTuple

from actors.mx.match import Subscription

__all__ = ["Op", "Stream", "BlockItem", "block_item", "MxFrames", "mx_frames", "subscribe", "publish", "unpack_items",
           "Subscription"]


class Op:
    SUBSCRIBE = "mx.subscribe"
    PUBLISH = "mx.publish"


class Stream:
    """Which connections a block item selects."""

    EVENT = 0  # a log event: the connections whose filters match its fields
    BLOCK = 1  # revert / finalized: every connection with a filter
    ALL = 2  # block txs / scrs: the connections with an ``All`` filter


class BlockItem(NamedTuple):
    """Layout of one item of a published block (a plain tuple: a block has hundreds)."""

    stream: int  # a Stream
    fields: tuple | None  # Stream.EVENT: (address, identifier, topics)
    topic: str  # the WsMessage topic of the frame
    tail: bytes  # the frame's shared part, encoded once by the ingesting gateway


def block_item(stream: int, fields: tuple | None, topic: str, tail: bytes) -> tuple:
    return (stream, fields, topic, tail)


class MxFrames(NamedTuple):
    """Layout of a ``DELIVER_EVENTS`` payload to one consumer (a plain tuple: one per consumer per
    block): the frame tails of a block's items that consumer's filters select, in block order."""

    tails: tuple[bytes, ...]
    meta: tuple | None


def subscribe(connection_id: int, subscription: Subscription) -> tuple:
    """Add a filter; answers True if the connection did not have it."""
    return (Op.SUBSCRIBE, connection_id, subscription)


def publish(items: list, meta: tuple | None = None) -> tuple:
    """Deliver a block's items (``block_item`` layouts) to the connections they select; answers how
    many. The items travel pickled once (:func:`unpack_items`): the same block goes to every topic
    shard, and a lane would otherwise pickle it again for each."""
    return (Op.PUBLISH, pickle.dumps(items, protocol=pickle.HIGHEST_PROTOCOL), meta)


def unpack_items(packed: bytes) -> list:
    """A ``publish``'s items, as the gateway gave them (it and the shard trust each other's pickles
    on a lane already)."""
    return pickle.loads(packed)


def mx_frames(tails: tuple[bytes, ...], meta: Any) -> tuple:
    return (tails, meta)
