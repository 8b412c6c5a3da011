"""gateways/mx/node.py and generator.py: the node side (mx-upstream-notes.md).

Sections follow the notes: the node's WsMessage numbering, transport behaviour (receiving, ACK,
retries and deduplication), node topics and payloads, normalization.
"""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateways.mx import generator, node
from gateways.mx.node import (
    BAD_TYPE,
    EMPTY_FRAME,
    GOGO,
    JSON,
    UNDECODABLE,
    UNDECODABLE_PAYLOAD,
    DuplicateSuppressor,
    Ignored,
    InvalidNodeFrame,
    NodeFrame,
    SavedBlock,
    big_int_bytes,
    big_int_value,
    decode_node_frame,
    dedup_key,
    encode_node_frame,
    handle_payload,
    node_ack_frame,
    normalize_save_block,
)
from gateways.mx.pb import mx_hub_pb2, mx_node_pb2

ALICE_KEY = bytes.fromhex("0139472eff6886771a982f3083da5d421f24c29181e63888228dc81ca60d69e1")
ALICE = "erd1qyu5wthldzr8wx5c9ucg8kjagg0jfs53s8nr3zpz3hypefsdd8ssycr6th"
ESDT_SC_KEY = bytes.fromhex("000000000000000000010000000000000000000000000000000000000002ffff")
ESDT_SC = "erd1qqqqqqqqqqqqqqqpqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqzllls8a5w6u"
ZERO = "erd1qqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqq6gq4hu"
BLOCK_HASH = bytes(range(32))
TX = "aa" * 32
SCR = "bb" * 32


def dropped(data: bytes, marshaller: str = node.AUTO) -> str:
    with pytest.raises(InvalidNodeFrame) as raised:
        decode_node_frame(data, marshaller)
    return raised.value.reason


def payload_frame(topic: str, payload: bytes, marshaller: str = GOGO, counter: int = 1) -> NodeFrame:
    return decode_node_frame(encode_node_frame(topic, payload, counter, marshaller))


# -- Two numberings of WsMessage ---------------------------------------------------------------------


def test_node_ws_message_field_numbers():
    fields = {f.name: f.number for f in mx_node_pb2.WsMessage.DESCRIPTOR.fields}
    assert fields == {"withAcknowledge": 1, "counter": 2, "type": 3, "payload": 4, "topic": 5, "version": 6}


def test_gogo_frame_exact_bytes():
    assert encode_node_frame("SaveBlock", b"\x01", counter=1) == (
        b"\x08\x01"  # 1 withAcknowledge
        b"\x10\x01"  # 2 counter
        b"\x18\x02"  # 3 type PAYLOAD
        b"\x22\x01\x01"  # 4 payload
        b"\x2a\x09SaveBlock"  # 5 topic
        b"\x30\x01"  # 6 version
    )


def test_json_frame_exact_bytes():
    assert encode_node_frame("SaveBlock", b"\x01\x02", counter=3, marshaller=JSON) == (
        b'{"withAcknowledge":true,"counter":3,"type":2,"payload":"AQI=","topic":"SaveBlock","version":1}'
    )


@pytest.mark.parametrize("marshaller", [GOGO, JSON])
def test_decode_frame_in_either_marshalling(marshaller):
    data = encode_node_frame("FinalizedBlock", b"\x08\x01", counter=9, marshaller=marshaller)
    assert decode_node_frame(data) == NodeFrame(True, 9, 2, "FinalizedBlock", b"\x08\x01", 1, marshaller)


def test_json_frame_with_leading_whitespace_and_omitted_fields():
    frame = decode_node_frame(b' \n{"type":2,"topic":"Settings","payload":"e30="}')
    assert frame == NodeFrame(False, 0, 2, "Settings", b"{}", 0, JSON)


def test_explicit_marshaller_overrides_detection():
    data = encode_node_frame("SaveBlock", b"x", 1, GOGO)
    assert dropped(data, JSON) == UNDECODABLE


# -- Transport behaviour: receiving -------------------------------------------------------------------


def test_empty_frame_is_ignored():
    assert dropped(b"") == EMPTY_FRAME


@pytest.mark.parametrize(
    "data",
    [
        b"\xff\xff",  # not protobuf
        b"\x22\x05ab",  # truncated payload
        b"{not json",
        b"[1, 2]",
        b'{"counter": "1", "type": 2}',
        b'{"counter": -1, "type": 2}',
        b'{"type": 2, "payload": "not base64!"}',
        b'{"type": true}',
    ],
)
def test_undecodable_frames_are_dropped(data):
    assert dropped(data) == UNDECODABLE


