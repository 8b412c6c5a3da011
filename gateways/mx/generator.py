"""Realistic node payloads from a seed, for tests and benchmarks without a MultiversX node.

A generated SaveBlock has transactions, SCRs that descend from them, and logs whose events mix
the shapes a node emits (ESDTTransfer, ESDTNFTTransfer, MultiESDTNFTTransfer, transferValueOnly,
SCDeploy, writeLog, completedTxEvent, ESDTLocalBurn, a DEX swap), over a small pool of addresses
and tokens so filters match repeatedly. The same seed gives the same block; the payload is
written as gogo protobuf or as the node's JSON (Go encoding/json of the same structs).
"""

from __future__ import annotations

import base64
import json
import random
from dataclasses import dataclass
from typing import Any

from gateways.mx.node import (
    FINALIZED_BLOCK,
    GOGO,
    JSON,
    REVERT_INDEXED_BLOCK,
    SAVE_BLOCK,
    big_int_value,
    big_int_bytes,
    encode_node_frame,
)
from gateways.mx.pb import mx_node_pb2

METACHAIN = 4294967295
ESDT_SYSTEM_SC = bytes.fromhex("000000000000000000010000000000000000000000000000000000000002ffff")
FUNGIBLE_TOKENS = (b"WEGLD-bd4d79", b"USDC-c76f1f", b"MEX-455c57", b"UTK-2f80e9", b"RIDE-7d18e9")
COLLECTIONS = (b"XOXNO-589e09", b"EAPES-8f3c1f", b"GNOGONS-73222b")
IDENTIFIERS = (
    "ESDTTransfer", "ESDTNFTTransfer", "MultiESDTNFTTransfer", "transferValueOnly", "SCDeploy",
    "writeLog", "completedTxEvent", "ESDTLocalBurn", "swapTokensFixedInput",
)


@dataclass(frozen=True, slots=True)
class HeaderInfo:
    nonce: int
    round: int
    epoch: int
    timestamp: int


class _Pools:
    """The addresses and hashes one block draws from."""

    def __init__(self, rng: random.Random, users: int, contracts: int) -> None:
        self.rng = rng
        self.users = [rng.randbytes(32) for _ in range(users)]
        # A deployed contract: 8 zero bytes, the VM type (05 00), then 22 bytes.
        self.contracts = [bytes(8) + b"\x05\x00" + rng.randbytes(22) for _ in range(contracts)]

    def account(self) -> bytes:
        return self.rng.choice(self.users + self.contracts)

    def user(self) -> bytes:
        return self.rng.choice(self.users)

    def contract(self) -> bytes:
        return self.rng.choice(self.contracts)

    def amount(self) -> int:
        return self.rng.choice((1, 10**6, 10**18, self.rng.randrange(1, 10**24)))


