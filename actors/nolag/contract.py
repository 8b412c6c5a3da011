"""NoLag between gateways and shards: topics, rooms and lobbies in topic shards; actors in session shards.

Keys: a topic is ``nolag/<project>/<topic>`` and a room ``nolag-room/<project>/<room>`` in the
topic shards; an actor's kept state is ``nolag/<actor>`` in the session shards.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class Op:
    # topic shards
    SUBSCRIBE = "nolag.subscribe"
    UNSUBSCRIBE = "nolag.unsubscribe"
    SET_FILTERS = "nolag.set_filters"
    PUBLISH = "nolag.publish"
    LOG = "nolag.log"
    ROOM = "nolag.room"
    PRESENCE = "nolag.presence"
    PRESENCE_RESTORE = "nolag.presence_restore"
    PRESENCE_LIST = "nolag.presence_list"
    LOBBY_SUBSCRIBE = "nolag.lobby_subscribe"
    LOBBY_UNSUBSCRIBE = "nolag.lobby_unsubscribe"
    # session shards
    ACTOR_RESET = "nolag.actor_reset"
    ACTOR_GET = "nolag.actor_get"
    ACTOR_SAVE = "nolag.actor_save"
    ACTOR_CHECKPOINT = "nolag.actor_checkpoint"
    ACTOR_SEEN = "nolag.actor_seen"
    ACTOR_UNSEEN = "nolag.actor_unseen"


def topic_key(project: str, topic: str) -> str:
    return f"nolag/{project}/{topic}"


def room_key(project: str, room: str | None) -> str:
    return f"nolag-room/{project}/{room or ''}"


def actor_key(actor: str) -> str:
    return f"nolag/{actor}"


def topic_of(key: str) -> str:
    """``nolag/<project>/<topic>`` → ``<topic>``."""
    return key.split("/", 2)[2]


# -- topic shards ---------------------------------------------------------------------------------

def subscribe(key: str, connection_id: int, actor: str, filters: tuple[str, ...], qos: int,
              group: str | None, after_ms: int | None = None) -> tuple:
    """Add or replace the connection's subscription; answers the topic's position (the shard
    timestamp of its last message, or now). With ``after_ms`` (a re-announce to a restarted shard:
    the last message the connection got) the shard also delivers what its log holds after it."""
    return (Op.SUBSCRIBE, key, connection_id, actor, filters, qos, group, after_ms)


def unsubscribe(key: str, connection_id: int) -> tuple:
    return (Op.UNSUBSCRIBE, key, connection_id)


def set_filters(key: str, connection_id: int, filters: tuple[str, ...]) -> tuple:
    """Replace the filter set (empty: wildcard); answers False if not subscribed."""
    return (Op.SET_FILTERS, key, connection_id, filters)


def publish(key: str, topic: str, packed: bytes, qos: int, filter_: str | None, exclude: int | None,
            msg_id: str | None, sender: str, meta: tuple | None = None) -> tuple:
    """Route one message (filters, echo, one member per load-balance group), logging it if it has
    an id; answers how many it went to. The shard stamps its time."""
    return (Op.PUBLISH, key, topic, packed, qos, filter_, exclude, msg_id, sender, meta)


class Message(NamedTuple):
    """Layout of a published message as delivered (``DELIVER_EVENT``; a plain tuple: the hot path)."""

    topic: str
    packed: bytes  # the message's data, MessagePack-encoded once by the publishing gateway
    msg_id: str | None
    qos: int
    filter: str | None
    ts_ms: int  # the shard's stamp: strictly increasing per topic
    sender: str
    meta: tuple | None


def message(topic: str, packed: bytes, msg_id: str | None, qos: int, filter_: str | None, ts_ms: int,
            sender: str, meta: tuple | None) -> tuple:
    return (topic, packed, msg_id, qos, filter_, ts_ms, sender, meta)


def log(key: str, after_ms: int, limit: int) -> tuple:
    """Logged messages of a topic after a position (a reconnect's replay); answers LoggedMessages."""
    return (Op.LOG, key, after_ms, limit)


class LoggedMessage(NamedTuple):
    topic: str
    msg_id: str
    ts_ms: int
    packed: bytes
    qos: int
    filter: str | None


def room(room_key_: str, connection_id: int, join: bool) -> tuple:
    """The connection is (no longer) in a room through its subscriptions: it gets the room's presence."""
    return (Op.ROOM, room_key_, connection_id, join)


def presence(room_key_: str, connection_id: int, actor: str, data: Any, now_ms: int) -> tuple:
    """Set (or with ``data`` None clear) the actor's presence in the room; answers its ``joinedAt``
    (None: it is not present)."""
    return (Op.PRESENCE, room_key_, connection_id, actor, data, now_ms)


def presence_restore(room_key_: str, connection_id: int, actor: str, data: Any, joined_at: int) -> tuple:
    """Re-announce to a restarted shard: the actor is present as it was, and nobody hears of it."""
    return (Op.PRESENCE_RESTORE, room_key_, connection_id, actor, data, joined_at)


def presence_list(room_key_: str) -> tuple:
    """Answers ``[{actorTokenId, presence, joinedAt}]`` in join order."""
    return (Op.PRESENCE_LIST, room_key_)


class PresenceChange(NamedTuple):
    """A ``DELIVER_EVENT`` payload to the room's members."""

    room: str | None
    event: str  # join | update | leave
    actor: str
    data: Any
    joined_at: int


class LobbySpec(NamedTuple):
    project: str
    rooms: tuple[str, ...] | None
    prefix: str | None


def lobby_subscribe(lobby_id: str, spec: LobbySpec, connection_id: int, listen: bool) -> tuple:
    """This shard's part of a lobby's presence ``{room: {actor: data}}``; with ``listen`` later
    changes go to the connection as LobbyChanges."""
    return (Op.LOBBY_SUBSCRIBE, lobby_id, spec, connection_id, listen)


def lobby_unsubscribe(lobby_id: str, connection_id: int) -> tuple:
    return (Op.LOBBY_UNSUBSCRIBE, lobby_id, connection_id)


class LobbyChange(NamedTuple):
    """A ``DELIVER_EVENT`` payload to a lobby's listeners."""

    lobby: str
    room: str
    event: str
    actor: str
    data: Any


# -- session shards: what an actor keeps while it is away -----------------------------------------

class SubscriptionRecord(NamedTuple):
    qos: int
    filters: tuple[str, ...]
    load_balance: bool
    group: str | None


class ActorState(NamedTuple):
    subscriptions: dict[str, SubscriptionRecord]  # topic -> record
    resume: dict[str, int]  # topic -> the last message written to the actor
    floors: dict[str, int]  # topic -> just before the oldest message it had not acked
    seen: list[str]  # QoS 2 message ids delivered (oldest first)
    acks: bool  # it has acked: replayed after its floors, else after its positions


def actor_reset(actor: str) -> tuple:
    """A fresh session (``reconnect: false``): forget what the actor kept."""
    return (Op.ACTOR_RESET, actor)


def actor_get(actor: str) -> tuple:
    """Answers the actor's ActorState, or None."""
    return (Op.ACTOR_GET, actor)


def actor_save(actor: str, topic: str, record: SubscriptionRecord | None, position: int | None) -> tuple:
    """Keep (or with ``record`` None drop) a subscription, and where to replay it from if unknown."""
    return (Op.ACTOR_SAVE, actor, topic, record, position)


def actor_checkpoint(actor: str, resume: dict[str, int], floors: dict[str, int], acks: bool) -> tuple:
    """Per topic, the last message written and the floor below the oldest unacked one; whether the
    actor acks (once true, it stays so until a reset)."""
    return (Op.ACTOR_CHECKPOINT, actor, resume, floors, acks)


def actor_seen(actor: str, records: tuple[tuple[str, str, int], ...]) -> tuple:
    """QoS 2 messages ``(msg_id, topic, ts_ms)`` about to be written to the actor: stored (committed)
    before the answer, so no replay ever writes them again."""
    return (Op.ACTOR_SEEN, actor, records)


def actor_unseen(actor: str, msg_ids: tuple[str, ...]) -> tuple:
    """QoS 2 ids recorded (or being recorded) but never written: the connection ended first, so a
    replay may write them after all."""
    return (Op.ACTOR_UNSEEN, actor, msg_ids)
