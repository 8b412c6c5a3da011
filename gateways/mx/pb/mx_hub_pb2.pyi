from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WsMessage(_message.Message):
    __slots__ = ("version", "with_acknowledge", "counter", "type", "topic", "payload")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    WITH_ACKNOWLEDGE_FIELD_NUMBER: _ClassVar[int]
    COUNTER_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    version: int
    with_acknowledge: bool
    counter: int
    type: int
    topic: str
    payload: bytes
    def __init__(self, version: _Optional[int] = ..., with_acknowledge: _Optional[bool] = ..., counter: _Optional[int] = ..., type: _Optional[int] = ..., topic: _Optional[str] = ..., payload: _Optional[bytes] = ...) -> None: ...

class SubscribeEvent(_message.Message):
    __slots__ = ("event_type", "address", "identifier", "topics")
    EVENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    IDENTIFIER_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    event_type: str
    address: str
    identifier: str
    topics: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, event_type: _Optional[str] = ..., address: _Optional[str] = ..., identifier: _Optional[str] = ..., topics: _Optional[_Iterable[str]] = ...) -> None: ...

class NormalizedEvent(_message.Message):
    __slots__ = ("address", "identifier", "topics", "data", "tx_hash", "original_tx_hash", "order", "block_hash", "shard_id")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    IDENTIFIER_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    TX_HASH_FIELD_NUMBER: _ClassVar[int]
    ORIGINAL_TX_HASH_FIELD_NUMBER: _ClassVar[int]
    ORDER_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASH_FIELD_NUMBER: _ClassVar[int]
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    address: str
    identifier: str
    topics: _containers.RepeatedScalarFieldContainer[bytes]
    data: bytes
    tx_hash: str
    original_tx_hash: str
    order: int
    block_hash: str
    shard_id: int
    def __init__(self, address: _Optional[str] = ..., identifier: _Optional[str] = ..., topics: _Optional[_Iterable[bytes]] = ..., data: _Optional[bytes] = ..., tx_hash: _Optional[str] = ..., original_tx_hash: _Optional[str] = ..., order: _Optional[int] = ..., block_hash: _Optional[str] = ..., shard_id: _Optional[int] = ...) -> None: ...

class RevertEvent(_message.Message):
    __slots__ = ("hash", "nonce", "round", "epoch", "shard_id", "timestamp")
    HASH_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    hash: str
    nonce: int
    round: int
    epoch: int
    shard_id: int
    timestamp: int
    def __init__(self, hash: _Optional[str] = ..., nonce: _Optional[int] = ..., round: _Optional[int] = ..., epoch: _Optional[int] = ..., shard_id: _Optional[int] = ..., timestamp: _Optional[int] = ...) -> None: ...

class FinalizedEvent(_message.Message):
    __slots__ = ("hash", "shard_id")
    HASH_FIELD_NUMBER: _ClassVar[int]
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    hash: str
    shard_id: int
    def __init__(self, hash: _Optional[str] = ..., shard_id: _Optional[int] = ...) -> None: ...

class BlockTransaction(_message.Message):
    __slots__ = ("hash", "execution_order", "nonce", "sender", "receiver", "value", "data", "gas_limit", "gas_price")
    HASH_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_ORDER_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    RECEIVER_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    GAS_LIMIT_FIELD_NUMBER: _ClassVar[int]
    GAS_PRICE_FIELD_NUMBER: _ClassVar[int]
    hash: str
    execution_order: int
    nonce: int
    sender: str
    receiver: str
    value: str
    data: bytes
    gas_limit: int
    gas_price: int
    def __init__(self, hash: _Optional[str] = ..., execution_order: _Optional[int] = ..., nonce: _Optional[int] = ..., sender: _Optional[str] = ..., receiver: _Optional[str] = ..., value: _Optional[str] = ..., data: _Optional[bytes] = ..., gas_limit: _Optional[int] = ..., gas_price: _Optional[int] = ...) -> None: ...

class BlockTxs(_message.Message):
    __slots__ = ("hash", "shard_id", "txs")
    HASH_FIELD_NUMBER: _ClassVar[int]
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    TXS_FIELD_NUMBER: _ClassVar[int]
    hash: str
    shard_id: int
    txs: _containers.RepeatedCompositeFieldContainer[BlockTransaction]
    def __init__(self, hash: _Optional[str] = ..., shard_id: _Optional[int] = ..., txs: _Optional[_Iterable[_Union[BlockTransaction, _Mapping]]] = ...) -> None: ...

class BlockScr(_message.Message):
    __slots__ = ("hash", "execution_order", "nonce", "sender", "receiver", "value", "data", "prev_tx_hash", "original_tx_hash", "gas_limit", "gas_price")
    HASH_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_ORDER_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    RECEIVER_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    PREV_TX_HASH_FIELD_NUMBER: _ClassVar[int]
    ORIGINAL_TX_HASH_FIELD_NUMBER: _ClassVar[int]
    GAS_LIMIT_FIELD_NUMBER: _ClassVar[int]
    GAS_PRICE_FIELD_NUMBER: _ClassVar[int]
    hash: str
    execution_order: int
    nonce: int
    sender: str
    receiver: str
    value: str
    data: bytes
    prev_tx_hash: str
    original_tx_hash: str
    gas_limit: int
    gas_price: int
    def __init__(self, hash: _Optional[str] = ..., execution_order: _Optional[int] = ..., nonce: _Optional[int] = ..., sender: _Optional[str] = ..., receiver: _Optional[str] = ..., value: _Optional[str] = ..., data: _Optional[bytes] = ..., prev_tx_hash: _Optional[str] = ..., original_tx_hash: _Optional[str] = ..., gas_limit: _Optional[int] = ..., gas_price: _Optional[int] = ...) -> None: ...

class BlockScrs(_message.Message):
    __slots__ = ("hash", "shard_id", "scrs")
    HASH_FIELD_NUMBER: _ClassVar[int]
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    SCRS_FIELD_NUMBER: _ClassVar[int]
    hash: str
    shard_id: int
    scrs: _containers.RepeatedCompositeFieldContainer[BlockScr]
    def __init__(self, hash: _Optional[str] = ..., shard_id: _Optional[int] = ..., scrs: _Optional[_Iterable[_Union[BlockScr, _Mapping]]] = ...) -> None: ...
