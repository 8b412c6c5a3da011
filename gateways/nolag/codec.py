"""NoLag frames: MessagePack maps in, requests or one :class:`NolagError` out; replies as bytes.

Pure: no sockets, no actors, no clock. The empty frame (a heartbeat) never reaches :func:`decode`;
the session answers it.

Error names: the spec's ``rate_limit_exceeded`` (42910), ``monthly_quota_exceeded`` (42920),
``message_too_large`` (42930), ``not_authorized``, ``not_subscribed``, ``invalid_filter_chars``; the
broker's ``not_authenticated``, ``access_denied`` and ``too_many_filters``; and, for frames the spec
does not cover, ``invalid_message`` (not MessagePack, not a map, a field of the wrong type),
``unknown_type``, ``invalid_topic`` (not ``app/room/topic``) and ``invalid_filter`` (empty, too
long, not a string, an AND group). Only the 429xx errors have a code. An error carries the request's
``topic`` (when it was a string) and ``msgRef`` (when it was a scalar), so the SDK can fail the
operation that caused it.

Choices where the spec leaves room (also in ``docs/nolag.md``):
- ``Publish.data_packed`` is ``data`` packed again once, at decode (canonical MessagePack, never
  longer than the client's): its length is "the size of the packed data", and it is spliced into
  every ``message`` frame of the fan-out. Measured: re-packing beats slicing the frame with a
  streaming unpacker for small frames (2.8 vs 4.5 µs) and for binary blobs.
- Filters repeated within one request count once; the limit (100) counts distinct filters.
- ``loadBalanceGroup`` is kept only with ``loadBalance: true``; without a group the caller uses the
  actor token (as the broker does).
- ``presence`` and ``getPresence`` may omit ``roomId`` (the SDK does when no room is set): ``None``.
  ``presence`` with ``data: nil`` is the SDK's ``clear_presence``.
- The SDK's ``getLobbyPresence`` (not in the spec) is decoded and answered by ``lobbyPresenceList``.
- Unknown fields are ignored (``retain``, the SDK's auth-level ``loadBalance`` is decoded but
  advisory); an AND-composite publish (``filters`` on publish) or AND filter groups are refused
  with ``invalid_filter`` rather than silently widened.
- ``message`` omits ``msgId``, ``requiresAck``, ``isReplay`` and ``filter`` when they are absent or
  false (the SDK reads them with those defaults).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import msgpack

from router.nesting import MAX_NESTING, too_deep

ERROR_CODES: dict[str, int] = {
    "rate_limit_exceeded": 42910,
    "monthly_quota_exceeded": 42920,
    "message_too_large": 42930,
}

# What the SDK's ``ActorType`` accepts: any other ``actor_type`` raises inside its receive loop.
ACTOR_TYPES = frozenset({"device", "user", "server", "service", "session", "agent", "orchestrator", "observer"})
MAX_PROTOCOL_VERSION = 2

_TOPIC = re.compile(r"[A-Za-z0-9_.\-]+/[A-Za-z0-9_.\-]+/[A-Za-z0-9_.\-]+")
_FILTER_FORBIDDEN = frozenset("/#+")


class NolagError(Exception):
    """A request that cannot be served; ``error`` is the wire name, ``message`` says what to fix."""

    def __init__(self, error: str, code: int | None, message: str, topic: str | None = None,
                 msg_ref: Any = None) -> None:
        super().__init__(error, message)
        self.error = error
        self.code = code
        self.message = message
        self.topic = topic
        self.msg_ref = msg_ref


def nolag_error(error: str, message: str, topic: str | None = None, msg_ref: Any = None) -> NolagError:
    """A :class:`NolagError` with the spec's code for ``error`` (if it has one)."""
    return NolagError(error, ERROR_CODES.get(error), message, topic, msg_ref)


@dataclass(frozen=True, slots=True)
class Limits:
    max_topic_length: int = 256
    max_filters: int = 100
    max_filter_length: int = 256
    max_id_length: int = 256  # roomId, lobbyId, msgId, loadBalanceGroup, projectId
    max_batch_ack: int = 1000


DEFAULT_LIMITS = Limits()


@dataclass(frozen=True, slots=True)
class Auth:
    token: str
    reconnect: bool = False
    project_id: str | None = None
    protocol_version: int = 1  # absent: a pre-v2 client
    load_balance: bool = False
    load_balance_group: str | None = None


