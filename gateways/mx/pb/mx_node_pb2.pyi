from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WsMessage(_message.Message):
    __slots__ = ("withAcknowledge", "counter", "type", "payload", "topic", "version")
    WITHACKNOWLEDGE_FIELD_NUMBER: _ClassVar[int]
    COUNTER_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    withAcknowledge: bool
    counter: int
    type: int
    payload: bytes
    topic: str
    version: int
    def __init__(self, withAcknowledge: _Optional[bool] = ..., counter: _Optional[int] = ..., type: _Optional[int] = ..., payload: _Optional[bytes] = ..., topic: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...

class OutportBlock(_message.Message):
    __slots__ = ("ShardID", "BlockData", "TransactionPool")
    SHARDID_FIELD_NUMBER: _ClassVar[int]
    BLOCKDATA_FIELD_NUMBER: _ClassVar[int]
    TRANSACTIONPOOL_FIELD_NUMBER: _ClassVar[int]
    ShardID: int
    BlockData: BlockData
    TransactionPool: TransactionPool
    def __init__(self, ShardID: _Optional[int] = ..., BlockData: _Optional[_Union[BlockData, _Mapping]] = ..., TransactionPool: _Optional[_Union[TransactionPool, _Mapping]] = ...) -> None: ...

class BlockData(_message.Message):
    __slots__ = ("ShardID", "HeaderBytes", "HeaderType", "HeaderHash")
    SHARDID_FIELD_NUMBER: _ClassVar[int]
    HEADERBYTES_FIELD_NUMBER: _ClassVar[int]
    HEADERTYPE_FIELD_NUMBER: _ClassVar[int]
    HEADERHASH_FIELD_NUMBER: _ClassVar[int]
    ShardID: int
    HeaderBytes: bytes
    HeaderType: str
    HeaderHash: bytes
    def __init__(self, ShardID: _Optional[int] = ..., HeaderBytes: _Optional[bytes] = ..., HeaderType: _Optional[str] = ..., HeaderHash: _Optional[bytes] = ...) -> None: ...

class TransactionPool(_message.Message):
    __slots__ = ("Transactions", "SmartContractResults", "Logs")
    class TransactionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: TxInfo
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[TxInfo, _Mapping]] = ...) -> None: ...
    class SmartContractResultsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: SCRInfo
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[SCRInfo, _Mapping]] = ...) -> None: ...
    TRANSACTIONS_FIELD_NUMBER: _ClassVar[int]
    SMARTCONTRACTRESULTS_FIELD_NUMBER: _ClassVar[int]
    LOGS_FIELD_NUMBER: _ClassVar[int]
    Transactions: _containers.MessageMap[str, TxInfo]
    SmartContractResults: _containers.MessageMap[str, SCRInfo]
    Logs: _containers.RepeatedCompositeFieldContainer[LogData]
    def __init__(self, Transactions: _Optional[_Mapping[str, TxInfo]] = ..., SmartContractResults: _Optional[_Mapping[str, SCRInfo]] = ..., Logs: _Optional[_Iterable[_Union[LogData, _Mapping]]] = ...) -> None: ...

class TxInfo(_message.Message):
    __slots__ = ("Transaction", "ExecutionOrder")
    TRANSACTION_FIELD_NUMBER: _ClassVar[int]
    EXECUTIONORDER_FIELD_NUMBER: _ClassVar[int]
    Transaction: Transaction
    ExecutionOrder: int
    def __init__(self, Transaction: _Optional[_Union[Transaction, _Mapping]] = ..., ExecutionOrder: _Optional[int] = ...) -> None: ...

class SCRInfo(_message.Message):
    __slots__ = ("SmartContractResult", "ExecutionOrder")
    SMARTCONTRACTRESULT_FIELD_NUMBER: _ClassVar[int]
    EXECUTIONORDER_FIELD_NUMBER: _ClassVar[int]
    SmartContractResult: SmartContractResult
    ExecutionOrder: int
    def __init__(self, SmartContractResult: _Optional[_Union[SmartContractResult, _Mapping]] = ..., ExecutionOrder: _Optional[int] = ...) -> None: ...

class Transaction(_message.Message):
    __slots__ = ("Nonce", "Value", "RcvAddr", "SndAddr", "GasPrice", "GasLimit", "Data")
    NONCE_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    RCVADDR_FIELD_NUMBER: _ClassVar[int]
    SNDADDR_FIELD_NUMBER: _ClassVar[int]
    GASPRICE_FIELD_NUMBER: _ClassVar[int]
    GASLIMIT_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    Nonce: int
    Value: bytes
    RcvAddr: bytes
    SndAddr: bytes
    GasPrice: int
    GasLimit: int
    Data: bytes
    def __init__(self, Nonce: _Optional[int] = ..., Value: _Optional[bytes] = ..., RcvAddr: _Optional[bytes] = ..., SndAddr: _Optional[bytes] = ..., GasPrice: _Optional[int] = ..., GasLimit: _Optional[int] = ..., Data: _Optional[bytes] = ...) -> None: ...

