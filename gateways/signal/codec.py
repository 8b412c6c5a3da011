"""Signal Hub wire format: JSON ``SharedMessage`` envelopes (signal-hub-protocol.md section 3).

Pure functions: bytes in, a validated :class:`Request` out (or a :class:`SignalError` carrying
the ``hub:error`` to send); replies out as bytes. No sockets, no Ray.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import orjson

from router.nesting import MAX_NESTING, json_may_nest_deeper, too_deep

ADDRESS_RE = re.compile(r"[a-z0-9-]+/[a-z0-9-]+")

# Error codes of the spec's table (section 4).
VERSION_MISMATCH = "version_mismatch"
UNAUTHORIZED = "unauthorized"
RATE_LIMITED = "rate_limited"
UNKNOWN_ACTOR = "unknown_actor"
MESSAGE_TOO_LARGE = "message_too_large"
MESSAGE_EXPIRED = "message_expired"
TIMEOUT = "timeout"
INTERNAL_ERROR = "internal_error"

MESSAGE_TYPES = frozenset(
    {
        "hub:connect", "hub:heartbeat", "hub:disconnect",
        "hub:register", "hub:unregister", "hub:renew",
        "hub:discover", "hub:list_actors",
        "hub:send", "hub:broadcast",
        "hub:subscribe", "hub:publish", "hub:unsubscribe",
        "hub:queue_stats",
    }
)


_MESSAGE_TYPE = {kind: kind for kind in MESSAGE_TYPES}


class SignalError(Exception):
    """A request is refused with ``hub:error`` ``code``; ``reply_id`` correlates it when known."""

    def __init__(
        self,
        code: str,
        message: str,
        details: dict[str, Any] | None = None,
        reply_id: Any = None,
        reply_to: str | None = None,
    ) -> None:
        super().__init__(code, message)
        self.code = code
        self.message = message
        self.details = details
        self.reply_id = reply_id
        self.reply_to = reply_to


def invalid(message: str, reason: str = "invalid_message", **details: Any) -> SignalError:
    """A malformed request. The spec has no code for it; like the reference hub, use internal_error."""
    return SignalError(INTERNAL_ERROR, message, {"reason": reason, **details})


@dataclass(slots=True)
class Request:
    type: str
    sender: str  # `from`, normalised
    to: str | None
    payload: dict[str, Any]
    reply_id: Any  # the request's correlationId, else its id: replies carry it as correlationId
    timestamp: float | None
    ttl: float | None
    raw: bytes = field(repr=False)


# Addresses seen valid, as sent -> canonical: every message names one or two, mostly the same
# few (a regex match is 300 ns, a lookup 70). Bounded: short ones only, emptied when full.
_KNOWN: dict[str, str] = {}
_KNOWN_MAX = 16384
KNOWN_ADDRESS_LENGTH = 128  # the longest address kept (here and by a session's hub:send links)


def normalize_address(value: Any) -> str | None:
    """A canonical address ``runtime/actor-id``; the ``@(runtime/actor-id)`` form is accepted too."""
    if type(value) is not str:
        return _canonical(value) if isinstance(value, str) else None
    address = _KNOWN.get(value)
    if address is None:
        address = _canonical(value)
        if address is not None and len(value) <= KNOWN_ADDRESS_LENGTH:
            if len(_KNOWN) >= _KNOWN_MAX:
                _KNOWN.clear()
            _KNOWN[value] = address
    return address


def _canonical(value: str) -> str | None:
    if value.startswith("@(") and value.endswith(")"):
        value = value[2:-1]
    return value if ADDRESS_RE.fullmatch(value) else None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def decode(data: bytes) -> Request:
    """Parse and validate the envelope; payload fields are checked by the handlers."""
    try:
        message = orjson.loads(data)
    except orjson.JSONDecodeError as error:
        raise invalid(f"Malformed JSON: {error.msg}", "parse_error") from None
    if not isinstance(message, dict):
        raise invalid("A message must be a JSON object")

    reply_id = message.get("correlationId")
    if reply_id is None:
        reply_id = message.get("id")
    if reply_id is not None and not (isinstance(reply_id, str) and len(reply_id) <= 256) and not _is_number(reply_id):
        reply_id = None

    raw_sender = message.get("from")
    sender = normalize_address(raw_sender)
    kind = message.get("type")
    if not isinstance(kind, str):
        raise SignalError(INTERNAL_ERROR, "Message 'type' must be a string", {"reason": "invalid_message"},
                          reply_id, sender)
    known = _MESSAGE_TYPE.get(kind)
    if known is None:
        raise SignalError(INTERNAL_ERROR, f"Unknown message type: {kind[:64]}",
                          {"reason": "unknown_type", "type": kind[:64]}, reply_id, sender)
    kind = known  # one str object per type: its hash is kept, and a batch to a shard pickles it once
    if sender is None:
        raise SignalError(INTERNAL_ERROR, "'from' must be an address matching ^[a-z0-9-]+/[a-z0-9-]+$",
                          {"reason": "invalid_address", "field": "from"}, reply_id)
    raw_to = message.get("to")
    to = None
    if raw_to is not None:
        to = normalize_address(raw_to)
        if to is None:
            raise SignalError(INTERNAL_ERROR, "'to' must be an address matching ^[a-z0-9-]+/[a-z0-9-]+$",
                              {"reason": "invalid_address", "field": "to"}, reply_id, sender)
    payload = message.get("payload")
    if payload is None:
        payload = {}
    elif not isinstance(payload, dict):
        raise SignalError(INTERNAL_ERROR, "'payload' must be a JSON object",
                          {"reason": "invalid_message", "field": "payload"}, reply_id, sender)
    if json_may_nest_deeper(data) and too_deep(message):  # the whole envelope: messages are relayed as they were sent
        raise SignalError(INTERNAL_ERROR, f"A message may nest at most {MAX_NESTING} levels",
                          {"reason": "too_deep"}, reply_id, sender)
    timestamp = message.get("timestamp")
    ttl = message.get("ttl")
    if timestamp is not None and not _is_number(timestamp):
        raise SignalError(INTERNAL_ERROR, "'timestamp' must be epoch milliseconds",
                          {"reason": "invalid_message", "field": "timestamp"}, reply_id, sender)
    if ttl is not None and (not _is_number(ttl) or ttl <= 0):
        raise SignalError(INTERNAL_ERROR, "'ttl' must be a positive number of milliseconds",
                          {"reason": "invalid_message", "field": "ttl"}, reply_id, sender)
    return Request(kind, sender, to, payload, reply_id, timestamp, ttl, data)


def is_expired(request: Request, now_ms: float) -> bool:
    return request.ttl is not None and request.timestamp is not None and request.timestamp + request.ttl < now_ms


def encode(kind: str, sender: str, to: str | None, payload: dict[str, Any], reply_id: Any = None) -> bytes:
    message: dict[str, Any] = {"type": kind, "from": sender, "to": to, "payload": payload}
    if reply_id is not None:
        message["correlationId"] = reply_id
    return orjson.dumps(message)


def delivery_ack_head(sender: str, to: str, topic: str) -> bytes:
    """What every ``hub:delivery_ack`` from ``sender`` to ``to`` about ``topic`` starts with, up to
    its counts: :func:`delivery_ack` completes it."""
    return (b'{"type":"hub:delivery_ack","from":' + orjson.dumps(sender) + b',"to":' + orjson.dumps(to)
            + b',"payload":{"topic":' + orjson.dumps(topic) + b',"subscriberCount":')


def delivery_ack(head: bytes, count: int, reply_id: Any = None) -> bytes:
    """``encode("hub:delivery_ack", sender, to, {"topic": topic, "subscriberCount": count,
    "deliveredCount": count}, reply_id)``, byte for byte, from the ``head`` of :func:`delivery_ack_head`:
    every publish is answered with one, and formatting bytes costs two thirds of building and dumping
    a dict (160 against 244 ns)."""
    if reply_id is None:
        return b'%b%d,"deliveredCount":%d}}' % (head, count, count)
    return b'%b%d,"deliveredCount":%d},"correlationId":%b}' % (head, count, count, orjson.dumps(reply_id))


def encode_error(
    sender: str, to: str | None, code: str, message: str, details: dict[str, Any] | None = None, reply_id: Any = None
) -> bytes:
    payload: dict[str, Any] = {"code": code, "message": message}
    if details:
        payload["details"] = details
    return encode("hub:error", sender, to, payload, reply_id)


def fit(items: list[Any], max_bytes: int) -> list[Any]:
    """The longest prefix of ``items`` whose JSON array encodes to at most ``max_bytes`` (at least
    the first item, so a page always moves on)."""
    size = 1  # "[" and "]", and a comma after every item but the last
    for index, item in enumerate(items):
        size += len(orjson.dumps(item)) + 1
        if size > max_bytes and index:
            return items[:index]
    return items


# -- payload field readers: each raises SignalError(invalid) naming the field -------------------


def address_field(payload: dict[str, Any], name: str, default: str | None = None) -> str:
    value = payload.get(name, default)
    address = normalize_address(value)
    if address is None:
        raise invalid(f"payload.{name} must be an address matching ^[a-z0-9-]+/[a-z0-9-]+$",
                      "invalid_address", field=f"payload.{name}")
    return address


def string_field(payload: dict[str, Any], name: str, max_length: int, required: bool = True) -> str | None:
    value = payload.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value or len(value) > max_length:
        raise invalid(f"payload.{name} must be a non-empty string of at most {max_length} characters",
                      field=f"payload.{name}")
    return value


def int_field(payload: dict[str, Any], name: str, default: int, low: int, high: int) -> int:
    value = payload.get(name)
    if value is None:
        return default
    if not _is_number(value) or value != int(value) or not low <= value <= high:
        raise invalid(f"payload.{name} must be an integer from {low} to {high}", field=f"payload.{name}")
    return int(value)


def clamped_int_field(payload: dict[str, Any], name: str, default: int, low: int, high: int) -> int:
    """An integer of at least ``low``; a larger one than ``high`` is taken as ``high``."""
    value = payload.get(name)
    if value is None:
        return default
    if not _is_number(value) or value != int(value) or value < low:
        raise invalid(f"payload.{name} must be an integer of at least {low}", field=f"payload.{name}")
    return min(int(value), high)


def string_list_field(payload: dict[str, Any], name: str, max_items: int, max_length: int = 128) -> list[str]:
    value = payload.get(name)
    if value is None:
        return []
    if (
        not isinstance(value, list)
        or len(value) > max_items
        or not all(isinstance(item, str) and 0 < len(item) <= max_length for item in value)
    ):
        raise invalid(f"payload.{name} must be a list of at most {max_items} non-empty strings",
                      field=f"payload.{name}")
    return list(dict.fromkeys(value))


def object_field(payload: dict[str, Any], name: str, max_bytes: int | None = None) -> dict[str, Any]:
    value = payload.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise invalid(f"payload.{name} must be a JSON object", field=f"payload.{name}")
    if max_bytes is not None and len(orjson.dumps(value)) > max_bytes:
        raise invalid(f"payload.{name} must encode to at most {max_bytes} bytes", field=f"payload.{name}")
    return value