@dataclass(frozen=True, slots=True)
class Subscribe:
    topic: str
    qos: int = 1
    filters: tuple[str, ...] = ()  # distinct, in request order; empty = wildcard
    load_balance: bool = False
    group: str | None = None  # only with load_balance; None there = the actor token


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    topic: str


@dataclass(slots=True)  # not frozen: a frozen dataclass sets each field through object.__setattr__ (0.5 µs a publish)
class Publish:
    topic: str
    data: Any
    qos: int = 1
    echo: bool = True
    filter: str | None = None
    msg_ref: Any = None
    data_packed: bytes = b"\xc0"  # ``data`` packed (canonical); b"\xc0" is nil

    @property
    def data_size(self) -> int:
        return len(self.data_packed)


@dataclass(frozen=True, slots=True)
class SetFilters:
    topic: str
    filters: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Presence:
    room_id: str | None
    data: Any  # None: clear


@dataclass(frozen=True, slots=True)
class GetPresence:
    room_id: str | None


@dataclass(frozen=True, slots=True)
class Ack:
    msg_id: str


@dataclass(frozen=True, slots=True)
class BatchAck:
    msg_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class LobbySubscribe:
    lobby_id: str


@dataclass(frozen=True, slots=True)
class LobbyUnsubscribe:
    lobby_id: str


@dataclass(frozen=True, slots=True)
class GetLobbyPresence:
    lobby_id: str


Request = (Auth | Subscribe | Unsubscribe | Publish | SetFilters | Presence | GetPresence | Ack | BatchAck
           | LobbySubscribe | LobbyUnsubscribe | GetLobbyPresence)


# -- decoding -----------------------------------------------------------------------------------

def decode(data: bytes, limits: Limits = DEFAULT_LIMITS) -> Request:
    fields = _read_map(data)
    kind = fields.get("type")
    # A publish's data travels packed (bytes); an ack's and a batchAck's decoders keep only their
    # ids, strings they check; everything else travels to shards as decoded values.
    if not (type(kind) is str and kind in _KEEPS_NOTHING_NESTED) and too_deep(fields):
        raise nolag_error("invalid_message", f"a message may nest at most {MAX_NESTING} levels")
    if kind is None:
        raise nolag_error("invalid_message", "missing 'type'")
    if not isinstance(kind, str):
        raise nolag_error("invalid_message", "'type' must be a string")
    if kind == "publish":
        return _publish(fields, limits)
    decoder = _DECODERS.get(kind)
    if decoder is None:
        shown = kind if len(kind) <= 64 else kind[:64] + "…"
        raise nolag_error("unknown_type", f"unknown message type '{shown}'; supported: " + ", ".join(REQUEST_TYPES))
    return decoder(fields, limits)


def _read_map(data: bytes) -> dict[Any, Any]:
    if not data:
        raise nolag_error("invalid_message", "an empty frame is a heartbeat, not a message")
    try:
        # unpackb bounds every string, array and map by the frame's size (no huge pre-allocations)
        fields = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except msgpack.ExtraData:
        raise nolag_error("invalid_message", "extra bytes after the message map") from None
    except Exception as error:  # malformed bytes, bad UTF-8, unhashable keys, nesting too deep
        text = str(error)
        if text.startswith("Unpack failed: incomplete input") or " exceeds max_" in text:
            raise nolag_error("invalid_message", "truncated MessagePack") from None
        raise nolag_error("invalid_message", f"invalid MessagePack ({type(error).__name__})") from None
    if not isinstance(fields, dict):
        raise nolag_error("invalid_message", "a message must be a MessagePack map")
    return fields


@dataclass(frozen=True, slots=True)
class Envelope:
    """What an error about a frame echoes (``topic``, ``msgRef``), read without decoding the rest."""

    type: str | None = None
    topic: str | None = None
    msg_ref: Any = None


_ENVELOPE_KEYS = frozenset({"type", "topic", "msgRef"})