class SmartContractResult(_message.Message):
    __slots__ = ("Nonce", "Value", "RcvAddr", "SndAddr", "Data", "PrevTxHash", "OriginalTxHash", "GasLimit", "GasPrice")
    NONCE_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    RCVADDR_FIELD_NUMBER: _ClassVar[int]
    SNDADDR_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    PREVTXHASH_FIELD_NUMBER: _ClassVar[int]
    ORIGINALTXHASH_FIELD_NUMBER: _ClassVar[int]
    GASLIMIT_FIELD_NUMBER: _ClassVar[int]
    GASPRICE_FIELD_NUMBER: _ClassVar[int]
    Nonce: int
    Value: bytes
    RcvAddr: bytes
    SndAddr: bytes
    Data: bytes
    PrevTxHash: bytes
    OriginalTxHash: bytes
    GasLimit: int
    GasPrice: int
    def __init__(self, Nonce: _Optional[int] = ..., Value: _Optional[bytes] = ..., RcvAddr: _Optional[bytes] = ..., SndAddr: _Optional[bytes] = ..., Data: _Optional[bytes] = ..., PrevTxHash: _Optional[bytes] = ..., OriginalTxHash: _Optional[bytes] = ..., GasLimit: _Optional[int] = ..., GasPrice: _Optional[int] = ...) -> None: ...

class LogData(_message.Message):
    __slots__ = ("TxHash", "Log")
    TXHASH_FIELD_NUMBER: _ClassVar[int]
    LOG_FIELD_NUMBER: _ClassVar[int]
    TxHash: str
    Log: Log
    def __init__(self, TxHash: _Optional[str] = ..., Log: _Optional[_Union[Log, _Mapping]] = ...) -> None: ...

class Log(_message.Message):
    __slots__ = ("Address", "Events")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    Address: bytes
    Events: _containers.RepeatedCompositeFieldContainer[Event]
    def __init__(self, Address: _Optional[bytes] = ..., Events: _Optional[_Iterable[_Union[Event, _Mapping]]] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("Address", "Identifier", "Topics", "Data", "AdditionalData")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    IDENTIFIER_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    ADDITIONALDATA_FIELD_NUMBER: _ClassVar[int]
    Address: bytes
    Identifier: bytes
    Topics: _containers.RepeatedScalarFieldContainer[bytes]
    Data: bytes
    AdditionalData: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, Address: _Optional[bytes] = ..., Identifier: _Optional[bytes] = ..., Topics: _Optional[_Iterable[bytes]] = ..., Data: _Optional[bytes] = ..., AdditionalData: _Optional[_Iterable[bytes]] = ...) -> None: ...

class FinalizedBlock(_message.Message):
    __slots__ = ("ShardID", "HeaderHash")
    SHARDID_FIELD_NUMBER: _ClassVar[int]
    HEADERHASH_FIELD_NUMBER: _ClassVar[int]
    ShardID: int
    HeaderHash: bytes
    def __init__(self, ShardID: _Optional[int] = ..., HeaderHash: _Optional[bytes] = ...) -> None: ...

class Header(_message.Message):
    __slots__ = ("Nonce", "ShardID", "TimeStamp", "Round", "Epoch")
    NONCE_FIELD_NUMBER: _ClassVar[int]
    SHARDID_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    Nonce: int
    ShardID: int
    TimeStamp: int
    Round: int
    Epoch: int
    def __init__(self, Nonce: _Optional[int] = ..., ShardID: _Optional[int] = ..., TimeStamp: _Optional[int] = ..., Round: _Optional[int] = ..., Epoch: _Optional[int] = ...) -> None: ...

class HeaderV2(_message.Message):
    __slots__ = ("Header",)
    HEADER_FIELD_NUMBER: _ClassVar[int]
    Header: Header
    def __init__(self, Header: _Optional[_Union[Header, _Mapping]] = ...) -> None: ...

class MetaBlock(_message.Message):
    __slots__ = ("Nonce", "Epoch", "Round", "TimeStamp")
    NONCE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    Nonce: int
    Epoch: int
    Round: int
    TimeStamp: int
    def __init__(self, Nonce: _Optional[int] = ..., Epoch: _Optional[int] = ..., Round: _Optional[int] = ..., TimeStamp: _Optional[int] = ...) -> None: ...