@pytest.mark.parametrize("kind", [0, 3])
def test_type_other_than_1_or_2_is_dropped(kind):
    assert dropped(encode_node_frame("SaveBlock", b"x", 1, type=kind)) == BAD_TYPE
    assert dropped(encode_node_frame("SaveBlock", b"x", 1, JSON, type=kind)) == BAD_TYPE


def test_ack_frame_has_only_counter_and_type():
    assert node_ack_frame(5) == b"\x10\x05\x18\x01"
    assert node_ack_frame(5, JSON) == b'{"counter":5,"type":1}'
    assert decode_node_frame(node_ack_frame(300)) == NodeFrame(False, 300, 1, "", b"", 0, GOGO)


# -- Node topics and payloads ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "topic", ["SaveRoundsInfo", "SaveValidatorsPubKeys", "SaveValidatorsRating", "SaveAccounts", "Settings"]
)
def test_known_topics_without_a_stream_are_ignored(topic):
    assert handle_payload(payload_frame(topic, b"\x08\x01")) == Ignored(topic, known=True)


def test_unknown_topics_are_ignored_and_told_apart():
    assert handle_payload(payload_frame("SaveSomethingNew", b"\x08\x01")) == Ignored("SaveSomethingNew", known=False)


def test_outport_block_field_numbers():
    def numbers(message):
        return {f.name: f.number for f in message.DESCRIPTOR.fields}

    assert numbers(mx_node_pb2.OutportBlock) == {"ShardID": 1, "BlockData": 2, "TransactionPool": 3}
    assert numbers(mx_node_pb2.BlockData) == {"ShardID": 1, "HeaderBytes": 2, "HeaderType": 3, "HeaderHash": 4}
    assert numbers(mx_node_pb2.TransactionPool) == {"Transactions": 1, "SmartContractResults": 2, "Logs": 6}
    assert numbers(mx_node_pb2.LogData) == {"TxHash": 1, "Log": 2}
    assert numbers(mx_node_pb2.Log) == {"Address": 1, "Events": 2}
    assert numbers(mx_node_pb2.Event) == {"Address": 1, "Identifier": 2, "Topics": 3, "Data": 4, "AdditionalData": 5}
    assert numbers(mx_node_pb2.FinalizedBlock) == {"ShardID": 1, "HeaderHash": 2}


@pytest.mark.parametrize(
    ("value", "encoded"),
    [(0, "0000"), (1, "0001"), (-1, "0101"), (255, "00ff"), (256, "000100"), (10**18, "000de0b6b3a7640000")],
)
def test_big_int_bytes(value, encoded):
    assert big_int_bytes(value).hex() == encoded
    assert big_int_value(bytes.fromhex(encoded)) == value


def test_big_int_nil_and_bad_sign():
    assert big_int_value(b"") == 0
    assert big_int_value(b"\x00") == 0  # nil
    with pytest.raises(InvalidNodeFrame) as raised:
        big_int_value(b"\x02\x01")
    assert raised.value.reason == UNDECODABLE_PAYLOAD


@pytest.mark.parametrize(
    ("topic", "payload", "marshaller"),
    [
        ("SaveBlock", b"\xff\xff", GOGO),
        ("RevertIndexedBlock", b"\x12\x09ab", GOGO),
        ("FinalizedBlock", b"\x08", GOGO),
        ("SaveBlock", b"not json", JSON),
        ("SaveBlock", b"[]", JSON),
        ("SaveBlock", b'{"blockData": {"headerHash": "%%%"}}', JSON),
        ("SaveBlock", b'{"transactionPool": {"logs": {"a": 1}}}', JSON),
        ("SaveBlock", b'{"transactionPool": {"transactions": {"h": {"transaction": {"value": "x"}}}}}', JSON),
        ("FinalizedBlock", b'{"shardID": -1}', JSON),
    ],
)
def test_undecodable_payloads(topic, payload, marshaller):
    with pytest.raises(InvalidNodeFrame) as raised:
        handle_payload(payload_frame(topic, payload, marshaller))
    assert raised.value.reason == UNDECODABLE_PAYLOAD


# -- Normalization -------------------------------------------------------------------------------