def envelope(data: bytes, limits: Limits = DEFAULT_LIMITS) -> Envelope:
    """``type``, ``topic`` and ``msgRef`` of a frame too large to decode: every other value (the
    publish's ``data`` above all) is skipped, not built, and the three are read only while short
    (a topic or id longer than its limit is not echoed). Whatever cannot be read is None."""
    longest = max(limits.max_topic_length, limits.max_id_length)
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=max(len(data), 1), max_str_len=longest,
                                max_bin_len=0, max_array_len=0, max_map_len=0, max_ext_len=0)
    unpacker.feed(data)
    found: dict[str, Any] = {}
    try:
        for _ in range(unpacker.read_map_header()):
            key = unpacker.unpack()
            if key in _ENVELOPE_KEYS and key not in found:
                found[key] = unpacker.unpack()
            else:
                unpacker.skip()  # no limits, no objects: a walk over the bytes
            if len(found) == len(_ENVELOPE_KEYS):
                break
    except Exception:  # not a map, truncated, a key or value over the limits, nested too deep
        pass
    kind, topic, msg_ref = found.get("type"), found.get("topic"), found.get("msgRef")
    return Envelope(kind if isinstance(kind, str) else None, topic if isinstance(topic, str) else None,
                    msg_ref if isinstance(msg_ref, (str, int, float)) else None)


def _auth(fields: dict, limits: Limits) -> Auth:
    token = fields.get("token")
    if not isinstance(token, str) or not token:
        raise nolag_error("invalid_message", "'token' must be a non-empty string")
    version = fields.get("protocolVersion", 1)
    if not _is_int(version) or version < 1:
        raise nolag_error("invalid_message", "'protocolVersion' must be a positive integer")
    load_balance = _bool(fields, "loadBalance", False)
    return Auth(token, _bool(fields, "reconnect", False), _id(fields, "projectId", limits, required=False),
                version, load_balance,
                _id(fields, "loadBalanceGroup", limits, required=False) if load_balance else None)


def _subscribe(fields: dict, limits: Limits) -> Subscribe:
    topic = _topic(fields, limits, None)
    try:
        qos = _qos(fields)
        filters = _filters(fields.get("filters", []), limits)
        load_balance = _bool(fields, "loadBalance", False)
        group = _id(fields, "loadBalanceGroup", limits, required=False) if load_balance else None
    except NolagError as error:
        error.topic = topic
        raise
    return Subscribe(topic, qos, filters, load_balance, group)


def _unsubscribe(fields: dict, limits: Limits) -> Unsubscribe:
    return Unsubscribe(_topic(fields, limits, None))


def _publish(fields: dict, limits: Limits) -> Publish:
    # Each field is checked by its helper, which also raises its error; a value of the usual kind
    # (a topic this process has checked before, an int qos of 0-2, a bool echo) is taken without
    # the call (a publish is the frame a busy topic sees most).
    msg_ref = fields.get("msgRef")
    if isinstance(msg_ref, (dict, list)):
        raise nolag_error("invalid_message", "'msgRef' must be a scalar (string or number)",
                          fields["topic"] if isinstance(fields.get("topic"), str) else None)
    topic = fields.get("topic")
    if type(topic) is not str or len(topic) > limits.max_topic_length or topic not in _SLUG_TOPICS:
        topic = _topic(fields, limits, msg_ref)
    try:
        qos = fields.get("qos", 1)
        if type(qos) is not int or not 0 <= qos <= 2:
            qos = _qos(fields)
        echo = fields.get("echo", True)
        if type(echo) is not bool:
            echo = _bool(fields, "echo", True)
        if fields.get("filters") is not None:
            raise nolag_error("invalid_filter", "'filters' (AND-composite publish) is not supported; use 'filter'")
        filter_value = fields.get("filter")
        if filter_value is not None:
            filter_value = _filter(filter_value, "'filter'", limits)
    except NolagError as error:
        error.topic, error.msg_ref = topic, msg_ref
        raise
    data = fields.get("data")
    try:
        packed = _pack(data)
    except Exception:  # whatever unpackb accepts packs again; this guards the packer's own limits
        raise nolag_error("invalid_message", "'data' cannot be re-encoded", topic, msg_ref) from None
    return Publish(topic, data, qos, echo, filter_value, msg_ref, packed)


def _set_filters(fields: dict, limits: Limits) -> SetFilters:
    topic = _topic(fields, limits, None)
    if "filters" not in fields:
        raise nolag_error("invalid_filter", "'filters' must be an array of strings", topic)
    try:
        return SetFilters(topic, _filters(fields["filters"], limits))
    except NolagError as error:
        error.topic = topic
        raise


def _presence(fields: dict, limits: Limits) -> Presence:
    return Presence(_id(fields, "roomId", limits, required=False), fields.get("data"))


def _get_presence(fields: dict, limits: Limits) -> GetPresence:
    return GetPresence(_id(fields, "roomId", limits, required=False))


