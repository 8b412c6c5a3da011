"""gateways/mx/codec.py: the hub's WsMessage frames and the subscribe payload (mx-notifier-hub.md).

Sections follow the spec: frame format, message types, acknowledgement, frame validation rules,
subscribing (and the SubscribeEvent structure of the spec's filtering page).
"""

from __future__ import annotations

import base64

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.mx.match import Subscription
from gateways.mx import codec
from gateways.mx.codec import (
    ACK,
    BAD_TYPE,
    BAD_VERSION,
    EMPTY_FRAME,
    EMPTY_PAYLOAD,
    INVALID_ADDRESS,
    INVALID_TOPIC,
    MISSING_ADDRESS,
    MISSING_IDENTIFIER,
    MISSING_TOPIC,
    MISSING_TOPICS,
    PAYLOAD,
    TOO_LONG,
    TOO_MANY_TOPICS,
    UNDECODABLE,
    UNDECODABLE_SUBSCRIBE,
    UNKNOWN_MATCH_LEVEL,
    Frame,
    InvalidFrame,
    InvalidSubscription,
    ack_frame,
    decode_frame,
    encode_frame,
    frame_tail,
    frame_with_tail,
    parse_subscribe,
    payload_frame,
    subscribe_payload,
    validate,
)
from gateways.mx.pb import mx_hub_pb2

ALICE = "erd1qyu5wthldzr8wx5c9ucg8kjagg0jfs53s8nr3zpz3hypefsdd8ssycr6th"
ESDT_SC = "erd1qqqqqqqqqqqqqqqpqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqzllls8a5w6u"


def dropped(data: bytes) -> str:
    with pytest.raises(InvalidFrame) as raised:
        decode_frame(data)
    return raised.value.reason


def refused(payload: bytes, **limits) -> InvalidSubscription:
    with pytest.raises(InvalidSubscription) as raised:
        parse_subscribe(payload, **limits)
    return raised.value


# -- Frame format -----------------------------------------------------------------------------------


def test_ws_message_field_numbers_are_the_specs():
    fields = {f.name: (f.number, f.type) for f in mx_hub_pb2.WsMessage.DESCRIPTOR.fields}
    d = mx_hub_pb2.WsMessage.DESCRIPTOR.fields_by_name["version"]
    assert fields == {
        "version": (1, d.TYPE_UINT32),
        "with_acknowledge": (2, d.TYPE_BOOL),
        "counter": (3, d.TYPE_UINT64),
        "type": (4, d.TYPE_INT32),
        "topic": (5, d.TYPE_STRING),
        "payload": (6, d.TYPE_BYTES),
    }


def test_payload_frame_exact_bytes():
    assert payload_frame(42, "all_events", b"\x01\x02", with_acknowledge=True) == (
        b"\x08\x01"  # 1 version = 1
        b"\x10\x01"  # 2 with_acknowledge = true
        b"\x18\x2a"  # 3 counter = 42
        b"\x20\x02"  # 4 type = PAYLOAD
        b"\x2a\x0aall_events"  # 5 topic
        b"\x32\x02\x01\x02"  # 6 payload
    )


def test_payload_frame_without_acknowledge_omits_field_2():
    assert payload_frame(300, "t", b"x") == b"\x08\x01\x18\xac\x02\x20\x02\x2a\x01t\x32\x01x"


def test_decode_payload_frame():
    frame = decode_frame(payload_frame(7, "subscribe", b"\x0a\x03All", with_acknowledge=True))
    assert frame == Frame(version=1, with_acknowledge=True, counter=7, type=PAYLOAD, topic="subscribe",
                          payload=b"\x0a\x03All")
    assert not frame.is_ack


def test_decode_skips_unknown_fields():
    # field 9, varint 5: a newer peer's field is ignored, the frame still valid
    frame = decode_frame(payload_frame(1, "subscribe", b"x") + b"\x48\x05")
    assert (frame.topic, frame.payload) == ("subscribe", b"x")


@given(
    counter=st.integers(min_value=0, max_value=2**64 - 1),
    topic=st.text(min_size=1, max_size=40),
    payload=st.binary(min_size=1, max_size=300),
    with_acknowledge=st.booleans(),
)
def test_frame_with_tail_equals_the_protobuf_encoding(counter, topic, payload, with_acknowledge):
    tail = frame_tail(topic, payload)
    built = frame_with_tail(counter, tail, with_acknowledge)
    assert built == payload_frame(counter, topic, payload, with_acknowledge)
    assert decode_frame(built) == Frame(1, with_acknowledge, counter, PAYLOAD, topic, payload)


