"""The core of the gateway–shard contract: what every shard answers and what every delivery looks like.

Each dialect adds its own operations in ``actors/<dialect>/contract.py`` (one namespace per
dialect, imported by both its gateway session and its shard component); this module holds the
shapes they all share.

Two kinds of shapes travel between processes:

- **Hot-path records** (commands, delivery items, bundles, the event-log meta, a message event):
  plain tuples whose layout is declared here by a ``NamedTuple`` and built by one constructor
  each. They are pickled as plain tuples because pickle handles an exact tuple in C (0.37 µs a
  record here) but a tuple subclass through its generic reduce path (3.1 µs, measured), and a
  message crosses two processes several times. A receiver reads them by unpacking into names
  (``origin, seq, ingress_ns, dialect, kind, topic = meta``), never by index.
- **Everything else** (results, snapshots, restored state, presence and lobby events): the
  ``NamedTuple`` itself.

A command is ``(op, *fields)``: ``op`` is one of a dialect's ``Op`` constants and the fields are
the parameters of the handler that its shard component registers for it, after ``gateway_id``
(``tests/unit/test_contract.py`` checks every constructor against its handler).
"""

from __future__ import annotations

import time
from typing import Any, Iterable, NamedTuple


def now_ms() -> int:
    """Wall-clock time in epoch milliseconds (what shards stamp and protocols report)."""
    return time.time_ns() // 1_000_000


# -- delivery kinds: how a gateway turns an item's payload into frames ---------------------------

DELIVER_TEXT = 0  # payload is the UTF-8 body of a text frame, written as is to every recipient
DELIVER_BINARY = 1  # payload is the body of a binary frame
DELIVER_EVENT = 2  # payload is a dialect event, handed to each recipient's session (``on_event``)
# Like DELIVER_EVENT, for an event that carries several messages to each recipient (an mx block's
# frames for one consumer): its first field is their sequence, and the gateway counts each message
# as a delivery (``delivery_weight``: the slices of a loop turn, undeliverable counts).
DELIVER_EVENTS = 3


def event_messages(kind: int, payload: Any) -> int:
    """How many messages one recipient of a delivery gets: those of a DELIVER_EVENTS payload, else one."""
    return len(payload[0]) if kind == DELIVER_EVENTS else 1


def delivery_weight(item: tuple) -> int:
    """The deliveries a ``Delivery`` item makes: one per recipient, times its messages for DELIVER_EVENTS."""
    kind, payload, connection_ids, _ = item
    return len(connection_ids) * event_messages(kind, payload)


class Op:
    """Operations every shard answers, whatever its components; and the core pub/sub of topic
    shards (``actors/pubsub.py``), which any dialect may use for its topics."""

    PURGE = "core.purge"  # every component forgets the connection
    STATS = "core.stats"  # every component's counters, merged
    SUBSCRIBE = "core.sub"
    UNSUBSCRIBE = "core.unsub"
    PUBLISH = "core.pub"
    REANNOUNCED = "core.reannounced"  # a gateway re-announced what it held in a restarted shard


HEALING = "healing"  # the CommandError code of a command that a healing shard asks to retry


def purge(connection_id: int) -> tuple:
    return (Op.PURGE, connection_id)


def reannounced() -> tuple:
    """Ends a gateway's re-announcements to a restarted shard; answers True."""
    return (Op.REANNOUNCED,)


def stats() -> tuple:
    return (Op.STATS,)


def subscribe(topic: str, connection_id: int, info: Any = None) -> tuple:
    """Answers True if the subscription is new."""
    return (Op.SUBSCRIBE, topic, connection_id, info)


def unsubscribe(topic: str, connection_id: int) -> tuple:
    """Answers True if the connection was subscribed."""
    return (Op.UNSUBSCRIBE, topic, connection_id)


def publish(topic: str, payload: Any, kind: int, exclude: int | None = None, meta: tuple | None = None) -> tuple:
    """Deliver ``payload`` (encoded once) to the topic's subscribers but ``exclude``; answers how many."""
    return (Op.PUBLISH, topic, payload, kind, exclude, meta)


# -- the event-log meta: where and when a message entered the router ------------------------------

class EventMeta(NamedTuple):
    """Layout of the meta that travels with a message to every delivery of it (a plain tuple)."""

    origin: str  # the gateway where the message entered
    seq: int  # with origin: the router's id of the message
    ingress_ns: int  # when it entered (epoch ns)
    dialect: str
    kind: str | None  # the protocol's message type, e.g. hub:publish
    topic: str | None  # topic, or target address


META_FIELDS = {name: position for position, name in enumerate(EventMeta._fields)}


def event_meta(origin: str, seq: int, ingress_ns: int, dialect: str, kind: str | None = None,
               topic: str | None = None) -> tuple:
    return (origin, seq, ingress_ns, dialect, kind, topic)


def retag(meta: tuple, kind: str | None, topic: str | None) -> tuple:
    """The same message's meta, once its kind and topic are known (after decoding)."""
    origin, seq, ingress_ns, dialect, _, _ = meta
    return (origin, seq, ingress_ns, dialect, kind, topic)


# -- deliveries ------------------------------------------------------------------------------------

class Delivery(NamedTuple):
    """Layout of one item of a bundle: one payload for some connections of one gateway."""

    kind: int  # DELIVER_TEXT, DELIVER_BINARY, DELIVER_EVENT or DELIVER_EVENTS
    payload: Any  # bytes encoded once by the publishing gateway, or a dialect event
    connection_ids: tuple[int, ...]
    meta: tuple | None  # an EventMeta when the delivery is to be counted and logged as it is written


def delivery(kind: int, payload: Any, connection_ids: tuple[int, ...], meta: tuple | None) -> tuple:
    return (kind, payload, connection_ids, meta)


class Bundle(NamedTuple):
    """Layout of the deliveries one shard batch produced for one gateway."""

    source: str  # the shard's name
    epoch: str  # changes when the shard restarts
    seq: int  # counts per (shard, gateway): the gateway restores the emission order
    items: list  # Delivery layouts


def bundle(source: str, epoch: str, seq: int, items: list) -> tuple:
    return (source, epoch, seq, items)


Location = tuple[str, int]  # (gateway id, connection id): how a shard addresses a connection
Routes = dict[str, tuple[int, ...]]  # gateway id -> connection ids


def group_by_gateway(locations: Iterable[Location]) -> Routes:
    """Locations as fan-out routes: gateway id -> its connection ids, in the order given."""
    routes: dict[str, list[int]] = {}
    for gateway_id, connection_id in locations:
        ids = routes.get(gateway_id)
        if ids is None:
            routes[gateway_id] = [connection_id]
        else:
            ids.append(connection_id)
    return {gateway_id: tuple(ids) for gateway_id, ids in routes.items()}