def _ack(fields: dict, limits: Limits) -> Ack:
    return Ack(_id(fields, "msgId", limits, required=True))


_BATCH_ACK_HEAD = b"\x82" + msgpack.packb("type") + msgpack.packb("batchAck") + msgpack.packb("msgIds")


def batch_ack_packed(data: bytes, limits: Limits = DEFAULT_LIMITS) -> tuple[int, int] | None:
    """A ``batchAck`` written as ``{"type": "batchAck", "msgIds": [...]}``, these two keys in this
    order: ``(how many ids, where the first one starts in data)``, the ids not read (the caller
    compares their bytes with ids it wrote: ``QosWindow.acked_packed``). None for any other frame,
    an empty array, or more ids than ``limits.max_batch_ack`` (:func:`decode` reads those)."""
    if not data.startswith(_BATCH_ACK_HEAD):
        return None
    head = len(_BATCH_ACK_HEAD)
    if len(data) <= head:
        return None
    marker = data[head]
    if 0x91 <= marker <= 0x9F:  # fixarray of 1 to 15
        count, start = marker & 0x0F, head + 1
    elif marker == 0xDC and len(data) >= head + 3:  # array 16
        count, start = int.from_bytes(data[head + 1:head + 3], "big"), head + 3
    elif marker == 0xDD and len(data) >= head + 5:  # array 32
        count, start = int.from_bytes(data[head + 1:head + 5], "big"), head + 5
    else:
        return None
    if not 0 < count <= limits.max_batch_ack:
        return None
    return count, start


def _batch_ack(fields: dict, limits: Limits) -> BatchAck:
    ids = fields.get("msgIds")
    if not isinstance(ids, list):
        raise nolag_error("invalid_message", "'msgIds' must be an array of strings")
    if len(ids) > limits.max_batch_ack:
        raise nolag_error("invalid_message", f"{len(ids)} msgIds; at most {limits.max_batch_ack} per batchAck")
    # The common case checked at C speed, two passes (joining them takes only strs; then the set of
    # their lengths); the loop finds the first one that is not a str of 1 to max_id_length characters,
    # for the error.
    fine = True
    if ids:
        try:
            "".join(ids)
            lengths = set(map(len, ids))
            fine = min(lengths) > 0 and max(lengths) <= limits.max_id_length
        except TypeError:
            fine = False
    if not fine:
        for position, value in enumerate(ids):
            if not isinstance(value, str) or not value or len(value) > limits.max_id_length:
                raise nolag_error("invalid_message",
                                  f"msgIds[{position}] must be a string of 1 to {limits.max_id_length} characters")
    return BatchAck(tuple(ids))


def _lobby_subscribe(fields: dict, limits: Limits) -> LobbySubscribe:
    return LobbySubscribe(_id(fields, "lobbyId", limits, required=True))


def _lobby_unsubscribe(fields: dict, limits: Limits) -> LobbyUnsubscribe:
    return LobbyUnsubscribe(_id(fields, "lobbyId", limits, required=True))


def _get_lobby_presence(fields: dict, limits: Limits) -> GetLobbyPresence:
    return GetLobbyPresence(_id(fields, "lobbyId", limits, required=True))


_DECODERS = {  # publish is decoded apart (it also packs its data)
    "auth": _auth,
    "subscribe": _subscribe,
    "unsubscribe": _unsubscribe,
    "setFilters": _set_filters,
    "presence": _presence,
    "getPresence": _get_presence,
    "ack": _ack,
    "batchAck": _batch_ack,
    "lobbySubscribe": _lobby_subscribe,
    "lobbyUnsubscribe": _lobby_unsubscribe,
    "getLobbyPresence": _get_lobby_presence,
}
_KEEPS_NOTHING_NESTED = frozenset({"publish", "ack", "batchAck"})
REQUEST_TYPES = ("auth", "subscribe", "unsubscribe", "publish", "setFilters", "presence", "getPresence", "ack",
                 "batchAck", "lobbySubscribe", "lobbyUnsubscribe", "getLobbyPresence")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _bool(fields: dict, key: str, default: bool) -> bool:
    value = fields.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise nolag_error("invalid_message", f"'{key}' must be a boolean")
    return value


def _qos(fields: dict) -> int:
    qos = fields.get("qos", 1)
    if qos is None:
        return 1
    if not _is_int(qos) or qos not in (0, 1, 2):
        raise nolag_error("invalid_message", "'qos' must be 0, 1 or 2")
    return qos


