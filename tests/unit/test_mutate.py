"""tests/security/mutate.py: the hostile-client suite's mutation fuzzer is reproducible and makes
the frames its attacks are named after."""

from __future__ import annotations

import json

import msgpack
import pytest

from tests.security.mutate import (
    JSON, MSGPACK, OPERATIONS, PROTOBUF, Mutator, Seed, _pb_key, _pb_locations, _pb_parse, _pb_replace, _varint,
)

JSON_SEEDS = [Seed(json.dumps(message).encode(), True) for message in (
    {"type": "hub:register", "from": "a/b", "payload": {"tags": ["x", "y"], "n": 1}},
    {"jsonrpc": "2.0", "id": 1, "method": "heartbeat"},
)]
MSGPACK_SEEDS = [Seed(msgpack.packb({"type": "publish", "topic": "a/b/c", "data": {"x": b"\x00"}, "qos": 1},
                                    use_bin_type=True), False)]
# WsMessage{version: 1, counter: 3, type: 2, topic: "subscribe", payload: SubscribeEvent{event_type: "All"}}
INNER = _pb_key(1, 2) + _varint(3) + b"All"
PROTOBUF_SEEDS = [Seed(_pb_key(1, 0) + _varint(1) + _pb_key(3, 0) + _varint(3) + _pb_key(4, 0) + _varint(2)
                       + _pb_key(5, 2) + _varint(9) + b"subscribe" + _pb_key(6, 2) + _varint(len(INNER)) + INNER,
                       False)]
CODECS = [(JSON, JSON_SEEDS), (MSGPACK, MSGPACK_SEEDS), (PROTOBUF, PROTOBUF_SEEDS)]


@pytest.mark.parametrize("codec, seeds", CODECS, ids=[codec for codec, _ in CODECS])
def test_the_same_seed_makes_the_same_frames_and_every_operation_is_used(codec, seeds):
    first, second = Mutator(seeds, codec, 7), Mutator(seeds, codec, 7)
    frames = [first.next() for _ in range(3000)]
    assert frames == [second.next() for _ in range(3000)]
    assert frames != [Mutator(seeds, codec, 8).next() for _ in range(3000)]
    assert {frame.op.split("+")[0] for frame in frames} == {name for name, _ in OPERATIONS}
    for frame in frames:
        if frame.text:  # a client library sends only valid UTF-8 as text
            frame.payload.decode("utf-8")
        assert 1 <= frame.fragments <= 4


def test_retyped_json_stays_json_with_another_value_somewhere():
    mutator = Mutator(JSON_SEEDS, JSON, 1)
    for _ in range(200):
        payload = mutator._structured("retype", JSON_SEEDS[0].payload)
        if b"1e999" in payload or b"NaN" in payload or b"-0" in payload or b"0.0e0" in payload:
            continue  # numbers a JSON library would not write: the point is to send them
        assert json.loads(payload) != json.loads(JSON_SEEDS[0].payload)


def test_values_inside_a_string_holding_json_are_replaced_too():
    seed = Seed(json.dumps({"id": "s", "query": json.dumps({"n": {"$in": [1, 2]}})}).encode(), True)
    mutator = Mutator([seed], JSON, 2)
    queries = set()
    for _ in range(300):
        frame = mutator.nested(40)
        query = json.loads(frame.payload)["query"]
        if isinstance(query, str) and "[" * 40 in query:
            queries.add(query)
    assert queries  # the nesting went into the query's JSON, which stays a string


@pytest.mark.parametrize("codec, seeds, level", [
    (JSON, JSON_SEEDS, (b"[", b'{"a":')), (MSGPACK, MSGPACK_SEEDS, (b"\x91", b"\x81\xa1a")),
    (PROTOBUF, PROTOBUF_SEEDS, (b"\x7b",)),
], ids=[JSON, MSGPACK, PROTOBUF])
def test_nested_writes_the_levels_without_recursing(codec, seeds, level):
    mutator = Mutator(seeds, codec, 3)
    for depth in (33, 10_000):
        frame = mutator.nested(depth)
        assert frame.op == f"nested_{depth}"
        assert any(one * depth in frame.payload for one in level), frame.payload[:80]


@pytest.mark.parametrize("codec, seeds", CODECS, ids=[codec for codec, _ in CODECS])
def test_oversized_is_exactly_the_size_asked_and_still_well_formed(codec, seeds):
    mutator = Mutator(seeds, codec, 5)
    for size in (1 << 20, (1 << 20) + 1, 70_000):
        frame = mutator.oversized(size)
        assert len(frame.payload) == size
        if codec == JSON:
            assert json.loads(frame.payload)["fuzzPad"]
        elif codec == MSGPACK:
            assert msgpack.unpackb(frame.payload, raw=False)["fuzzPad"]
        else:
            assert _pb_parse(frame.payload)[-1].number == 15


def test_invalid_utf8_is_sent_as_text_and_is_not_utf8():
    mutator = Mutator(JSON_SEEDS, JSON, 9)
    for _ in range(50):
        frame = mutator.invalid_utf8()
        assert frame.text
        with pytest.raises(UnicodeDecodeError):
            frame.payload.decode("utf-8")


def test_protobuf_fields_are_found_at_every_depth_and_replaced_with_lengths_rewritten():
    payload = PROTOBUF_SEEDS[0].payload
    assert [(field.number, field.wire) for field in _pb_parse(payload)] == [(1, 0), (3, 0), (4, 0), (5, 2), (6, 2)]
    assert _pb_locations(payload) == [(0,), (1,), (2,), (3,), (4,), (4, 0)]  # (4, 0): event_type, inside payload
    replaced = _pb_replace(payload, (4, 0), lambda field: _pb_key(1, 2) + _varint(4) + b"Evil")
    inner = _pb_parse(_pb_parse(replaced)[4].value)
    assert [(field.number, field.value) for field in inner] == [(1, b"Evil")]
    assert _pb_replace(payload, (2,), lambda field: field.raw) == payload
    assert _pb_parse(b"\x08") is None and _pb_parse(b"\x0a\x05ab") is None  # cut short
