"""The node side of the mx-notifier dialect: what a MultiversX node pushes, made into hub events.

Pure functions over bytes (mx-upstream-notes.md): decode the node's transport frame (gogo
protobuf or JSON, detected per frame), decode the SaveBlock / RevertIndexedBlock /
FinalizedBlock payloads into the messages of ``proto/mx_node.proto``, and normalise them into
the hub's messages (``proto/mx_hub.proto``): one ``NormalizedEvent`` per log event, a
``RevertEvent``, a ``FinalizedEvent``, the block's transactions and SCRs. A node retries a
payload it got no ACK for under a new counter, so :class:`DuplicateSuppressor` remembers block
hashes for a while. No sockets, no Ray, no clock: time is an argument.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

from google.protobuf.message import DecodeError, Message

from gateways.mx.bech32 import try_encode_address
from gateways.mx.pb import mx_hub_pb2, mx_node_pb2

# Transport (mx-chain-communication-go): frame types and marshallers.
ACK = 1
PAYLOAD = 2
GOGO = "gogo"
JSON = "json"
AUTO = "auto"

# Node topics. The first three are processed; the others are known and ignored.
SAVE_BLOCK = "SaveBlock"
REVERT_INDEXED_BLOCK = "RevertIndexedBlock"
FINALIZED_BLOCK = "FinalizedBlock"
PROCESSED_TOPICS = frozenset({SAVE_BLOCK, REVERT_INDEXED_BLOCK, FINALIZED_BLOCK})
IGNORED_TOPICS = frozenset(
    {"SaveRoundsInfo", "SaveValidatorsPubKeys", "SaveValidatorsRating", "SaveAccounts", "Settings"}
)

# Why a frame or payload is dropped (metrics labels). A dropped frame is never ACKed.
EMPTY_FRAME = "empty_frame"
UNDECODABLE = "undecodable"
BAD_TYPE = "bad_type"
UNDECODABLE_PAYLOAD = "undecodable_payload"

DEDUP_WINDOW_S = 30 * 60.0  # as the reference notifier
DEDUP_MAX_ENTRIES = 100_000


class InvalidNodeFrame(Exception):
    """A frame or payload to drop without ACK (the connection stays); ``reason`` is for metrics."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason, detail)
        self.reason = reason
        self.detail = detail


# -- the transport frame -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeFrame:
    with_acknowledge: bool
    counter: int
    type: int
    topic: str
    payload: bytes
    version: int
    marshaller: str  # GOGO or JSON: how it came, so the ACK and the payload use the same


def detect_marshaller(data: bytes) -> str:
    """JSON frames are objects; a gogo frame never starts with ``{`` (field 15, group start)."""
    first = data.lstrip(b" \t\r\n")[:1] if data[:1] in (b" ", b"\t", b"\r", b"\n") else data[:1]
    return JSON if first == b"{" else GOGO


def decode_node_frame(data: bytes, marshaller: str = AUTO) -> NodeFrame:
    """Parse one node frame; raises :class:`InvalidNodeFrame` for what the notes say to drop."""
    if not data:
        raise InvalidNodeFrame(EMPTY_FRAME)
    if marshaller == AUTO:
        marshaller = detect_marshaller(data)
    frame = _frame_from_json(data) if marshaller == JSON else _frame_from_gogo(data)
    if frame.type not in (ACK, PAYLOAD):
        raise InvalidNodeFrame(BAD_TYPE, f"type {frame.type}")
    return frame


def _frame_from_gogo(data: bytes) -> NodeFrame:
    message = mx_node_pb2.WsMessage()
    try:
        message.ParseFromString(data)
    except DecodeError as error:
        raise InvalidNodeFrame(UNDECODABLE, str(error)) from None
    return NodeFrame(
        message.withAcknowledge, message.counter, message.type, message.topic, message.payload, message.version, GOGO
    )