def _id(fields: dict, key: str, limits: Limits, required: bool) -> str | None:
    value = fields.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value or len(value) > limits.max_id_length:
        raise nolag_error("invalid_message", f"'{key}' must be a string of 1 to {limits.max_id_length} characters")
    return value


def _topic(fields: dict, limits: Limits, msg_ref: Any) -> str:
    topic = fields.get("topic")
    if not isinstance(topic, str):
        raise nolag_error("invalid_topic", "'topic' must be a string 'app/room/topic'", None, msg_ref)
    check_topic(topic, limits.max_topic_length, msg_ref)
    return topic


_SLUG_TOPICS: dict[str, None] = {}  # topics seen to match _TOPIC (a publisher names one again and again)
SLUG_TOPICS_MAX = 4096  # then it starts again empty: many topics cost a regex each, as without it


def check_topic(topic: str, max_length: int = 256, msg_ref: Any = None) -> None:
    """Raise ``invalid_topic`` unless ``topic`` is ``app/room/topic`` (three slugs of A-Z a-z 0-9 _ . -)."""
    if len(topic) > max_length:
        raise nolag_error("invalid_topic", f"'topic' is {len(topic)} characters; at most {max_length}",
                          topic, msg_ref)
    if topic in _SLUG_TOPICS:
        return
    if _TOPIC.fullmatch(topic) is None:
        raise nolag_error("invalid_topic", "'topic' must be 'app/room/topic': three non-empty segments of "
                          "A-Z a-z 0-9 _ . -", topic, msg_ref)
    if len(_SLUG_TOPICS) >= SLUG_TOPICS_MAX:
        _SLUG_TOPICS.clear()
    _SLUG_TOPICS[topic] = None


def _filters(value: Any, limits: Limits) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise nolag_error("invalid_filter", "'filters' must be an array of strings")
    seen: dict[str, None] = {}
    for position, item in enumerate(value):
        if isinstance(item, list):
            raise nolag_error("invalid_filter", f"filters[{position}]: AND filter groups are not supported; "
                              "use strings")
        seen[_filter(item, f"filters[{position}]", limits)] = None
    if len(seen) > limits.max_filters:
        raise nolag_error("too_many_filters", f"{len(seen)} filters; at most {limits.max_filters} per topic")
    return tuple(seen)


def _filter(value: Any, name: str, limits: Limits) -> str:
    if not isinstance(value, str) or not value:
        raise nolag_error("invalid_filter", f"{name} must be a non-empty string")
    if len(value) > limits.max_filter_length:
        raise nolag_error("invalid_filter", f"{name} is longer than {limits.max_filter_length} characters")
    if not _FILTER_FORBIDDEN.isdisjoint(value):
        raise nolag_error("invalid_filter_chars", f"{name} contains '/', '#' or '+'")
    return value


# -- frames to the client -----------------------------------------------------------------------

# One Packer (use_bin_type=True is msgpack's default since 1.0): ``packb`` makes a new one at each
# call (160 against 46 ns a short string). It is not reentrant: the codec's callers run on the
# gateway's event-loop thread, and what it packs is decoded MessagePack (plain dicts and lists: no
# Python code runs inside a pack); a failed pack leaves it empty.
_pack = msgpack.Packer().pack
_MESSAGE_HEAD = _pack("type") + _pack("message") + _pack("topic")
_K_DATA = _pack("data")
_K_MSG_ID = _pack("msgId")
_REQUIRES_ACK = _pack("requiresAck") + _pack(True)
_IS_REPLAY = _pack("isReplay") + _pack(True)
_K_FILTER = _pack("filter")
_K_FROM = _pack("from")
_K_TIMESTAMP = _pack("timestamp")


def message(topic: str, data: Any, msg_id: str | None = None, requires_ack: bool = False, is_replay: bool = False,
            filter: str | None = None, sender: str | None = None, timestamp: int | float | None = None) -> bytes:
    return message_packed(topic, _pack(data), msg_id, requires_ack, is_replay, filter, sender, timestamp)


def packed_ids(ids: Iterable[str]) -> tuple[bytes, int]:
    """``ids`` as MessagePack strings back to back (as a ``batchAck``'s array carries them, the
    way this codec packs them) and the size of each one; 0 if they are not all one size."""
    return joined_ids([_pack(msg_id) for msg_id in ids])