def hand_made_block() -> mx_node_pb2.OutportBlock:
    """Two logs: a user transaction's, and an SCR's whose OriginalTxHash points back to it."""
    block = mx_node_pb2.OutportBlock(ShardID=1)
    block.BlockData.ShardID = 1
    block.BlockData.HeaderHash = BLOCK_HASH
    pool = block.TransactionPool
    tx = pool.Transactions[TX]
    tx.ExecutionOrder = 0
    tx.Transaction.CopyFrom(mx_node_pb2.Transaction(
        Nonce=7, Value=big_int_bytes(10**18), RcvAddr=ESDT_SC_KEY, SndAddr=ALICE_KEY, GasPrice=1_000_000_000,
        GasLimit=500_000, Data=b"ESDTTransfer@...",
    ))
    scr = pool.SmartContractResults[SCR]
    scr.ExecutionOrder = 1
    scr.SmartContractResult.CopyFrom(mx_node_pb2.SmartContractResult(
        Nonce=8, Value=big_int_bytes(0), RcvAddr=ALICE_KEY, SndAddr=ESDT_SC_KEY, Data=b"@6f6b",
        PrevTxHash=bytes.fromhex(TX), OriginalTxHash=bytes.fromhex(TX), GasPrice=1_000_000_000,
    ))
    first = pool.Logs.add(TxHash=TX)
    first.Log.Address = ALICE_KEY
    first.Log.Events.add(
        Address=ALICE_KEY, Identifier=b"ESDTTransfer",
        Topics=[b"WEGLD-bd4d79", b"", b"\x0d\xe0\xb6\xb3\xa7\x64\x00\x00", ESDT_SC_KEY],
    )
    first.Log.Events.add(Address=b"\x01" * 20, Identifier=b"notAnAddress")  # skipped: 20 bytes
    second = pool.Logs.add(TxHash=SCR)
    second.Log.Events.add(Address=bytes(32), Identifier=b"writeLog", Topics=[ALICE_KEY], Data=b"@6f6b")
    second.Log.Events.add(Address=ESDT_SC_KEY, Identifier=b"caf\xc3\xa9\xff")
    return block


def test_save_block_becomes_one_event_per_log_event():
    saved = normalize_save_block(hand_made_block())
    assert (saved.hash, saved.shard_id, saved.skipped_events) == (BLOCK_HASH.hex(), 1, 1)
    common = dict(block_hash=BLOCK_HASH.hex(), shard_id=1)
    assert list(saved.events) == [
        mx_hub_pb2.NormalizedEvent(
            address=ALICE, identifier="ESDTTransfer",
            topics=[b"WEGLD-bd4d79", b"", bytes.fromhex("0de0b6b3a7640000"), ESDT_SC_KEY],
            data=b"", tx_hash=TX, original_tx_hash=TX, order=0, **common,
        ),
        # order 1 was the 20-byte address: skipped, its position kept
        mx_hub_pb2.NormalizedEvent(
            address=ZERO, identifier="writeLog", topics=[ALICE_KEY], data=b"@6f6b",
            tx_hash=SCR, original_tx_hash=TX, order=2, **common,
        ),
        mx_hub_pb2.NormalizedEvent(
            address=ESDT_SC, identifier="café\ufffd", tx_hash=SCR, original_tx_hash=TX, order=3, **common,
        ),
    ]


def test_save_block_transactions_and_scrs():
    saved = normalize_save_block(hand_made_block())
    assert saved.txs == mx_hub_pb2.BlockTxs(hash=BLOCK_HASH.hex(), shard_id=1, txs=[
        mx_hub_pb2.BlockTransaction(
            hash=TX, execution_order=0, nonce=7, sender=ALICE, receiver=ESDT_SC, value="1000000000000000000",
            data=b"ESDTTransfer@...", gas_limit=500_000, gas_price=1_000_000_000,
        ),
    ])
    assert saved.scrs == mx_hub_pb2.BlockScrs(hash=BLOCK_HASH.hex(), shard_id=1, scrs=[
        mx_hub_pb2.BlockScr(
            hash=SCR, execution_order=1, nonce=8, sender=ESDT_SC, receiver=ALICE, value="0", data=b"@6f6b",
            prev_tx_hash=TX, original_tx_hash=TX, gas_price=1_000_000_000,
        ),
    ])


def test_normalization_does_not_add_map_entries():
    block = hand_made_block()
    normalize_save_block(block)
    assert set(block.TransactionPool.SmartContractResults) == {SCR}