@pytest.mark.parametrize("length", [0, 1, 127, 128, 16383, 16384, 2**21 - 1, 2**21])
@pytest.mark.parametrize("topic", ["", "all_events", "t" * 127, "t" * 128, "é"])
def test_a_tail_is_what_protobuf_writes_at_each_length_edge(length, topic):
    payload = bytes(range(256)) * (length // 256) + bytes(length % 256)
    assert frame_tail(topic, payload) == mx_hub_pb2.WsMessage(type=PAYLOAD, topic=topic, payload=payload).SerializeToString()


@pytest.mark.parametrize("counter", [0, 1, 127, 128, 129, 16383, 16384, 2**21 - 1, 2**21])
@pytest.mark.parametrize("with_acknowledge", [False, True])
def test_frame_head_at_each_varint_boundary(counter, with_acknowledge):
    tail = frame_tail("all_events", b"event")
    assert frame_with_tail(counter, tail, with_acknowledge) == payload_frame(counter, "all_events", b"event",
                                                                             with_acknowledge)


def test_one_tail_serves_many_counters():
    tail = frame_tail("all_events", b"event")
    frames = [frame_with_tail(counter, tail) for counter in (1, 2, 128)]
    assert [decode_frame(f).counter for f in frames] == [1, 2, 128]
    assert all(f.endswith(tail) for f in frames)


# -- Message types / Acknowledgement -----------------------------------------------------------------


def test_ack_frame_carries_the_counter_and_nothing_else():
    assert ack_frame(42) == b"\x08\x01\x18\x2a\x20\x01"
    frame = decode_frame(ack_frame(42))
    assert frame == Frame(1, False, 42, ACK, "", b"")
    assert frame.is_ack


def test_ack_with_version_0_is_accepted():
    # what a node-style ACK looks like: counter and type only
    assert decode_frame(b"\x18\x2a\x20\x01") == Frame(0, False, 42, ACK, "", b"")


def test_ack_with_a_topic_or_payload_is_accepted_and_they_are_ignored_by_the_caller():
    frame = decode_frame(encode_frame(ACK, 3, topic="x", payload=b"y", version=0))
    assert frame.is_ack and frame.counter == 3


# -- Frame validation rules ------------------------------------------------------------------------


def test_empty_frame_is_dropped():
    assert dropped(b"") == EMPTY_FRAME


@pytest.mark.parametrize("data", [b"\xff", b"\x0a", b"\x2a\x05ab", b"\x08"])
def test_undecodable_bytes_are_dropped(data):
    assert dropped(data) == UNDECODABLE


def test_invalid_utf8_topic_is_undecodable():
    assert dropped(b"\x08\x01\x20\x02\x2a\x01\xff\x32\x01\x00") == UNDECODABLE


@pytest.mark.parametrize("kind", [0, 3, -1, 100])
def test_type_other_than_ack_or_payload_is_dropped(kind):
    assert dropped(encode_frame(kind, 1, "subscribe", b"x")) == BAD_TYPE


def test_payload_with_version_0_is_dropped():
    assert dropped(encode_frame(PAYLOAD, 1, "subscribe", b"x", version=0)) == BAD_VERSION


def test_payload_with_a_later_version_is_accepted():
    assert decode_frame(encode_frame(PAYLOAD, 1, "subscribe", b"x", version=2)).version == 2


def test_payload_without_topic_is_dropped():
    assert dropped(encode_frame(PAYLOAD, 1, "", b"x")) == MISSING_TOPIC


def test_payload_without_payload_is_dropped():
    assert dropped(encode_frame(PAYLOAD, 1, "subscribe", b"")) == EMPTY_PAYLOAD


def test_validate_returns_the_first_failing_rule_or_none():
    assert validate(Frame(1, False, 1, PAYLOAD, "t", b"p")) is None
    assert validate(Frame(0, False, 1, ACK, "", b"")) is None
    assert validate(Frame(0, False, 1, 7, "", b"")) == BAD_TYPE
    assert validate(Frame(0, False, 1, PAYLOAD, "", b"")) == BAD_VERSION
    assert validate(Frame(1, False, 1, PAYLOAD, "", b"")) == MISSING_TOPIC


# -- Subscribing -------------------------------------------------------------------------------------


def test_subscribe_event_field_numbers_are_the_specs():
    fields = {f.name: (f.number, f.is_repeated)
              for f in mx_hub_pb2.SubscribeEvent.DESCRIPTOR.fields}
    assert fields == {"event_type": (1, False), "address": (2, False), "identifier": (3, False),
                      "topics": (4, True)}
    assert all(f.type == f.TYPE_STRING for f in mx_hub_pb2.SubscribeEvent.DESCRIPTOR.fields)


def test_subscribe_payload_exact_bytes():
    token = base64.b64encode(b"WEGLD-bd4d79")  # b"V0VHTEQtYmQ0ZDc5"
    assert subscribe_payload("Topics", ALICE, "ESDTTransfer", [b"WEGLD-bd4d79", None]) == (
        b"\x0a\x06Topics"
        + b"\x12\x3e" + ALICE.encode()
        + b"\x1a\x0cESDTTransfer"
        + b"\x22\x10" + token
        + b"\x22\x00"
    )


def test_the_js_example_all_subscription():
    frame = decode_frame(payload_frame(1, "subscribe", subscribe_payload("All")))
    assert frame.topic == codec.SUBSCRIBE_TOPIC
    assert parse_subscribe(frame.payload) == Subscription("All")


def test_all_keeps_no_fields():
    assert parse_subscribe(subscribe_payload("All", ALICE, "x", [b"t"])) == Subscription("All")


def test_address_level():
    assert parse_subscribe(subscribe_payload("Address", ALICE, "ignored", [b"t"])) == Subscription("Address", ALICE)


def test_address_is_normalised_to_lower_case():
    assert parse_subscribe(subscribe_payload("Address", ALICE.upper())) == Subscription("Address", ALICE)


def test_identifier_level():
    assert parse_subscribe(subscribe_payload("Identifier", "", "ESDTTransfer")) == Subscription(
        "Identifier", None, "ESDTTransfer"
    )


def test_address_identifier_level():
    assert parse_subscribe(subscribe_payload("AddressIdentifier", ESDT_SC, "ESDTTransfer", [b"t"])) == Subscription(
        "AddressIdentifier", ESDT_SC, "ESDTTransfer"
    )


def test_topics_level_decodes_base64_and_empty_is_a_wildcard():
    payload = subscribe_payload("Topics", ALICE, "ESDTTransfer", [b"WEGLD-bd4d79", None, b"\x00\xff"])
    assert parse_subscribe(payload) == Subscription(
        "Topics", ALICE, "ESDTTransfer", (b"WEGLD-bd4d79", None, b"\x00\xff")
    )


def test_topics_without_padding_are_accepted():
    payload = mx_hub_pb2.SubscribeEvent(
        event_type="Topics", address=ALICE, identifier="i", topics=["V0VHTEQtYmQ0ZDc5", "AQ"]
    ).SerializeToString()
    assert parse_subscribe(payload).topics == (b"WEGLD-bd4d79", b"\x01")


@pytest.mark.parametrize("level", ["all", "ALL", "Topic", "", "Address "])
def test_unknown_match_level(level):
    assert refused(subscribe_payload(level, ALICE, "i", [b"t"])).reason == UNKNOWN_MATCH_LEVEL


@pytest.mark.parametrize("level", ["Address", "AddressIdentifier", "Topics"])
def test_levels_that_need_an_address(level):
    assert refused(subscribe_payload(level, "", "i", [b"t"])).reason == MISSING_ADDRESS


@pytest.mark.parametrize(
    "address",
    [
        ALICE[:-1] + ("q" if ALICE[-1] != "q" else "p"),  # checksum
        "moa1qyu5wthldzr8wx5c9ucg8kjagg0jfs53s8nr3zpz3hypefsdd8ssycr6th",  # another HRP
        "0139472eff6886771a982f3083da5d421f24c29181e63888228dc81ca60d69e1",  # hex
        ALICE[:20] + ALICE[20:].upper(),  # mixed case
    ],
)
def test_invalid_address(address):
    assert refused(subscribe_payload("Address", address)).reason == INVALID_ADDRESS


@pytest.mark.parametrize("level", ["Identifier", "AddressIdentifier", "Topics"])
def test_levels_that_need_an_identifier(level):
    assert refused(subscribe_payload(level, ALICE, "", [b"t"])).reason == MISSING_IDENTIFIER


def test_topics_level_needs_topics():
    assert refused(subscribe_payload("Topics", ALICE, "i", [])).reason == MISSING_TOPICS


@pytest.mark.parametrize("text", ["not base64!", "QQ=Q", "Q", "V0VH-EQ"])
def test_topic_that_is_not_base64(text):
    payload = mx_hub_pb2.SubscribeEvent(event_type="Topics", address=ALICE, identifier="i",
                                        topics=["", text]).SerializeToString()
    error = refused(payload)
    assert error.reason == INVALID_TOPIC
    assert "topics[1]" in error.message


def test_limits():
    assert refused(subscribe_payload("Topics", ALICE, "i", [b"t"] * 3), max_topics=2).reason == TOO_MANY_TOPICS
    assert refused(subscribe_payload("Identifier", "", "x" * 9), max_field_length=8).reason == TOO_LONG
    assert refused(subscribe_payload("Topics", ALICE, "i", [b"x" * 9]), max_field_length=8).reason == TOO_LONG
    assert parse_subscribe(subscribe_payload("Topics", ALICE, "i", [b"t"] * 2), max_topics=2).topics == (b"t", b"t")


def test_undecodable_subscribe_payload():
    assert refused(b"\x0a\x05Al").reason == UNDECODABLE_SUBSCRIBE


@given(
    st.sampled_from(["Address", "Identifier", "AddressIdentifier", "Topics"]),
    st.text(min_size=1, max_size=30),
    st.lists(st.one_of(st.none(), st.binary(min_size=1, max_size=20)), min_size=1, max_size=6),
)
def test_subscribe_payload_round_trip(level, identifier, topics):
    subscription = parse_subscribe(subscribe_payload(level, ALICE, identifier, topics))
    assert subscription.level == level
    assert subscription.address == (ALICE if level != "Identifier" else None)
    assert subscription.identifier == (identifier if level != "Address" else None)
    assert subscription.topics == (tuple(topics) if level == "Topics" else ())