def _frame_from_json(data: bytes) -> NodeFrame:
    try:
        message = json.loads(data)
        if not isinstance(message, dict):
            raise ValueError("not an object")
        return NodeFrame(
            _json_bool(message.get("withAcknowledge")),
            _json_uint(message.get("counter")),
            _json_int(message.get("type")),
            _json_str(message.get("topic")),
            _json_bytes(message.get("payload")),
            _json_uint(message.get("version")),
            JSON,
        )
    except (ValueError, TypeError, RecursionError) as error:  # JSONDecodeError is a ValueError
        raise InvalidNodeFrame(UNDECODABLE, str(error)) from None


def encode_node_frame(
    topic: str, payload: bytes, counter: int, marshaller: str = GOGO, with_acknowledge: bool = True,
    version: int = 1, type: int = PAYLOAD,
) -> bytes:
    """A frame as a node writes it (Go's field order in JSON, empty fields omitted)."""
    if marshaller == JSON:
        fields: dict[str, Any] = {}
        if with_acknowledge:
            fields["withAcknowledge"] = True
        if counter:
            fields["counter"] = counter
        if type:
            fields["type"] = type
        if payload:
            fields["payload"] = base64.b64encode(payload).decode("ascii")
        if topic:
            fields["topic"] = topic
        if version:
            fields["version"] = version
        return json.dumps(fields, separators=(",", ":")).encode()
    return mx_node_pb2.WsMessage(
        withAcknowledge=with_acknowledge, counter=counter, type=type, payload=payload, topic=topic, version=version
    ).SerializeToString()


def node_ack_frame(counter: int, marshaller: str = GOGO) -> bytes:
    """The ACK a node waits for: only counter and type 1 (version 0)."""
    return encode_node_frame("", b"", counter, marshaller, with_acknowledge=False, version=0, type=ACK)


# -- payloads ------------------------------------------------------------------------------------


def decode_outport_block(payload: bytes, marshaller: str) -> mx_node_pb2.OutportBlock:
    """SaveBlock's payload."""
    return _decode_payload(payload, marshaller, mx_node_pb2.OutportBlock, _outport_block_from_json)


def decode_block_data(payload: bytes, marshaller: str) -> mx_node_pb2.BlockData:
    """RevertIndexedBlock's payload."""
    return _decode_payload(payload, marshaller, mx_node_pb2.BlockData, _block_data_from_json)


def decode_finalized_block(payload: bytes, marshaller: str) -> mx_node_pb2.FinalizedBlock:
    """FinalizedBlock's payload."""
    return _decode_payload(payload, marshaller, mx_node_pb2.FinalizedBlock, _finalized_block_from_json)


def _decode_payload(payload: bytes, marshaller: str, kind: type[Message], from_json: Callable[[Any], Any]) -> Any:
    try:
        if marshaller == JSON:
            return from_json(_json_object(json.loads(payload)))
        message = kind()
        message.ParseFromString(payload)
        return message
    except (DecodeError, ValueError, TypeError, RecursionError) as error:
        raise InvalidNodeFrame(UNDECODABLE_PAYLOAD, f"{kind.__name__}: {error}") from None


# -- JSON (Go encoding/json of the gogo structs) -> the same protobuf messages --------------------


def _outport_block_from_json(data: dict[str, Any]) -> mx_node_pb2.OutportBlock:
    block = mx_node_pb2.OutportBlock(ShardID=_json_uint(data.get("shardID")))
    if data.get("blockData") is not None:
        block.BlockData.CopyFrom(_block_data_from_json(_json_object(data["blockData"])))
    pool = data.get("transactionPool")
    if pool is not None:
        _fill_pool(block.TransactionPool, _json_object(pool))
    return block


def _block_data_from_json(data: dict[str, Any]) -> mx_node_pb2.BlockData:
    return mx_node_pb2.BlockData(
        ShardID=_json_uint(data.get("shardID")),
        HeaderBytes=_json_bytes(data.get("headerBytes")),
        HeaderType=_json_str(data.get("headerType")),
        HeaderHash=_json_bytes(data.get("headerHash")),
    )