def test_hand_made_block_through_both_marshallings():
    block = hand_made_block()
    expected = normalize_save_block(block)
    for marshaller in (GOGO, JSON):
        frame = decode_node_frame(generator.save_block_frame(block, 4, marshaller))
        assert (frame.topic, frame.counter, frame.with_acknowledge) == ("SaveBlock", 4, True)
        assert handle_payload(frame) == expected


def test_node_json_spells_bytes_as_base64_and_amounts_as_numbers():
    document = json.loads(generator.save_block_payload(hand_made_block(), JSON))
    event = document["transactionPool"]["logs"][0]["log"]["events"][0]
    assert event["identifier"] == base64.b64encode(b"ESDTTransfer").decode()
    assert event["data"] is None and event["additionalData"] is None
    assert document["transactionPool"]["transactions"][TX]["transaction"]["value"] == 10**18
    assert document["blockData"]["headerHash"] == base64.b64encode(BLOCK_HASH).decode()


def test_json_amounts_beyond_64_bits_are_exact():
    block = hand_made_block()
    block.TransactionPool.Transactions[TX].Transaction.Value = big_int_bytes(123456789012345678901234567890)
    saved = handle_payload(payload_frame("SaveBlock", generator.save_block_payload(block, JSON), JSON))
    assert saved.txs.txs[0].value == "123456789012345678901234567890"


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(min_value=0, max_value=2**32), transactions=st.integers(min_value=0, max_value=30),
       shard=st.sampled_from([0, 1, 2, generator.METACHAIN]))
def test_gogo_and_json_normalize_alike(seed, transactions, shard):
    block = generator.generate_save_block(seed, transactions, shard)
    gogo = handle_payload(payload_frame("SaveBlock", generator.save_block_payload(block, GOGO)))
    from_json = handle_payload(payload_frame("SaveBlock", generator.save_block_payload(block, JSON), JSON))
    assert isinstance(gogo, SavedBlock)
    assert gogo == from_json
    assert len(gogo.events) == sum(len(log.Log.Events) for log in block.TransactionPool.Logs)
    assert [e.order for e in gogo.events] == list(range(len(gogo.events)))
    assert all(e.shard_id == shard and e.block_hash == gogo.hash for e in gogo.events)


def test_revert_reads_the_header():
    block = generator.generate_save_block(3, 2, shard_id=2)
    info = generator.header_info(block)
    for marshaller in (GOGO, JSON):
        revert = handle_payload(decode_node_frame(generator.revert_frame(block, 1, marshaller)))
        assert revert == mx_hub_pb2.RevertEvent(
            hash=block.BlockData.HeaderHash.hex(), nonce=info.nonce, round=info.round, epoch=info.epoch,
            shard_id=2, timestamp=info.timestamp,
        )


@pytest.mark.parametrize("header_type", ["Header", "HeaderV2", "MetaBlock"])
def test_revert_header_types(header_type):
    header = mx_node_pb2.Header(Nonce=10, ShardID=1, TimeStamp=1_700_000_000, Round=11, Epoch=12)
    header_bytes = {
        "Header": header.SerializeToString(),
        "HeaderV2": mx_node_pb2.HeaderV2(Header=header).SerializeToString(),
        "MetaBlock": mx_node_pb2.MetaBlock(Nonce=10, Epoch=12, Round=11, TimeStamp=1_700_000_000).SerializeToString(),
    }[header_type]
    data = mx_node_pb2.BlockData(ShardID=1, HeaderBytes=header_bytes, HeaderType=header_type, HeaderHash=b"\xab")
    revert = handle_payload(payload_frame("RevertIndexedBlock", data.SerializeToString()))
    assert revert == mx_hub_pb2.RevertEvent(hash="ab", nonce=10, round=11, epoch=12, shard_id=1,
                                            timestamp=1_700_000_000)


@pytest.mark.parametrize(("header_type", "header_bytes"), [("HeaderV3", b"\x08\x01"), ("Header", b"\xff\xff")])
def test_revert_of_an_unreadable_header_still_names_the_block(header_type, header_bytes):
    data = mx_node_pb2.BlockData(ShardID=0, HeaderBytes=header_bytes, HeaderType=header_type, HeaderHash=b"\x01\x02")
    assert handle_payload(payload_frame("RevertIndexedBlock", data.SerializeToString())) == mx_hub_pb2.RevertEvent(
        hash="0102"
    )