def _minimal_bytes(value: int) -> bytes:
    """How the VM writes an unsigned number in a topic: big-endian, no leading zeros, 0 is empty."""
    return value.to_bytes((value.bit_length() + 7) // 8, "big")


def _event(pools: _Pools, identifier: str, sender: bytes, tx_hash: bytes) -> mx_node_pb2.Event:
    rng = pools.rng
    receiver = pools.account()
    if identifier == "ESDTTransfer":
        address = sender
        topics = [rng.choice(FUNGIBLE_TOKENS), b"", _minimal_bytes(pools.amount()), receiver]
        data = b""
    elif identifier == "ESDTNFTTransfer":
        address = sender
        topics = [rng.choice(COLLECTIONS), _minimal_bytes(rng.randrange(1, 5000)), b"\x01", receiver]
        data = b""
    elif identifier == "MultiESDTNFTTransfer":
        address = sender
        topics = [rng.choice(FUNGIBLE_TOKENS), b"", _minimal_bytes(pools.amount()),
                  rng.choice(COLLECTIONS), _minimal_bytes(rng.randrange(1, 5000)), b"\x01", receiver]
        data = b""
    elif identifier == "transferValueOnly":
        address = sender
        topics = [_minimal_bytes(pools.amount()), receiver]
        data = rng.choice((b"DirectCall", b"AsyncCall", b"BackTransfer"))
    elif identifier == "SCDeploy":
        address = pools.contract()
        topics = [address, sender, rng.randbytes(32)]
        data = b""
    elif identifier == "writeLog":
        address = sender
        topics = [sender]
        data = rng.choice((b"@6f6b", b"@6f6b@" + rng.randbytes(8).hex().encode(), b"@75736572206572726f72"))
    elif identifier == "completedTxEvent":
        address = sender
        topics = [tx_hash]
        data = b""
    elif identifier == "ESDTLocalBurn":
        address = pools.contract()
        topics = [rng.choice(FUNGIBLE_TOKENS), b"", _minimal_bytes(pools.amount())]
        data = b""
    else:  # a DEX pair's swap event
        address = pools.contract()
        token_in, token_out = rng.sample(FUNGIBLE_TOKENS, 2)
        topics = [b"swap", token_in, token_out, sender, _minimal_bytes(rng.randrange(1, 20000))]
        data = rng.randbytes(rng.randrange(16, 96))
    return mx_node_pb2.Event(Address=address, Identifier=identifier.encode(), Topics=topics, Data=data)


def generate_save_block(
    seed: int, transactions: int = 20, shard_id: int = 0, users: int = 8, contracts: int = 4,
) -> mx_node_pb2.OutportBlock:
    """A SaveBlock payload (``OutportBlock``) with ``transactions`` transactions and their logs."""
    rng = random.Random(seed)
    pools = _Pools(rng, users, contracts)
    header = HeaderInfo(
        nonce=rng.randrange(1, 30_000_000), round=rng.randrange(1, 30_000_000), epoch=rng.randrange(1, 2_000),
        timestamp=rng.randrange(1_600_000_000, 1_900_000_000),
    )
    block = mx_node_pb2.OutportBlock(ShardID=shard_id)
    data = block.BlockData
    data.ShardID = shard_id
    data.HeaderHash = rng.randbytes(32)
    data.HeaderType, data.HeaderBytes = _header(header, shard_id)
    pool = block.TransactionPool
    order = 0
    for _ in range(transactions):
        tx_hash = rng.randbytes(32)
        sender = pools.user()
        info = pool.Transactions[tx_hash.hex()]
        info.ExecutionOrder = order
        order += 1
        info.Transaction.CopyFrom(
            mx_node_pb2.Transaction(
                Nonce=rng.randrange(0, 10_000), Value=big_int_bytes(rng.choice((0, pools.amount()))),
                RcvAddr=pools.account(), SndAddr=sender, GasPrice=1_000_000_000,
                GasLimit=rng.choice((50_000, 500_000, 60_000_000)),
                Data=rng.choice((b"", b"ESDTTransfer@" + rng.randbytes(6).hex().encode(), b"claim")),
            )
        )
        _add_log(pool, pools, tx_hash, sender, rng.randrange(1, 4))
        # Some transactions call contracts: SCRs that point back to them, with logs of their own.
        for _ in range(rng.choice((0, 0, 1, 2))):
            scr_hash = rng.randbytes(32)
            scr_sender = pools.contract()
            scr = pool.SmartContractResults[scr_hash.hex()]
            scr.ExecutionOrder = order
            order += 1
            scr.SmartContractResult.CopyFrom(
                mx_node_pb2.SmartContractResult(
                    Nonce=rng.randrange(0, 100), Value=big_int_bytes(rng.choice((0, pools.amount()))),
                    RcvAddr=sender, SndAddr=scr_sender, Data=b"@6f6b", PrevTxHash=tx_hash,
                    OriginalTxHash=tx_hash, GasLimit=0, GasPrice=1_000_000_000,
                )
            )
            _add_log(pool, pools, scr_hash, scr_sender, rng.randrange(1, 3))
    return block


def _add_log(pool: mx_node_pb2.TransactionPool, pools: _Pools, tx_hash: bytes, sender: bytes, events: int) -> None:
    log_data = pool.Logs.add(TxHash=tx_hash.hex())
    log_data.Log.Address = sender
    for _ in range(events):
        log_data.Log.Events.append(_event(pools, pools.rng.choice(IDENTIFIERS), sender, tx_hash))


def _header(header: HeaderInfo, shard_id: int) -> tuple[str, bytes]:
    if shard_id == METACHAIN:
        meta = mx_node_pb2.MetaBlock(
            Nonce=header.nonce, Epoch=header.epoch, Round=header.round, TimeStamp=header.timestamp
        )
        return "MetaBlock", meta.SerializeToString()
    inner = mx_node_pb2.Header(
        Nonce=header.nonce, ShardID=shard_id, TimeStamp=header.timestamp, Round=header.round, Epoch=header.epoch
    )
    return "HeaderV2", mx_node_pb2.HeaderV2(Header=inner).SerializeToString()


def header_info(block: mx_node_pb2.OutportBlock) -> HeaderInfo:
    """The numbers a generated block's header carries (what a revert of it reports)."""
    data = block.BlockData
    if data.HeaderType == "MetaBlock":
        header: Any = mx_node_pb2.MetaBlock.FromString(data.HeaderBytes)
    else:
        header = mx_node_pb2.HeaderV2.FromString(data.HeaderBytes).Header
    return HeaderInfo(header.Nonce, header.Round, header.Epoch, header.TimeStamp)


# -- payload bytes -------------------------------------------------------------------------------

# Fields of OutportBlock the router does not declare (NumberOfShards=7, HighestFinalBlockNonce=9),
# appended to gogo payloads so decoding proves it skips what it does not know.
_UNDECLARED_GOGO_FIELDS = b"\x38\x03" + b"\x48\x80\x02"


def save_block_payload(block: mx_node_pb2.OutportBlock, marshaller: str = GOGO) -> bytes:
    if marshaller == JSON:
        return _json_bytes(outport_block_json(block))
    return block.SerializeToString(deterministic=True) + _UNDECLARED_GOGO_FIELDS


def revert_payload(block: mx_node_pb2.OutportBlock, marshaller: str = GOGO) -> bytes:
    """RevertIndexedBlock for a block: its BlockData."""
    if marshaller == JSON:
        return _json_bytes(block_data_json(block.BlockData))
    return block.BlockData.SerializeToString(deterministic=True)


def finalized_payload(block: mx_node_pb2.OutportBlock, marshaller: str = GOGO) -> bytes:
    finalized = mx_node_pb2.FinalizedBlock(ShardID=block.ShardID, HeaderHash=block.BlockData.HeaderHash)
    if marshaller == JSON:
        return _json_bytes({"shardID": finalized.ShardID, "headerHash": _b64(finalized.HeaderHash)})
    return finalized.SerializeToString()


def save_block_frame(block: mx_node_pb2.OutportBlock, counter: int, marshaller: str = GOGO) -> bytes:
    return encode_node_frame(SAVE_BLOCK, save_block_payload(block, marshaller), counter, marshaller)


def revert_frame(block: mx_node_pb2.OutportBlock, counter: int, marshaller: str = GOGO) -> bytes:
    return encode_node_frame(REVERT_INDEXED_BLOCK, revert_payload(block, marshaller), counter, marshaller)


def finalized_frame(block: mx_node_pb2.OutportBlock, counter: int, marshaller: str = GOGO) -> bytes:
    return encode_node_frame(FINALIZED_BLOCK, finalized_payload(block, marshaller), counter, marshaller)


# -- the node's JSON: Go encoding/json over the gogo structs ---------------------------------------
# Keys in struct order; []byte as standard base64; nil slices as null; big.Int as a number;
# `omitempty` where the upstream json tag has it. Undeclared fields are written too.


def outport_block_json(block: mx_node_pb2.OutportBlock) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if block.ShardID:
        out["shardID"] = block.ShardID
    if block.HasField("BlockData"):
        out["blockData"] = block_data_json(block.BlockData)
    if block.HasField("TransactionPool"):
        out["transactionPool"] = _pool_json(block.TransactionPool)
    out["numberOfShards"] = 3
    out["highestFinalBlockNonce"] = 0
    return out


def block_data_json(data: mx_node_pb2.BlockData) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if data.ShardID:
        out["shardID"] = data.ShardID
    if data.HeaderBytes:
        out["headerBytes"] = _b64(data.HeaderBytes)
    if data.HeaderType:
        out["headerType"] = data.HeaderType
    if data.HeaderHash:
        out["headerHash"] = _b64(data.HeaderHash)
    return out


def _pool_json(pool: mx_node_pb2.TransactionPool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if pool.Transactions:
        out["transactions"] = {
            tx_hash: {"transaction": _tx_json(info.Transaction), "executionOrder": info.ExecutionOrder}
            for tx_hash, info in sorted(pool.Transactions.items())  # Go sorts map keys
        }
    if pool.SmartContractResults:
        out["smartContractResults"] = {
            scr_hash: {"smartContractResult": _scr_json(info.SmartContractResult),
                       "executionOrder": info.ExecutionOrder}
            for scr_hash, info in sorted(pool.SmartContractResults.items())
        }
    if pool.Logs:
        out["logs"] = [{"txHash": log_data.TxHash, "log": _log_json(log_data.Log)} for log_data in pool.Logs]
    return out


def _tx_json(tx: mx_node_pb2.Transaction) -> dict[str, Any]:
    out: dict[str, Any] = {
        "nonce": tx.Nonce,
        "value": big_int_value(tx.Value),
        "receiver": _b64_or_null(tx.RcvAddr),
        "sender": _b64_or_null(tx.SndAddr),
    }
    if tx.GasPrice:
        out["gasPrice"] = tx.GasPrice
    if tx.GasLimit:
        out["gasLimit"] = tx.GasLimit
    if tx.Data:
        out["data"] = _b64(tx.Data)
    out["chainID"] = _b64(b"1")
    out["version"] = 2
    return out


def _scr_json(scr: mx_node_pb2.SmartContractResult) -> dict[str, Any]:
    out: dict[str, Any] = {
        "nonce": scr.Nonce,
        "value": big_int_value(scr.Value),
        "receiver": _b64_or_null(scr.RcvAddr),
        "sender": _b64_or_null(scr.SndAddr),
        "relayer": None,
        "relayedValue": None,
    }
    if scr.Data:
        out["data"] = _b64(scr.Data)
    out["prevTxHash"] = _b64_or_null(scr.PrevTxHash)
    out["originalTxHash"] = _b64_or_null(scr.OriginalTxHash)
    out["gasLimit"] = scr.GasLimit
    out["gasPrice"] = scr.GasPrice
    out["callType"] = 0
    return out


def _log_json(log: mx_node_pb2.Log) -> dict[str, Any]:
    return {
        "address": _b64_or_null(log.Address),
        "events": [
            {
                "address": _b64_or_null(event.Address),
                "identifier": _b64_or_null(event.Identifier),
                "topics": [_b64(topic) for topic in event.Topics] if event.Topics else None,
                "data": _b64_or_null(event.Data),
                "additionalData": [_b64(item) for item in event.AdditionalData] if event.AdditionalData else None,
            }
            for event in log.Events
        ],
    }


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _b64_or_null(data: bytes) -> str | None:
    """Go writes a nil []byte as null; after a protobuf round trip empty and nil are one."""
    return _b64(data) if data else None


def _json_bytes(value: dict[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()