def _finalized_block_from_json(data: dict[str, Any]) -> mx_node_pb2.FinalizedBlock:
    return mx_node_pb2.FinalizedBlock(
        ShardID=_json_uint(data.get("shardID")), HeaderHash=_json_bytes(data.get("headerHash"))
    )


def _fill_pool(pool: mx_node_pb2.TransactionPool, data: dict[str, Any]) -> None:
    for tx_hash, info in _json_object(data.get("transactions") or {}).items():
        info = _json_object(info)
        tx = _json_object(info.get("transaction") or {})
        entry = pool.Transactions[tx_hash]
        entry.ExecutionOrder = _json_uint(info.get("executionOrder"))
        entry.Transaction.CopyFrom(
            mx_node_pb2.Transaction(
                Nonce=_json_uint(tx.get("nonce")),
                Value=_json_big_int(tx.get("value")),
                RcvAddr=_json_bytes(tx.get("receiver")),
                SndAddr=_json_bytes(tx.get("sender")),
                GasPrice=_json_uint(tx.get("gasPrice")),
                GasLimit=_json_uint(tx.get("gasLimit")),
                Data=_json_bytes(tx.get("data")),
            )
        )
    for scr_hash, info in _json_object(data.get("smartContractResults") or {}).items():
        info = _json_object(info)
        scr = _json_object(info.get("smartContractResult") or {})
        entry = pool.SmartContractResults[scr_hash]
        entry.ExecutionOrder = _json_uint(info.get("executionOrder"))
        entry.SmartContractResult.CopyFrom(
            mx_node_pb2.SmartContractResult(
                Nonce=_json_uint(scr.get("nonce")),
                Value=_json_big_int(scr.get("value")),
                RcvAddr=_json_bytes(scr.get("receiver")),
                SndAddr=_json_bytes(scr.get("sender")),
                Data=_json_bytes(scr.get("data")),
                PrevTxHash=_json_bytes(scr.get("prevTxHash")),
                OriginalTxHash=_json_bytes(scr.get("originalTxHash")),
                GasLimit=_json_uint(scr.get("gasLimit")),
                GasPrice=_json_uint(scr.get("gasPrice")),
            )
        )
    for log_data in _json_list(data.get("logs")):
        log_data = _json_object(log_data)
        entry = pool.Logs.add(TxHash=_json_str(log_data.get("txHash")))
        log = _json_object(log_data.get("log") or {})
        entry.Log.Address = _json_bytes(log.get("address"))
        for event in _json_list(log.get("events")):
            event = _json_object(event)
            entry.Log.Events.add(
                Address=_json_bytes(event.get("address")),
                Identifier=_json_bytes(event.get("identifier")),
                Topics=[_json_bytes(topic) for topic in _json_list(event.get("topics"))],
                Data=_json_bytes(event.get("data")),
                AdditionalData=[_json_bytes(item) for item in _json_list(event.get("additionalData"))],
            )


