"""Cashu NUT-17 JSON-RPC 2.0 frames and the mint's state pushes: bytes in, values or errors out.

Pure: no sockets, no actors. Every request that is not valid gets an :class:`RpcError` with the
most specific JSON-RPC 2.0 code and a message saying what to fix (the reference mints answer some
bad requests with silence; a router should not).

Choices where the spec leaves room (also in ``docs/cashu.md``):
- ``id`` may be an integer (as the spec says) or a string (as JSON-RPC 2.0 allows); it is echoed
  as given. When it cannot be read, errors carry ``"id": null`` as JSON-RPC 2.0 prescribes.
- ``params`` is an object; a string holding a JSON object is accepted too (the spec calls it
  "serialized JSON").
- Filters repeated within one subscription count once. A proof ``Y`` must be 33-byte compressed
  point hex (66 hex digits); it is echoed as given and matched case-insensitively.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from router.nesting import MAX_NESTING, json_may_nest_deeper, too_deep

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
LIMIT_EXCEEDED = -32005  # server-defined range: rate limit

PROOF_STATE = "proof_state"
QUOTE_STATES = {
    "bolt11_mint_quote": frozenset({"UNPAID", "PAID", "ISSUED"}),
    "bolt12_mint_quote": frozenset({"UNPAID", "PAID", "ISSUED"}),
    "bolt11_melt_quote": frozenset({"UNPAID", "PENDING", "PAID"}),
    "bolt12_melt_quote": frozenset({"UNPAID", "PENDING", "PAID"}),
}
PROOF_STATES = frozenset({"UNSPENT", "PENDING", "SPENT"})
_HEX = frozenset("0123456789abcdefABCDEF")


class RpcError(Exception):
    def __init__(self, code: int, message: str, request_id: Any = None) -> None:
        super().__init__(code, message)
        self.code = code
        self.message = message
        self.request_id = request_id


@dataclass(frozen=True, slots=True)
class Limits:
    kinds: frozenset[str]
    max_filters: int = 1000
    max_filter_length: int = 256
    max_sub_id_length: int = 256


@dataclass(frozen=True, slots=True)
class Subscribe:
    id: Any
    kind: str
    sub_id: str
    filters: tuple[str, ...]  # in request order, each once


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    id: Any
    sub_id: str


@dataclass(frozen=True, slots=True)
class Heartbeat:
    id: Any


Request = Subscribe | Unsubscribe | Heartbeat


def decode(data: bytes, limits: Limits) -> Request:
    try:
        message = orjson.loads(data)
    except orjson.JSONDecodeError as error:
        raise RpcError(PARSE_ERROR, f"Parse error: {error}") from None
    if isinstance(message, list):
        raise RpcError(INVALID_REQUEST, "Invalid Request: batch requests are not supported")
    if not isinstance(message, dict):
        raise RpcError(INVALID_REQUEST, "Invalid Request: expected a JSON object")
    if json_may_nest_deeper(data) and too_deep(message):
        raise RpcError(INVALID_REQUEST, f"Invalid Request: nested deeper than {MAX_NESTING} levels")
    request_id = message.get("id")
    if not _is_id(request_id):
        raise RpcError(INVALID_REQUEST, "Invalid Request: 'id' must be an integer or a string")
    if message.get("jsonrpc") != "2.0":
        raise RpcError(INVALID_REQUEST, "Invalid Request: 'jsonrpc' must be \"2.0\"", request_id)
    method = message.get("method")
    if not isinstance(method, str):
        raise RpcError(INVALID_REQUEST, "Invalid Request: 'method' must be a string", request_id)
    if method == "heartbeat":
        return Heartbeat(request_id)
    if method not in ("subscribe", "unsubscribe"):
        raise RpcError(METHOD_NOT_FOUND, f"Method not found: {method}", request_id)
    params = _params(message.get("params"), request_id)
    sub_id = params.get("subId")
    if not isinstance(sub_id, str) or not sub_id:
        raise RpcError(INVALID_PARAMS, "Invalid params: 'subId' must be a non-empty string", request_id)
    if len(sub_id) > limits.max_sub_id_length:
        raise RpcError(INVALID_PARAMS, f"Invalid params: 'subId' is longer than {limits.max_sub_id_length} characters",
                       request_id)
    if method == "unsubscribe":
        return Unsubscribe(request_id, sub_id)
    kind = params.get("kind")
    if not isinstance(kind, str):
        raise RpcError(INVALID_PARAMS, "Invalid params: 'kind' must be a string", request_id)
    if kind not in limits.kinds:
        raise RpcError(INVALID_PARAMS, f"Invalid params: unsupported kind '{kind}'; supported: "
                       + ", ".join(sorted(limits.kinds)), request_id)
    return Subscribe(request_id, kind, sub_id, _filters(params.get("filters"), kind, limits, request_id))


def _is_id(value: Any) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool)) or isinstance(value, str)


def _params(params: Any, request_id: Any) -> dict[str, Any]:
    if isinstance(params, str):
        try:
            params = orjson.loads(params)
        except orjson.JSONDecodeError:
            raise RpcError(INVALID_PARAMS, "Invalid params: 'params' is a string but not JSON", request_id) from None
    if not isinstance(params, dict):
        raise RpcError(INVALID_PARAMS, "Invalid params: 'params' must be an object", request_id)
    return params


def _filters(filters: Any, kind: str, limits: Limits, request_id: Any) -> tuple[str, ...]:
    if not isinstance(filters, list) or not filters:
        raise RpcError(INVALID_PARAMS, "Invalid params: 'filters' must be a non-empty array of strings", request_id)
    if len(filters) > limits.max_filters:
        raise RpcError(INVALID_PARAMS, f"Invalid params: {len(filters)} filters; at most {limits.max_filters} "
                       "per subscription", request_id)
    seen: dict[str, None] = {}
    for position, value in enumerate(filters):
        if not isinstance(value, str) or not value:
            raise RpcError(INVALID_PARAMS, f"Invalid params: filters[{position}] must be a non-empty string",
                           request_id)
        if len(value) > limits.max_filter_length:
            raise RpcError(INVALID_PARAMS, f"Invalid params: filters[{position}] is longer than "
                           f"{limits.max_filter_length} characters", request_id)
        if kind == PROOF_STATE and not is_point_hex(value):
            raise RpcError(INVALID_PARAMS, f"Invalid params: filters[{position}] is not a proof Y "
                           "(33-byte compressed point, 66 hex digits)", request_id)
        seen[value] = None
    return tuple(seen)


def is_point_hex(value: str) -> bool:
    return len(value) == 66 and value[:2] in ("02", "03") and all(c in _HEX for c in value)


def object_key(kind: str, object_id: str) -> str:
    """The core topic of one object: ``cashu/<kind>/<id>`` (proof Ys in lower case)."""
    return f"cashu/{kind}/{object_id.lower() if kind == PROOF_STATE else object_id}"


# -- frames to the wallet -------------------------------------------------------------------

def encode_ok(request_id: Any, sub_id: str) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "result": {"status": "OK", "subId": sub_id}, "id": request_id})


def encode_error(request_id: Any, code: int, message: str) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "error": {"code": code, "message": message}, "id": request_id})


def encode_heartbeat(request_id: Any) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "result": "heartbeat", "id": request_id})


def notification_prefix(sub_id: str) -> bytes:
    """Everything of a notification before its payload; it carries no ``id`` (clients rely on that)."""
    return b'{"jsonrpc":"2.0","method":"subscribe","params":{"subId":' + orjson.dumps(sub_id) + b',"payload":'


def encode_notification(prefix: bytes, payload: bytes) -> bytes:
    return prefix + payload + b"}}"


def unspent_proof(y: str) -> bytes:
    return orjson.dumps({"Y": y, "state": "UNSPENT", "witness": None})


# -- the mint's state feed --------------------------------------------------------------------

class StateError(Exception):
    """A pushed state is not acceptable; the message names the item and the field."""


@dataclass(frozen=True, slots=True)
class State:
    kind: str
    object_id: str
    payload: bytes  # compact JSON, sent to wallets as is

    @property
    def key(self) -> str:
        return object_key(self.kind, self.object_id)


def decode_states(body: bytes, kinds: frozenset[str], max_states: int, max_id_length: int = 256) -> list[State]:
    """``{"kind", "payload"}`` or ``{"states": [{"kind", "payload"}, …]}`` → states in order."""
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise StateError(f"body is not JSON: {error}") from None
    if isinstance(document, dict) and "states" in document:
        items = document["states"]
        if not isinstance(items, list) or not items:
            raise StateError("'states' must be a non-empty array")
        prefix = "states[{}]: "
    elif isinstance(document, dict):
        items, prefix = [document], ""
    else:
        raise StateError('expected {"kind", "payload"} or {"states": [...]}')
    if len(items) > max_states:
        raise StateError(f"{len(items)} states in one push; at most {max_states}")
    return [_state(item, kinds, max_id_length, prefix.format(index)) for index, item in enumerate(items)]


def _state(item: Any, kinds: frozenset[str], max_id_length: int, where: str) -> State:
    if not isinstance(item, dict):
        raise StateError(f'{where}expected an object {{"kind", "payload"}}')
    kind, payload = item.get("kind"), item.get("payload")
    if kind not in kinds:
        raise StateError(f"{where}unsupported kind {kind!r}; supported: " + ", ".join(sorted(kinds)))
    if not isinstance(payload, dict):
        raise StateError(f"{where}'payload' must be an object")
    id_field = "Y" if kind == PROOF_STATE else "quote"
    object_id = payload.get(id_field)
    if not isinstance(object_id, str) or not object_id or len(object_id) > max_id_length:
        raise StateError(f"{where}payload.{id_field} must be a string of 1 to {max_id_length} characters")
    state = payload.get("state")
    if kind == PROOF_STATE:
        if not is_point_hex(object_id):
            raise StateError(f"{where}payload.Y is not a 33-byte compressed point in hex")
        if state not in PROOF_STATES:
            raise StateError(f"{where}payload.state must be one of {sorted(PROOF_STATES)}")
    elif state is not None and state not in QUOTE_STATES[kind]:
        raise StateError(f"{where}payload.state must be one of {sorted(QUOTE_STATES[kind])} for {kind}")
    return State(kind, object_id, orjson.dumps(payload))