@pytest.mark.parametrize("marshaller", [GOGO, JSON])
def test_finalized(marshaller):
    block = generator.generate_save_block(4, 1, shard_id=generator.METACHAIN)
    finalized = handle_payload(decode_node_frame(generator.finalized_frame(block, 1, marshaller)))
    assert finalized == mx_hub_pb2.FinalizedEvent(hash=block.BlockData.HeaderHash.hex(), shard_id=generator.METACHAIN)


# -- Generator -------------------------------------------------------------------------------------


def test_generator_is_deterministic():
    assert generator.save_block_payload(generator.generate_save_block(11, 10)) == generator.save_block_payload(
        generator.generate_save_block(11, 10)
    )
    assert generator.generate_save_block(11, 10) != generator.generate_save_block(12, 10)


def test_generator_mixes_identifiers_addresses_and_topics():
    events = [e for seed in range(5) for e in normalize_save_block(generator.generate_save_block(seed, 30)).events]
    assert {e.identifier for e in events} == set(generator.IDENTIFIERS)
    assert len({e.address for e in events}) > 10
    esdt = [e for e in events if e.identifier == "ESDTTransfer"]
    assert all(len(e.topics) == 4 and e.topics[1] == b"" and len(e.topics[3]) == 32 for e in esdt)
    assert {bytes(e.topics[0]) for e in esdt} <= set(generator.FUNGIBLE_TOKENS)
    assert any(e.original_tx_hash != e.tx_hash for e in events)  # some logs come from SCRs


def test_generated_gogo_payload_carries_undeclared_fields_that_decoding_skips():
    block = generator.generate_save_block(5, 3)
    payload = generator.save_block_payload(block)
    assert payload != block.SerializeToString(deterministic=True)
    decoded = node.decode_outport_block(payload, GOGO)
    assert normalize_save_block(decoded) == normalize_save_block(block)
    assert decoded != block  # the undeclared fields are kept as unknown fields ...
    decoded.DiscardUnknownFields()
    assert decoded == block  # ... and are all there is beyond the declared ones


# -- Transport behaviour: retries are deduplicated by block hash ---------------------------------------


def test_duplicate_within_the_window_is_suppressed():
    seen = DuplicateSuppressor(window_s=60.0)
    key = dedup_key("SaveBlock", "ab")
    assert seen.first_seen(key, now=100.0)
    assert not seen.first_seen(key, now=159.0)
    assert seen.first_seen(key, now=160.5)  # the window passed since the first sighting


def test_topics_are_deduplicated_separately():
    seen = DuplicateSuppressor()
    assert seen.first_seen(dedup_key("SaveBlock", "ab"), 0.0)
    assert seen.first_seen(dedup_key("RevertIndexedBlock", "ab"), 0.0)
    assert seen.first_seen(dedup_key("FinalizedBlock", "ab"), 0.0)
    assert not seen.first_seen(dedup_key("SaveBlock", "ab"), 1.0)


def test_expired_keys_are_dropped_from_memory():
    seen = DuplicateSuppressor(window_s=10.0)
    for i in range(5):
        seen.first_seen(f"k{i}", now=float(i))
    assert len(seen) == 5
    seen.first_seen("later", now=13.0)  # k0..k3 are 10 s old or more
    assert len(seen) == 2


def test_memory_is_bounded_and_the_oldest_goes_first():
    seen = DuplicateSuppressor(window_s=1e9, max_entries=3)
    for key in ("a", "b", "c", "d"):
        assert seen.first_seen(key, 0.0)
    assert len(seen) == 3
    assert seen.first_seen("a", 0.0)  # forgotten early: a duplicate this old passes
    assert not seen.first_seen("d", 0.0)


def test_forget_lets_a_retry_through():
    seen = DuplicateSuppressor()
    assert seen.first_seen("x", 0.0)
    seen.forget("x")
    seen.forget("never-seen")
    assert seen.first_seen("x", 1.0)


def test_a_retried_block_under_a_new_counter_is_recognised():
    block = generator.generate_save_block(6, 2)
    seen = DuplicateSuppressor()
    outcomes = []
    for counter in (1, 2):
        saved = handle_payload(decode_node_frame(generator.save_block_frame(block, counter)))
        outcomes.append(seen.first_seen(dedup_key("SaveBlock", saved.hash), now=float(counter)))
    assert outcomes == [True, False]