def _json_object(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TypeError("expected a JSON object")
    return value


def _json_list(value: Any) -> list[Any]:
    if value is None:  # Go writes a nil slice as null
        return []
    if not isinstance(value, list):
        raise TypeError("expected a JSON array")
    return value


def _json_bytes(value: Any) -> bytes:
    if value is None:
        return b""
    if not isinstance(value, str):
        raise TypeError("expected base64 text")
    try:
        return base64.b64decode(value, validate=True)
    except binascii.Error as error:
        raise ValueError(f"invalid base64: {error}") from None


def _json_str(value: Any) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise TypeError("expected a string")
    return value


def _json_int(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError("expected an integer")
    return value


def _json_uint(value: Any) -> int:
    number = _json_int(value)
    if number < 0:
        raise ValueError("expected an unsigned integer")
    return number


def _json_bool(value: Any) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise TypeError("expected a boolean")
    return value


def _json_big_int(value: Any) -> bytes:
    """A JSON big integer (Go's big.Int: a number; a string is accepted) in the protobuf form."""
    if value is None:
        return b""
    if isinstance(value, str):
        value = int(value)
    return big_int_bytes(_json_int(value))


def big_int_bytes(value: int) -> bytes:
    """mx-chain-core-go's big.Int caster: a sign byte (0 / 1), then the big-endian magnitude; 0 is 00 00."""
    magnitude = abs(value)
    body = magnitude.to_bytes((magnitude.bit_length() + 7) // 8, "big") or b"\x00"
    return (b"\x01" if value < 0 else b"\x00") + body


def big_int_value(data: bytes) -> int:
    """The inverse of :func:`big_int_bytes`; empty and a lone sign byte (nil) read as 0."""
    if len(data) <= 1:
        return 0
    magnitude = int.from_bytes(data[1:], "big")
    if data[0] == 0:
        return magnitude
    if data[0] == 1:
        return -magnitude
    raise InvalidNodeFrame(UNDECODABLE_PAYLOAD, f"invalid big integer sign byte {data[0]:#04x}")


# -- normalisation -------------------------------------------------------------------------------


@dataclass(slots=True)
class SavedBlock:
    """What one SaveBlock becomes."""

    hash: str  # hex
    shard_id: int
    events: list[mx_hub_pb2.NormalizedEvent]
    txs: mx_hub_pb2.BlockTxs
    scrs: mx_hub_pb2.BlockScrs
    skipped_events: int = 0  # events whose address is not 32 bytes (no bech32), as the reference


@dataclass(frozen=True, slots=True)
class Ignored:
    """A payload the hub has no stream for; ``known`` tells a listed node topic from a new one."""

    topic: str
    known: bool


NodeOutput = SavedBlock | mx_hub_pb2.RevertEvent | mx_hub_pb2.FinalizedEvent | Ignored


def handle_payload(frame: NodeFrame) -> NodeOutput:
    """Decode and normalise a PAYLOAD frame's payload by its topic, in the frame's marshalling."""
    if frame.topic == SAVE_BLOCK:
        return normalize_save_block(decode_outport_block(frame.payload, frame.marshaller))
    if frame.topic == REVERT_INDEXED_BLOCK:
        return normalize_revert(decode_block_data(frame.payload, frame.marshaller))
    if frame.topic == FINALIZED_BLOCK:
        return normalize_finalized(decode_finalized_block(frame.payload, frame.marshaller))
    return Ignored(frame.topic, frame.topic in IGNORED_TOPICS)


def normalize_save_block(block: mx_node_pb2.OutportBlock) -> SavedBlock:
    """One NormalizedEvent per log event, in block order; the block's transactions and SCRs."""
    block_hash = block.BlockData.HeaderHash.hex()
    shard_id = block.ShardID
    pool = block.TransactionPool
    scrs = pool.SmartContractResults
    events: list[mx_hub_pb2.NormalizedEvent] = []
    skipped = 0
    order = 0
    for log_data in pool.Logs:
        tx_hash = log_data.TxHash
        original_tx_hash = tx_hash
        if tx_hash in scrs:  # `in` first: reading a missing key of a message map would insert it
            original = scrs[tx_hash].SmartContractResult.OriginalTxHash
            if original:
                original_tx_hash = original.hex()
        for event in log_data.Log.Events:
            address = try_encode_address(event.Address)
            if address is None:
                skipped += 1
            else:
                events.append(
                    mx_hub_pb2.NormalizedEvent(
                        address=address,
                        identifier=event.Identifier.decode("utf-8", "replace"),
                        topics=event.Topics,
                        data=event.Data,
                        tx_hash=tx_hash,
                        original_tx_hash=original_tx_hash,
                        order=order,
                        block_hash=block_hash,
                        shard_id=shard_id,
                    )
                )
            order += 1
    txs = mx_hub_pb2.BlockTxs(hash=block_hash, shard_id=shard_id)
    for tx_hash, info in sorted(pool.Transactions.items(), key=lambda item: (item[1].ExecutionOrder, item[0])):
        tx = info.Transaction
        txs.txs.add(
            hash=tx_hash,
            execution_order=info.ExecutionOrder,
            nonce=tx.Nonce,
            sender=try_encode_address(tx.SndAddr) or "",
            receiver=try_encode_address(tx.RcvAddr) or "",
            value=str(big_int_value(tx.Value)),
            data=tx.Data,
            gas_limit=tx.GasLimit,
            gas_price=tx.GasPrice,
        )
    block_scrs = mx_hub_pb2.BlockScrs(hash=block_hash, shard_id=shard_id)
    for scr_hash, info in sorted(scrs.items(), key=lambda item: (item[1].ExecutionOrder, item[0])):
        scr = info.SmartContractResult
        block_scrs.scrs.add(
            hash=scr_hash,
            execution_order=info.ExecutionOrder,
            nonce=scr.Nonce,
            sender=try_encode_address(scr.SndAddr) or "",
            receiver=try_encode_address(scr.RcvAddr) or "",
            value=str(big_int_value(scr.Value)),
            data=scr.Data,
            prev_tx_hash=scr.PrevTxHash.hex(),
            original_tx_hash=scr.OriginalTxHash.hex(),
            gas_limit=scr.GasLimit,
            gas_price=scr.GasPrice,
        )
    return SavedBlock(block_hash, shard_id, events, txs, block_scrs, skipped)


def normalize_revert(data: mx_node_pb2.BlockData) -> mx_hub_pb2.RevertEvent:
    """The reverted block's hash and, read from its header bytes, nonce, round, epoch, timestamp."""
    revert = mx_hub_pb2.RevertEvent(hash=data.HeaderHash.hex(), shard_id=data.ShardID)
    header = _read_header(data.HeaderType, data.HeaderBytes)
    if header is not None:
        revert.nonce = header.Nonce
        revert.round = header.Round
        revert.epoch = header.Epoch
        revert.timestamp = header.TimeStamp
    return revert


def _read_header(header_type: str, header_bytes: bytes) -> Any:
    """A Header or MetaBlock message, or None for another type or undecodable bytes.

    The revert is still worth delivering without these numbers: its hash identifies the block.
    """
    try:
        if header_type == "Header":
            return mx_node_pb2.Header.FromString(header_bytes)
        if header_type == "HeaderV2":
            return mx_node_pb2.HeaderV2.FromString(header_bytes).Header
        if header_type == "MetaBlock":
            return mx_node_pb2.MetaBlock.FromString(header_bytes)
    except DecodeError:
        return None
    return None


def normalize_finalized(block: mx_node_pb2.FinalizedBlock) -> mx_hub_pb2.FinalizedEvent:
    return mx_hub_pb2.FinalizedEvent(hash=block.HeaderHash.hex(), shard_id=block.ShardID)


# -- retries ------------------------------------------------------------------------------------


def dedup_key(topic: str, block_hash: str) -> str:
    """Per topic: a block is saved, reverted and finalized under the same hash."""
    return f"{topic}:{block_hash}"


@dataclass(slots=True)
class DuplicateSuppressor:
    """Keys seen within the last ``window_s`` seconds, at most ``max_entries`` of them.

    A node that timed out waiting for an ACK sends the same block again under a new counter;
    the first delivery wins. When full, the oldest key is forgotten early (memory is bounded; a
    retry that old is unlikely). Times are monotonic seconds from the caller.
    """

    window_s: float = DEDUP_WINDOW_S
    max_entries: int = DEDUP_MAX_ENTRIES
    _seen: OrderedDict[str, float] = field(default_factory=OrderedDict)

    def first_seen(self, key: str, now: float) -> bool:
        """True the first time within the window (process it); False for a duplicate."""
        self._expire(now)
        if key in self._seen:
            return False
        self._seen[key] = now
        if len(self._seen) > self.max_entries:
            self._seen.popitem(last=False)
        return True

    def forget(self, key: str) -> None:
        """Processing failed: let the node's retry through."""
        self._seen.pop(key, None)

    def _expire(self, now: float) -> None:
        horizon = now - self.window_s
        seen = self._seen
        while seen:
            oldest_key, seen_at = next(iter(seen.items()))
            if seen_at > horizon:
                break
            del seen[oldest_key]

    def __len__(self) -> int:
        return len(self._seen)
