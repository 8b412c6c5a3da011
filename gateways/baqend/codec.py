"""Baqend real-time query frames and REST bodies: bytes in, values or errors out.

Pure: no sockets, no actors. Frames are JSON objects with ``id`` and ``type``
(baqend-realtime-queries.md); every refusal is an :class:`ProtocolError` carrying the ``error``
object of the error message (``{message, status, reason}``), sent also with ``status`` at the top
level because the SDK reads it there (baqend-notes.md).
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import orjson

from actors.baqend.documents import check_nesting, iso_now
from actors.baqend.livequeries import QuerySpec
from actors.baqend.rtquery import BAD_REQUEST, RealtimeQuery, SubscriptionError
from router.errors import CommandError
from router.nesting import MAX_NESTING, json_may_nest_deeper, too_deep
from router.ratelimit import TokenBucket

MAX_ID_LENGTH = 256
BUCKET = re.compile(r"[A-Za-z][A-Za-z0-9_.]{0,127}")
TOO_MANY = "Too Many Requests"
PAYLOAD_TOO_LARGE = "Payload Too Large"
UNAUTHORIZED = "Unauthorized"


class ProtocolError(Exception):
    """A message is refused; ``sub_id`` is None when the message's id could not be read."""

    def __init__(self, message: str, status: int = 400, reason: str = BAD_REQUEST, sub_id: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.reason = reason
        self.sub_id = sub_id

    @property
    def error(self) -> dict[str, Any]:
        return {"message": self.message, "status": self.status, "reason": self.reason}


@dataclass(frozen=True, slots=True)
class Subscribe:
    sub_id: str
    spec: QuerySpec
    token: str | None


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    sub_id: str


def decode(data: bytes) -> Subscribe | Unsubscribe:
    """One client frame; the query is validated (compiled) here, before any shard sees it."""
    try:
        message = orjson.loads(data)
    except orjson.JSONDecodeError as error:
        raise ProtocolError(f"Invalid message: not JSON ({error.msg})") from None
    if not isinstance(message, dict):
        raise ProtocolError("Invalid message: a message is a JSON object with id and type")
    sub_id = message.get("id")
    if not isinstance(sub_id, str) or not sub_id or len(sub_id) > MAX_ID_LENGTH:
        raise ProtocolError(f"Invalid message: id must be a non-empty string of at most {MAX_ID_LENGTH} characters")
    if json_may_nest_deeper(data) and too_deep(message) or any(_too_deep_json(message.get(field)) for field in ("query", "sort")):
        # Before the query is compiled (recursively) or anything is pickled to a shard.
        raise ProtocolError(f"Invalid message: a message may nest at most {MAX_NESTING} levels", sub_id=sub_id)
    kind = message.get("type")
    if kind == "unsubscribe":
        return Unsubscribe(sub_id)
    if kind != "subscribe":
        raise ProtocolError(f"Invalid message type {kind!r}: use subscribe or unsubscribe", sub_id=sub_id)
    bucket = message.get("bucket")
    if not isinstance(bucket, str) or not BUCKET.fullmatch(bucket):
        raise ProtocolError("bucket must be the name of a bucket (letters, digits, '_' and '.')", sub_id=sub_id)
    initial = message.get("initial", False)
    if initial is None:
        initial = False
    if not isinstance(initial, bool):
        raise ProtocolError("initial must be true or false", sub_id=sub_id)
    token = message.get("token")
    if token is not None and not isinstance(token, str):
        raise ProtocolError("token must be a string or null", sub_id=sub_id)
    spec = QuerySpec(bucket, message.get("query"), message.get("sort"), message.get("offset", 0),
                     message.get("limit"), message.get("matchTypes"), message.get("operations"), initial)
    try:
        query = spec.build()
    except SubscriptionError as error:
        raise ProtocolError(error.message, error.status, error.reason, sub_id) from None
    # The shard gets decoded values, and limits as the query normalised them.
    spec = QuerySpec(bucket, _decoded(spec.query), _decoded(spec.sort), query.offset, query.limit,
                     spec.match_types, spec.operations, initial)
    return Subscribe(sub_id, spec, token or None)


def _too_deep_json(value: Any) -> bool:
    """A query or sort the SDK sends as a JSON string, nested too deep (level 2 of the message)."""
    if not isinstance(value, str) or not value.strip():
        return False
    try:
        return too_deep(orjson.loads(value), MAX_NESTING - 1)
    except orjson.JSONDecodeError:
        return False  # building the query names the error


def _decoded(value: Any) -> Any:
    if isinstance(value, (str, bytes)):
        return orjson.loads(value) if value.strip() else None
    return value


# -- server frames -----------------------------------------------------------------------------------


def date_now(now_ns: int | None = None) -> str:
    """The ``date`` of a server frame, ISO 8601 in UTC to the millisecond (every event carries one:
    :func:`iso_now` formats the second's text once a second, not once an event)."""
    return iso_now((time.time_ns() if now_ns is None else now_ns) // 1_000_000)


def encode_result(sub_id: str, documents: list, date: str) -> bytes:
    return orjson.dumps({"id": sub_id, "type": "result", "date": date, "data": documents})


def encode_match(sub_id: str, fields: dict[str, Any], date: str) -> bytes:
    return match_prefix(sub_id) + match_body(fields, date)


def match_prefix(sub_id: str) -> bytes:
    """A subscription's ``match`` frames up to their ``type``: ``{"id":"<sub_id>",``."""
    return b'{"id":' + orjson.dumps(sub_id) + b","


def match_body(fields: dict[str, Any], date: str) -> bytes:
    """A ``match`` frame after its :func:`match_prefix`: the same bytes for every subscription
    sent the same event (equal queries share their events), so encoded once for all of them."""
    return orjson.dumps({"type": "match", "date": date, **fields})[1:]


def encode_error(sub_id: str | None, error: ProtocolError, date: str) -> bytes:
    frame: dict[str, Any] = {}
    if sub_id is not None:
        frame["id"] = sub_id
    frame.update(type="error", date=date, error=error.error, status=error.status)
    return orjson.dumps(frame)


def too_many(limit: int, sub_id: str) -> ProtocolError:
    return ProtocolError(f"Too many active subscriptions (only {limit} allowed)!", 429, TOO_MANY, sub_id)


def too_many_for_client(limit: int, sub_id: str) -> ProtocolError:
    return ProtocolError(f"Too many active subscriptions for this client (only {limit} allowed)!", 429, TOO_MANY,
                         sub_id)


def subscribing_too_fast(per_minute: float, wait_s: float, sub_id: str) -> ProtocolError:
    return ProtocolError(f"Too many subscribe requests: at most {per_minute:g} a minute; try again in "
                         f"{TokenBucket.retry_after_ms(wait_s)} ms", 429, TOO_MANY, sub_id)


def query_too_large(sub_id: str, documents: int | None = None, nbytes: int | None = None) -> ProtocolError:
    """A query matching more documents (or bytes of them) than it may hold: refused while it loads."""
    if documents is not None:
        what = f"The query matches more than {documents} documents (the limit)"
    else:
        what = f"The query's documents exceed {nbytes} bytes (the limit)"
    return ProtocolError(f"{what}: narrow the query", 413, PAYLOAD_TOO_LARGE, sub_id)


def token_expired(sub_id: str | None = None) -> ProtocolError:
    return ProtocolError("Invalid token: expired", 401, UNAUTHORIZED, sub_id)


# -- REST -------------------------------------------------------------------------------------------

REASONS = {400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found", 409: "Conflict",
           405: "Method Not Allowed", 412: "Precondition Failed", 413: "Payload Too Large", 415: "Unsupported Media Type",
           429: "Too Many Requests", 500: "Internal Server Error", 503: "Service Unavailable"}
CLASS_NAMES = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "ObjectNotFound",
               409: "ObjectExists", 412: "ObjectOutOfDate", 413: "PayloadTooLarge", 429: "TooManyRequests",
               500: "InternalError", 503: "Unavailable"}


def error_body(status: int, message: str) -> bytes:
    return orjson.dumps({"message": message, "reason": REASONS.get(status, "Error"),
                         "className": "baqend.error." + CLASS_NAMES.get(status, "Error"), "status": status})


class RestError(Exception):
    def __init__(self, status: int, message: str, headers: list[tuple[str, str]] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or []


def rest_too_fast(per_minute: float, wait_s: float) -> RestError:
    """429, with the whole seconds until a request would be taken again in ``Retry-After``."""
    retry_after = max(1, math.ceil(wait_s))
    return RestError(429, f"Too many requests: at most {per_minute:g} a minute; try again later",
                     [("Retry-After", str(retry_after))])


def parse_object_path(rest: str, max_key_length: int) -> tuple[str, str | None]:
    """``Bucket`` or ``Bucket/key`` (the part after ``/db/``) into (bucket, key or None)."""
    bucket, _, key = rest.partition("/")
    if not BUCKET.fullmatch(bucket):
        raise RestError(400, f"invalid bucket name {bucket!r}")
    if not _:
        return bucket, None
    key = unquote(key)
    check_key(key, max_key_length)
    return bucket, key


def check_key(key: str, max_key_length: int) -> None:
    if not key or "/" in key or len(key) > max_key_length:
        raise RestError(400, f"an object key is 1 to {max_key_length} characters without '/'")


def if_match(header: str | None) -> str | None:
    """``If-Match: "3"`` (or W/"3", 3, *) as the version string, ``*``, or None when absent."""
    if header is None:
        return None
    value = header.strip()
    if value.startswith("W/"):
        value = value[2:]
    value = value.strip('"')
    if value != "*" and not value.isdigit():
        raise RestError(400, "If-Match must be an object version such as \"3\", or *")
    return value


def decode_object(body: bytes, max_bytes: int) -> dict[str, Any]:
    if len(body) > max_bytes:
        raise RestError(413, f"the object is {len(body)} bytes; the limit is {max_bytes}")
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise RestError(400, f"the body is not JSON: {error.msg}") from None
    if not isinstance(value, dict):
        raise RestError(400, "the body must be a JSON object")
    try:
        check_nesting(value, "the body")  # before it is pickled to a shard: what the store cannot hold stops here
    except CommandError as error:
        raise RestError(400, error.message) from None
    return value


def key_from_insert(bucket: str, fields: dict[str, Any], max_key_length: int) -> str | None:
    """The key an insert names (``id`` as ``/db/<Bucket>/<key>`` or a bare key), or None to generate one."""
    oid = fields.get("id")
    if oid is None:
        return None
    if not isinstance(oid, str):
        raise RestError(400, "id must be a string such as /db/<Bucket>/<key>")
    prefix = f"/db/{bucket}/"
    if oid.startswith("/db/"):
        if not oid.startswith(prefix):
            raise RestError(400, f"the id {oid} is not in the bucket {bucket}")
        oid = oid[len(prefix):]
    check_key(oid, max_key_length)
    return oid


__all__ = ["ProtocolError", "RealtimeQuery", "RestError", "Subscribe", "Unsubscribe", "decode"]