def joined_ids(pieces: list[bytes]) -> tuple[bytes, int]:
    """Ids packed one by one, back to back, and the size of each one; 0 if they are not all one size."""
    width = len(pieces[0]) if pieces else 0
    if any(len(piece) != width for piece in pieces):
        width = 0
    return b"".join(pieces), width


def message_packed(topic: str, data_packed: bytes, msg_id: str | None = None, requires_ack: bool = False,
                   is_replay: bool = False, filter: str | None = None, sender: str | None = None,
                   timestamp: int | float | None = None) -> bytes:
    """A ``message`` frame around already packed ``data``: built once per fan-out, not per recipient.

    A MessagePack map is a header and its keys and values back to back, so the payload bytes are
    spliced in, never decoded. ``sender`` / ``timestamp`` are the ``from`` / ``timestamp`` the SDK
    exposes in ``MessageMeta``.
    """
    parts = [_MESSAGE_HEAD, _pack(topic), _K_DATA, data_packed]
    count = 3
    if msg_id is not None:
        parts += (_K_MSG_ID, _pack(msg_id))
        count += 1
    if requires_ack:
        parts.append(_REQUIRES_ACK)
        count += 1
    if is_replay:
        parts.append(_IS_REPLAY)
        count += 1
    if filter is not None:
        parts += (_K_FILTER, _pack(filter))
        count += 1
    if sender is not None:
        parts += (_K_FROM, _pack(sender))
        count += 1
    if timestamp is not None:
        parts += (_K_TIMESTAMP, _pack(timestamp))
        count += 1
    parts[0] = bytes((0x80 | count,)) + _MESSAGE_HEAD  # fixmap: at most 9 entries
    return b"".join(parts)


def message_run(topic: str, rows: Iterable[tuple[bytes, str | None, str | None, int | float | None]],
                requires_ack: bool) -> tuple[list[bytes], list[bytes]]:
    """The ``message`` frames of messages of one ``topic``, rows of ``(data_packed, msg_id, filter,
    timestamp)``: each frame the bytes :func:`message_packed` makes of its row (``requires_ack``
    for all, not a replay, no sender), with what every frame shares (its map's header, ``type`` and
    ``topic``) packed once a count of entries; and the rows' ids packed, in order, as a ``batchAck``
    carries them (a row without an id adds none)."""
    topic_part = _MESSAGE_HEAD + _pack(topic) + _K_DATA
    heads: dict[int, bytes] = {}
    ack = _REQUIRES_ACK if requires_ack else b""
    base = 4 if requires_ack else 3
    frames: list[bytes] = []
    ids: list[bytes] = []
    for data, msg_id, filter_, timestamp in rows:
        count = base
        if msg_id is None:
            id_part = b""
        else:
            packed_id = _pack(msg_id)
            ids.append(packed_id)
            id_part = _K_MSG_ID + packed_id
            count += 1
        if filter_ is None:
            filter_part = b""
        else:
            filter_part = _K_FILTER + _pack(filter_)
            count += 1
        if timestamp is None:
            stamp = b""
        else:
            stamp = _K_TIMESTAMP + _pack(timestamp)
            count += 1
        head = heads.get(count)
        if head is None:
            head = heads[count] = bytes((0x80 | count,)) + topic_part
        frames.append(b"".join((head, data, id_part, ack, filter_part, stamp)))
    return frames, ids


def auth_ok(actor_token_id: str, project_id: str | None, protocol_version: int,
            restored_subscriptions: Sequence[Any] = (), actor_type: str | None = None) -> bytes:
    """``protocol_version`` is the negotiated one: ``min(client's, 2)``."""
    frame: dict[str, Any] = {"type": "auth", "success": True, "actorTokenId": actor_token_id,
                             "projectId": project_id, "protocolVersion": protocol_version,
                             "restoredSubscriptions": list(restored_subscriptions)}
    if actor_type is not None:
        frame["actorType"] = _actor_type(actor_type)
    return _pack(frame)


def auth_failed(error: str) -> bytes:
    return _pack({"type": "auth", "success": False, "error": error})


def subscribed(topic: str, load_balance: bool = False) -> bytes:
    return _pack({"type": "subscribed", "topic": topic, "loadBalance": load_balance})


def unsubscribed(topic: str) -> bytes:
    return _pack({"type": "unsubscribed", "topic": topic})


def filters_updated(topic: str, filters: Iterable[str]) -> bytes:
    return _pack({"type": "filtersUpdated", "topic": topic, "filters": list(filters)})


