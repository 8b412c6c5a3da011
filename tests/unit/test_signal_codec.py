"""gateways/signal/codec.py: Signal Hub envelopes in and out, and the payload field readers."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateways.signal import codec
from gateways.signal.codec import (
    INTERNAL_ERROR,
    MESSAGE_TYPES,
    Request,
    SignalError,
    address_field,
    clamped_int_field,
    decode,
    encode,
    encode_error,
    fit,
    int_field,
    invalid,
    is_expired,
    normalize_address,
    object_field,
    string_field,
    string_list_field,
)

ADDRESS_HINT = "must be an address matching ^[a-z0-9-]+/[a-z0-9-]+$"


def message(**fields) -> bytes:
    return orjson.dumps(fields)


def refused(data: bytes) -> SignalError:
    with pytest.raises(SignalError) as raised:
        decode(data)
    return raised.value


def refused_field(reader, *args, **kwargs) -> SignalError:
    with pytest.raises(SignalError) as raised:
        reader(*args, **kwargs)
    return raised.value


# -- decode: valid messages -----------------------------------------------------------------


def test_decode_full_envelope():
    data = message(type="hub:send", **{"from": "rt/a"}, to="@(rt/b)", payload={"x": [1, 2]},
                   id="m1", timestamp=1_000, ttl=500)
    assert decode(data) == Request(
        type="hub:send",
        sender="rt/a",
        to="rt/b",
        payload={"x": [1, 2]},
        reply_id="m1",
        timestamp=1_000,
        ttl=500,
        raw=data,
    )
    assert decode(data).raw is data


def test_decode_minimal_envelope():
    request = decode(b'{"type":"hub:heartbeat","from":"@(rt/a)"}')
    assert request.type == "hub:heartbeat"
    assert request.sender == "rt/a"
    assert request.to is None
    assert request.payload == {}
    assert request.reply_id is None
    assert request.timestamp is None
    assert request.ttl is None


def test_decode_null_payload_and_to():
    request = decode(b'{"type":"hub:heartbeat","from":"rt/a","to":null,"payload":null}')
    assert request.to is None
    assert request.payload == {}


@pytest.mark.parametrize("kind", sorted(MESSAGE_TYPES))
def test_every_message_type_is_accepted(kind):
    assert decode(message(type=kind, **{"from": "rt/a"})).type == kind


def test_message_types():
    assert MESSAGE_TYPES == {
        "hub:connect", "hub:heartbeat", "hub:disconnect", "hub:register", "hub:unregister", "hub:renew",
        "hub:discover", "hub:list_actors", "hub:send", "hub:broadcast", "hub:subscribe", "hub:publish",
        "hub:unsubscribe", "hub:queue_stats",
    }


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("rt/a", "rt/a"),
        ("a-1/b-2", "a-1/b-2"),
        ("0/9", "0/9"),
        ("@(rt/a)", "rt/a"),
        ("@(a-1/b-2)", "a-1/b-2"),
        ("RT/a", None),
        ("rt/A", None),
        ("rt/a_b", None),
        ("rt/a/b", None),
        ("rt", None),
        ("/a", None),
        ("rt/", None),
        ("", None),
        ("rt/a\n", None),
        (" rt/a", None),
        ("@(rt/a", None),
        ("@(rt/ab", None),  # not "rt/a": only a closed @( ... ) is unwrapped
        ("@rt/a)", None),
        ("(rt/a)", None),
        ("@()", None),
        ("@(@(rt/a))", None),
        (5, None),
        (None, None),
        (["rt/a"], None),
    ],
)
def test_normalize_address(value, expected):
    assert normalize_address(value) == expected


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"correlationId": "c", "id": "i"}, "c"),
        ({"id": "i"}, "i"),
        ({"correlationId": None, "id": "i"}, "i"),
        ({"id": 7}, 7),
        ({"id": 0}, 0),
        ({"id": 1.5}, 1.5),
        ({"id": "x" * 256}, "x" * 256),
        ({"id": "x" * 257}, None),  # too long to echo back
        ({"id": True}, None),  # a boolean is not a number
        ({"id": {"a": 1}}, None),
        ({"id": [1]}, None),
        ({}, None),
    ],
)
def test_reply_id(fields, expected):
    assert decode(message(type="hub:heartbeat", **{"from": "rt/a"}, **fields)).reply_id == expected


# -- decode: refusals -----------------------------------------------------------------------


@pytest.mark.parametrize("data", [b"{", b"", b"{'a': 1}", b'{"type":}', b"\xff\xfe"])
def test_malformed_json(data):
    error = refused(data)
    assert error.code == INTERNAL_ERROR == "internal_error"
    assert error.message.startswith("Malformed JSON: ")
    assert len(error.message) > len("Malformed JSON: ")
    assert error.details == {"reason": "parse_error"}
    assert error.reply_id is None
    assert error.reply_to is None


@pytest.mark.parametrize("data", [b"[]", b'"hub:connect"', b"1", b"null", b"true"])
def test_not_an_object(data):
    error = refused(data)
    assert error.code == "internal_error"
    assert error.message == "A message must be a JSON object"
    assert error.details == {"reason": "invalid_message"}
    assert error.reply_id is None
    assert error.reply_to is None


@pytest.mark.parametrize("fields", [{}, {"type": 5}, {"type": None}, {"type": ["hub:send"]}])
def test_type_must_be_a_string(fields):
    error = refused(message(**{"from": "@(rt/a)"}, id="m1", **fields))
    assert error.code == "internal_error"
    assert error.message == "Message 'type' must be a string"
    assert error.details == {"reason": "invalid_message"}
    assert error.reply_id == "m1"
    assert error.reply_to == "rt/a"


def test_unknown_type():
    error = refused(message(type="hub:nope", **{"from": "rt/a"}, correlationId=9))
    assert error.code == "internal_error"
    assert error.message == "Unknown message type: hub:nope"
    assert error.details == {"reason": "unknown_type", "type": "hub:nope"}
    assert error.reply_id == 9
    assert error.reply_to == "rt/a"


def test_unknown_type_is_truncated_to_64_characters():
    error = refused(message(type="x" * 100, **{"from": "rt/a"}))
    assert error.message == "Unknown message type: " + "x" * 64
    assert error.details == {"reason": "unknown_type", "type": "x" * 64}


def test_unknown_type_is_reported_before_a_bad_sender():
    error = refused(message(type="hub:nope", **{"from": "BAD"}, id="m1"))
    assert error.details["reason"] == "unknown_type"
    assert error.reply_to is None


@pytest.mark.parametrize("sender", [None, "BAD", "rt", 5, "@(rt/a"])
def test_invalid_from(sender):
    fields = {"type": "hub:send", "id": "m1"}
    if sender is not None:
        fields["from"] = sender
    error = refused(orjson.dumps(fields))
    assert error.code == "internal_error"
    assert error.message == "'from' " + ADDRESS_HINT
    assert error.details == {"reason": "invalid_address", "field": "from"}
    assert error.reply_id == "m1"
    assert error.reply_to is None


@pytest.mark.parametrize("to", ["BAD", "", 5, ["rt/b"], "@(rt/b"])
def test_invalid_to(to):
    error = refused(message(type="hub:send", **{"from": "rt/a"}, to=to, id="m1"))
    assert error.code == "internal_error"
    assert error.message == "'to' " + ADDRESS_HINT
    assert error.details == {"reason": "invalid_address", "field": "to"}
    assert error.reply_id == "m1"
    assert error.reply_to == "rt/a"


@pytest.mark.parametrize("payload", [[], "x", 1, True])
def test_payload_must_be_an_object(payload):
    error = refused(message(type="hub:send", **{"from": "rt/a"}, payload=payload, id="m1"))
    assert error.code == "internal_error"
    assert error.message == "'payload' must be a JSON object"
    assert error.details == {"reason": "invalid_message", "field": "payload"}
    assert error.reply_id == "m1"
    assert error.reply_to == "rt/a"


@pytest.mark.parametrize("timestamp", ["now", True, [1], {"ms": 1}])
def test_bad_timestamp(timestamp):
    error = refused(message(type="hub:send", **{"from": "rt/a"}, timestamp=timestamp, id="m1"))
    assert error.code == "internal_error"
    assert error.message == "'timestamp' must be epoch milliseconds"
    assert error.details == {"reason": "invalid_message", "field": "timestamp"}
    assert error.reply_id == "m1"
    assert error.reply_to == "rt/a"


@pytest.mark.parametrize("ttl", [0, -1, -0.5, "5", True, [5]])
def test_bad_ttl(ttl):
    error = refused(message(type="hub:send", **{"from": "rt/a"}, ttl=ttl, id="m1"))
    assert error.code == "internal_error"
    assert error.message == "'ttl' must be a positive number of milliseconds"
    assert error.details == {"reason": "invalid_message", "field": "ttl"}
    assert error.reply_to == "rt/a"


def test_fractional_timestamp_and_ttl_are_accepted():
    request = decode(message(type="hub:send", **{"from": "rt/a"}, timestamp=1.5, ttl=0.25))
    assert (request.timestamp, request.ttl) == (1.5, 0.25)


def test_signal_error_fields():
    error = SignalError("rate_limited", "slow down", {"retryAfterMs": 5}, "m1", "rt/a")
    assert error.args == ("rate_limited", "slow down")
    assert (error.code, error.message, error.details, error.reply_id, error.reply_to) == (
        "rate_limited", "slow down", {"retryAfterMs": 5}, "m1", "rt/a"
    )
    bare = SignalError("timeout", "late")
    assert (bare.details, bare.reply_id, bare.reply_to) == (None, None, None)


def test_invalid_helper():
    error = invalid("bad")
    assert (error.code, error.message, error.details) == ("internal_error", "bad", {"reason": "invalid_message"})
    error = invalid("bad", "invalid_address", field="payload.x")
    assert error.details == {"reason": "invalid_address", "field": "payload.x"}
    assert error.reply_id is None and error.reply_to is None


# -- expiry ---------------------------------------------------------------------------------


def test_is_expired():
    request = decode(message(type="hub:send", **{"from": "rt/a"}, timestamp=1_000, ttl=500))
    assert is_expired(request, 1_499) is False
    assert is_expired(request, 1_500) is False  # expires strictly after timestamp + ttl
    assert is_expired(request, 1_501) is True


def test_is_expired_needs_timestamp_and_ttl():
    no_ttl = decode(message(type="hub:send", **{"from": "rt/a"}, timestamp=1_000))
    no_timestamp = decode(message(type="hub:send", **{"from": "rt/a"}, ttl=500))
    assert is_expired(no_ttl, 10**15) is False
    assert is_expired(no_timestamp, 10**15) is False


# -- encode ---------------------------------------------------------------------------------


def test_encode_exact_bytes():
    assert encode("hub:connected", "cloudflare/signal-hub", "rt/a", {"sessionId": "s1"}, "m1") == (
        b'{"type":"hub:connected","from":"cloudflare/signal-hub","to":"rt/a",'
        b'"payload":{"sessionId":"s1"},"correlationId":"m1"}'
    )


def test_encode_without_reply_id_or_to():
    assert encode("hub:message", "rt/a", None, {}) == (
        b'{"type":"hub:message","from":"rt/a","to":null,"payload":{}}'
    )


def test_encode_keeps_falsy_reply_ids():
    assert encode("hub:ack", "rt/a", "rt/b", {}, 0).endswith(b',"correlationId":0}')
    assert encode("hub:ack", "rt/a", "rt/b", {}, "").endswith(b',"correlationId":""}')


def test_encode_error_exact_bytes():
    assert encode_error("cloudflare/signal-hub", "rt/a", "unknown_actor", "Actor rt/b not found",
                        {"actorAddress": "rt/b"}, "m1") == (
        b'{"type":"hub:error","from":"cloudflare/signal-hub","to":"rt/a",'
        b'"payload":{"code":"unknown_actor","message":"Actor rt/b not found",'
        b'"details":{"actorAddress":"rt/b"}},"correlationId":"m1"}'
    )


def test_encode_error_without_details():
    expected = (
        b'{"type":"hub:error","from":"hub/x","to":null,"payload":{"code":"timeout","message":"late"}}'
    )
    assert encode_error("hub/x", None, "timeout", "late") == expected
    assert encode_error("hub/x", None, "timeout", "late", {}) == expected


def test_encode_then_decode():
    data = encode("hub:send", "rt/a", "rt/b", {"n": 1}, "c1")
    request = decode(data)
    assert (request.type, request.sender, request.to, request.payload, request.reply_id) == (
        "hub:send", "rt/a", "rt/b", {"n": 1}, "c1"
    )


# -- payload field readers ------------------------------------------------------------------


def test_address_field():
    assert address_field({"actorAddress": "@(rt/b)"}, "actorAddress") == "rt/b"
    assert address_field({}, "actorAddress", default="rt/d") == "rt/d"
    assert address_field({"actorAddress": "rt/e"}, "actorAddress", default="rt/d") == "rt/e"


@pytest.mark.parametrize("payload", [{}, {"actorAddress": "BAD"}, {"actorAddress": 3}, {"actorAddress": None}])
def test_address_field_refusals(payload):
    error = refused_field(address_field, payload, "actorAddress")
    assert error.code == "internal_error"
    assert error.message == "payload.actorAddress " + ADDRESS_HINT
    assert error.details == {"reason": "invalid_address", "field": "payload.actorAddress"}


def test_string_field():
    assert string_field({"topic": "news"}, "topic", 5) == "news"
    assert string_field({"topic": "x" * 5}, "topic", 5) == "x" * 5
    assert string_field({}, "topic", 5, required=False) is None
    assert string_field({"topic": None}, "topic", 5, required=False) is None


@pytest.mark.parametrize(
    ("payload", "required"),
    [({}, True), ({"topic": ""}, True), ({"topic": "x" * 6}, True), ({"topic": 5}, True),
     ({"topic": ""}, False), ({"topic": 5}, False)],
)
def test_string_field_refusals(payload, required):
    error = refused_field(string_field, payload, "topic", 5, required=required)
    assert error.code == "internal_error"
    assert error.message == "payload.topic must be a non-empty string of at most 5 characters"
    assert error.details == {"reason": "invalid_message", "field": "payload.topic"}


def test_int_field():
    assert int_field({}, "limit", 10, 1, 100) == 10
    assert int_field({"limit": None}, "limit", 10, 1, 100) == 10
    assert int_field({"limit": 1}, "limit", 10, 1, 100) == 1
    assert int_field({"limit": 100}, "limit", 10, 1, 100) == 100
    value = int_field({"limit": 5.0}, "limit", 10, 1, 100)
    assert value == 5 and type(value) is int


@pytest.mark.parametrize("value", [0, 101, 2.5, True, False, "5", [5], -1])
def test_int_field_refusals(value):
    error = refused_field(int_field, {"limit": value}, "limit", 10, 1, 100)
    assert error.code == "internal_error"
    assert error.message == "payload.limit must be an integer from 1 to 100"
    assert error.details == {"reason": "invalid_message", "field": "payload.limit"}


def test_clamped_int_field():
    assert clamped_int_field({}, "limit", 10, 1, 100) == 10
    assert clamped_int_field({"limit": 1}, "limit", 10, 1, 100) == 1
    assert clamped_int_field({"limit": 100}, "limit", 10, 1, 100) == 100
    # Above the maximum it is the maximum (a page of discover_max_limit), not an error.
    assert clamped_int_field({"limit": 101}, "limit", 10, 1, 100) == 100
    value = clamped_int_field({"limit": 1e300}, "limit", 10, 1, 100)
    assert value == 100 and type(value) is int


@pytest.mark.parametrize("value", [0, -1, 2.5, True, "5", [5]])
def test_clamped_int_field_refusals(value):
    error = refused_field(clamped_int_field, {"limit": value}, "limit", 10, 1, 100)
    assert error.code == "internal_error"
    assert error.message == "payload.limit must be an integer of at least 1"
    assert error.details == {"reason": "invalid_message", "field": "payload.limit"}


def test_fit_keeps_the_longest_prefix_within_the_bytes():
    items = [{"a": "x" * 10}, {"b": 1}, {"c": [1, 2]}]  # 18, 7 and 11 bytes
    assert len(orjson.dumps(items)) == 1 + 18 + 1 + 7 + 1 + 11 + 1
    assert fit(items, 40) == items
    assert fit(items, 39) == items[:2]
    assert len(orjson.dumps(items[:2])) == 28
    assert fit(items, 28) == items[:2]
    assert fit(items, 27) == items[:1]
    # The first item always goes, so a page never stalls on one large entry.
    assert fit(items, 1) == items[:1]
    assert fit([], 1) == []


def test_string_list_field():
    assert string_list_field({}, "capabilities", 3) == []
    assert string_list_field({"capabilities": None}, "capabilities", 3) == []
    assert string_list_field({"capabilities": []}, "capabilities", 3) == []
    assert string_list_field({"capabilities": ["b", "a", "b"]}, "capabilities", 3) == ["b", "a"]
    assert string_list_field({"capabilities": ["x" * 128]}, "capabilities", 1) == ["x" * 128]
    assert string_list_field({"capabilities": ["xyz"]}, "capabilities", 1, max_length=3) == ["xyz"]


@pytest.mark.parametrize(
    ("value", "max_length"),
    [
        (["a", "b", "c", "d"], 128),  # more items than allowed
        (["a", "a", "a", "a"], 128),  # the limit counts the list as sent
        (["x" * 129], 128),
        (["xyzw"], 3),
        ([""], 128),
        (["a", 1], 128),
        ("send", 128),
        ({"a": 1}, 128),
    ],
)
def test_string_list_field_refusals(value, max_length):
    error = refused_field(string_list_field, {"capabilities": value}, "capabilities", 3, max_length)
    assert error.code == "internal_error"
    assert error.message == "payload.capabilities must be a list of at most 3 non-empty strings"
    assert error.details == {"reason": "invalid_message", "field": "payload.capabilities"}


def test_object_field():
    assert object_field({}, "metadata") == {}
    assert object_field({"metadata": None}, "metadata") == {}
    value = {"k": "v"}
    assert object_field({"metadata": value}, "metadata") is value
    # orjson.dumps({"k": "v"}) is 9 bytes: exactly at the limit is fine.
    assert object_field({"metadata": value}, "metadata", max_bytes=9) is value
    assert object_field({"metadata": {"k": "v" * 100_000}}, "metadata") == {"k": "v" * 100_000}


def test_object_field_size_limit():
    error = refused_field(object_field, {"metadata": {"k": "v"}}, "metadata", max_bytes=8)
    assert error.code == "internal_error"
    assert error.message == "payload.metadata must encode to at most 8 bytes"
    assert error.details == {"reason": "invalid_message", "field": "payload.metadata"}


@pytest.mark.parametrize("value", [[], "x", 1, True])
def test_object_field_must_be_an_object(value):
    error = refused_field(object_field, {"metadata": value}, "metadata", max_bytes=100)
    assert error.message == "payload.metadata must be a JSON object"
    assert error.details == {"reason": "invalid_message", "field": "payload.metadata"}


def test_error_code_constants():
    assert (codec.VERSION_MISMATCH, codec.UNAUTHORIZED, codec.RATE_LIMITED, codec.UNKNOWN_ACTOR,
            codec.MESSAGE_TOO_LARGE, codec.MESSAGE_EXPIRED, codec.TIMEOUT, codec.INTERNAL_ERROR) == (
        "version_mismatch", "unauthorized", "rate_limited", "unknown_actor",
        "message_too_large", "message_expired", "timeout", "internal_error",
    )


def test_known_addresses_answer_as_the_check_does_and_stay_bounded(monkeypatch):
    from gateways.signal import codec as signal_codec

    monkeypatch.setattr(signal_codec, "_KNOWN", {})
    monkeypatch.setattr(signal_codec, "_KNOWN_MAX", 3)
    for _ in range(2):  # the second time from the known ones
        assert normalize_address("@(rt/a)") == "rt/a"
        assert normalize_address("rt/a") == "rt/a"
        assert normalize_address("RT/a") is None and normalize_address("@(rt/a") is None
    assert signal_codec._KNOWN == {"@(rt/a)": "rt/a", "rt/a": "rt/a"}  # invalid ones are never kept
    assert normalize_address("rt/b") == "rt/b" and len(signal_codec._KNOWN) == 3
    assert normalize_address("rt/c") == "rt/c" and signal_codec._KNOWN == {"rt/c": "rt/c"}  # full: emptied
    long = "r" * 200 + "/a"
    assert normalize_address(long) == long and long not in signal_codec._KNOWN

    class Text(str):
        pass

    assert normalize_address(Text("rt/d")) == "rt/d" and "rt/d" not in signal_codec._KNOWN  # plain str only
    assert type(normalize_address("rt/d")) is str


# -- hub:delivery_ack formatted from its kept start ---------------------------------------------


_REPLY_IDS = st.one_of(st.none(), st.text(max_size=40), st.integers(-(2**63), 2**63 - 1),
                       st.floats(allow_nan=False, allow_infinity=False))


@settings(max_examples=300, deadline=None)
@given(topic=st.text(min_size=1, max_size=60), to=st.from_regex(r"[a-z0-9-]{1,8}/[a-z0-9-]{1,8}", fullmatch=True),
       count=st.integers(0, 10**9), reply_id=_REPLY_IDS)
def test_a_delivery_ack_from_its_start_is_the_encoded_one_byte_for_byte(topic, to, count, reply_id):
    head = codec.delivery_ack_head("cloudflare/signal-hub", to, topic)
    expected = encode("hub:delivery_ack", "cloudflare/signal-hub", to,
                      {"topic": topic, "subscriberCount": count, "deliveredCount": count}, reply_id)
    assert codec.delivery_ack(head, count, reply_id) == expected


def test_a_delivery_ack_escapes_its_topic_and_id_as_json():
    head = codec.delivery_ack_head("cloudflare/signal-hub", "rt/a", 'a"b\\c\n\u00e9\u2028')
    frame = codec.delivery_ack(head, 2, 'x"y')
    assert orjson.loads(frame) == {"type": "hub:delivery_ack", "from": "cloudflare/signal-hub", "to": "rt/a",
                                   "payload": {"topic": 'a"b\\c\n\u00e9\u2028', "subscriberCount": 2,
                                               "deliveredCount": 2},
                                   "correlationId": 'x"y'}
    assert "correlationId" not in orjson.loads(codec.delivery_ack(head, 0))