def published(topic: str, msg_ref: Any) -> bytes:
    return _pack({"type": "published", "topic": topic, "msgRef": msg_ref})


def published_head(topic: str) -> bytes:
    """What every ``published`` answer of ``topic`` starts with (:func:`published_frame`)."""
    return b"\x83\xa4type\xa9published\xa5topic" + _pack(topic) + b"\xa6msgRef"


def published_frame(head: bytes, msg_ref: Any) -> bytes:
    """:func:`published` of the topic ``head`` was made for: the same bytes (a map packs its
    entries in order), the topic packed once."""
    return head + _pack(msg_ref)


def presence_event(event: str, actor_token_id: str, presence: Any, joined_at: int, room_id: str | None = None,
                   actor_type: str | None = None) -> bytes:
    """``join`` / ``update`` / ``leave``. ``data`` carries the spec's camelCase fields and the
    snake_case ones the SDK reads (``actor_token_id``, ``joined_at``, ``actor_type``)."""
    data: dict[str, Any] = {"actorTokenId": actor_token_id, "actor_token_id": actor_token_id, "presence": presence,
                            "joinedAt": joined_at, "joined_at": joined_at}
    if actor_type is not None:
        data["actor_type"] = _actor_type(actor_type)
    frame: dict[str, Any] = {"type": "presence", "event": event, "data": data}
    if room_id is not None:
        frame["roomId"] = room_id
    return _pack(frame)


def presence_list(room_id: str | None, entries: Sequence[Mapping[str, Any]]) -> bytes:
    """``entries``: ``[{actorTokenId, presence, joinedAt}]`` (``Presence.list``)."""
    frame: dict[str, Any] = {"type": "presenceList", "data": list(entries)}
    if room_id is not None:
        frame["roomId"] = room_id
    return _pack(frame)


def lobby_subscribed(lobby_id: str, presence: Mapping[str, Mapping[str, Any]]) -> bytes:
    return _pack({"type": "lobbySubscribed", "lobbyId": lobby_id, "presence": presence})


def lobby_presence_list(lobby_id: str, presence: Mapping[str, Mapping[str, Any]]) -> bytes:
    return _pack({"type": "lobbyPresenceList", "lobbyId": lobby_id, "presence": presence})


def lobby_presence(event: str, lobby_id: str, room_id: str, actor_id: str, data: Any) -> bytes:
    return _pack({"type": "lobbyPresence", "event": event, "lobbyId": lobby_id, "roomId": room_id,
                  "actorId": actor_id, "data": data})


def lobby_unsubscribed(lobby_id: str) -> bytes:
    return _pack({"type": "lobbyUnsubscribed", "lobbyId": lobby_id})


def replay_start(count: int, oldest: Any = None, newest: Any = None) -> bytes:
    frame: dict[str, Any] = {"type": "replayStart", "count": count}
    if oldest is not None:
        frame["oldestTimestamp"] = oldest
    if newest is not None:
        frame["newestTimestamp"] = newest
    return _pack(frame)


def replay_end(replayed: int) -> bytes:
    return _pack({"type": "replayEnd", "replayed": replayed})


def hydration(topic: str, data: Any) -> bytes:
    return _pack({"type": "hydration", "topic": topic, "data": data})


def error(error: str, code: int | None = None, topic: str | None = None, msg_ref: Any = None,
          **extra: Any) -> bytes:
    """``extra``: e.g. ``maxSizeBytes`` with ``message_too_large``, ``hint`` (shown by the SDK)."""
    frame: dict[str, Any] = {"type": "error", "error": error}
    if code is not None:
        frame["code"] = code
    if topic is not None:
        frame["topic"] = topic
    if msg_ref is not None:
        frame["msgRef"] = msg_ref
    frame.update(extra)
    return _pack(frame)


def error_frame(failure: NolagError, **extra: Any) -> bytes:
    """The frame for a :class:`NolagError`; its message travels as ``hint``."""
    return error(failure.error, failure.code, failure.topic, failure.msg_ref, hint=failure.message, **extra)


def disconnect(reason: str) -> bytes:
    return _pack({"type": "disconnect", "reason": reason})


def _actor_type(value: str) -> str:
    if value not in ACTOR_TYPES:
        raise ValueError(f"actor type {value!r} is not one the SDK accepts: {sorted(ACTOR_TYPES)}")
    return value
