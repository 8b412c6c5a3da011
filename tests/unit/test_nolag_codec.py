"""gateways/nolag/codec.py: every request, every refusal, every server frame, byte for byte."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateways.nolag import codec
from gateways.nolag.codec import (
    Ack, Auth, BatchAck, GetLobbyPresence, GetPresence, Limits, LobbySubscribe, LobbyUnsubscribe, NolagError,
    Presence, Publish, SetFilters, Subscribe, Unsubscribe, decode,
)

pack = msgpack.packb


def failure(frame, limits: Limits = codec.DEFAULT_LIMITS) -> NolagError:
    data = frame if isinstance(frame, bytes) else pack(frame)
    with pytest.raises(NolagError) as caught:
        decode(data, limits)
    return caught.value


def fields(error: NolagError) -> tuple:
    return error.error, error.code, error.message, error.topic, error.msg_ref


# -- requests -----------------------------------------------------------------------------------

def test_auth_as_the_sdk_sends_it_and_as_the_spec_shows_it():
    assert decode(pack({"type": "auth", "token": "at_live_k.s", "protocolVersion": 2})) == Auth("at_live_k.s",
                                                                                                  False, None, 2)
    assert decode(pack({"type": "auth", "token": "t", "reconnect": True, "projectId": "proj_123"})) == Auth(
        "t", True, "proj_123", 1)
    assert decode(pack({"type": "auth", "token": "t", "protocolVersion": 3, "loadBalance": True,
                        "loadBalanceGroup": "g"})) == Auth("t", False, None, 3, True, "g")
    assert decode(pack({"type": "auth", "token": "t", "loadBalanceGroup": "g"})) == Auth("t")


@pytest.mark.parametrize("frame, message", [
    ({"type": "auth"}, "'token' must be a non-empty string"),
    ({"type": "auth", "token": ""}, "'token' must be a non-empty string"),
    ({"type": "auth", "token": 5}, "'token' must be a non-empty string"),
    ({"type": "auth", "token": "t", "reconnect": 1}, "'reconnect' must be a boolean"),
    ({"type": "auth", "token": "t", "protocolVersion": 0}, "'protocolVersion' must be a positive integer"),
    ({"type": "auth", "token": "t", "protocolVersion": True}, "'protocolVersion' must be a positive integer"),
    ({"type": "auth", "token": "t", "protocolVersion": "2"}, "'protocolVersion' must be a positive integer"),
    ({"type": "auth", "token": "t", "projectId": 7}, "'projectId' must be a string of 1 to 256 characters"),
])
def test_auth_refusals(frame, message):
    assert fields(failure(frame)) == ("invalid_message", None, message, None, None)


def test_subscribe_defaults_and_every_field():
    assert decode(pack({"type": "subscribe", "topic": "chat/general/messages"})) == Subscribe(
        "chat/general/messages", 1, (), False, None)
    assert decode(pack({"type": "subscribe", "topic": "chat/general/messages", "qos": 2,
                        "filters": ["user_123", "user_456", "user_123"], "loadBalance": True,
                        "loadBalanceGroup": "worker-pool-1"})) == Subscribe(
        "chat/general/messages", 2, ("user_123", "user_456"), True, "worker-pool-1")
    # a group without loadBalance is no group; loadBalance without a group: the caller's default
    assert decode(pack({"type": "subscribe", "topic": "a/b/c", "qos": 0, "loadBalanceGroup": "g"})) == Subscribe(
        "a/b/c", 0, (), False, None)
    assert decode(pack({"type": "subscribe", "topic": "a/b/c", "loadBalance": True})).group is None


def test_unsubscribe_and_set_filters():
    assert decode(pack({"type": "unsubscribe", "topic": "a/b/c"})) == Unsubscribe("a/b/c")
    assert decode(pack({"type": "setFilters", "topic": "a/b/c", "filters": ["user_789"]})) == SetFilters(
        "a/b/c", ("user_789",))
    assert decode(pack({"type": "setFilters", "topic": "a/b/c", "filters": []})) == SetFilters("a/b/c", ())


def test_publish_keeps_data_and_its_exact_packed_bytes():
    data = {"text": "hello world", "sender": "user_12"}
    request = decode(pack({"type": "publish", "topic": "chat/general/messages", "data": data, "qos": 1,
                           "echo": False, "filter": "user_123", "msgRef": "1-ab"}))
    assert request == Publish("chat/general/messages", data, 1, False, "user_123", "1-ab", pack(data))
    assert request.data_size == len(pack(data)) == 33


def test_publish_defaults_and_data_is_packed_canonically():
    assert decode(pack({"type": "publish", "topic": "a/b/c"})) == Publish("a/b/c", None, 1, True, None, None, b"\xc0")
    # 1 sent as a uint32 (non-minimal): the size counted is that of the canonical encoding
    frame = b"\x83" + pack("type") + pack("publish") + pack("topic") + pack("a/b/c") + pack("data") \
        + b"\xce\x00\x00\x00\x01"
    request = decode(frame)
    assert request.data == 1 and request.data_packed == b"\x01" and request.data_size == 1
    # a repeated key: the last one counts
    frame = b"\x84" + pack("type") + pack("publish") + pack("data") + pack("first") + pack("topic") + pack("a/b/c") \
        + pack("data") + pack([1, 2])
    assert decode(frame).data_packed == pack([1, 2])
    # deep nesting that the unpacker accepts is packed again
    deep = b"\x83" + pack("type") + pack("publish") + pack("topic") + pack("a/b/c") + pack("data") + b"\x91" * 900 \
        + b"\x01"
    assert decode(deep).data_size == 901


@pytest.mark.parametrize("msg_ref", ["r-1", 7, 1.5, True, b"\x01"])
def test_publish_msg_ref_may_be_any_scalar(msg_ref):
    assert decode(pack({"type": "publish", "topic": "a/b/c", "data": 1, "msgRef": msg_ref})).msg_ref == msg_ref


def test_presence_and_get_presence():
    assert decode(pack({"type": "presence", "roomId": "general", "data": {"status": "online"}})) == Presence(
        "general", {"status": "online"})
    assert decode(pack({"type": "presence", "data": None})) == Presence(None, None)  # SDK clear_presence
    assert decode(pack({"type": "getPresence", "roomId": "general"})) == GetPresence("general")
    assert decode(pack({"type": "getPresence"})) == GetPresence(None)


def test_acks_and_lobbies():
    assert decode(pack({"type": "ack", "msgId": "550e8400"})) == Ack("550e8400")
    assert decode(pack({"type": "batchAck", "msgIds": ["a", "b"]})) == BatchAck(("a", "b"))
    assert decode(pack({"type": "batchAck", "msgIds": []})) == BatchAck(())
    assert decode(pack({"type": "lobbySubscribe", "lobbyId": "active-trips"})) == LobbySubscribe("active-trips")
    assert decode(pack({"type": "lobbyUnsubscribe", "lobbyId": "active-trips"})) == LobbyUnsubscribe("active-trips")
    assert decode(pack({"type": "getLobbyPresence", "lobbyId": "x"})) == GetLobbyPresence("x")


def test_unknown_fields_are_ignored():
    assert decode(pack({"type": "unsubscribe", "topic": "a/b/c", "retain": True, 5: 6})) == Unsubscribe("a/b/c")


# -- refusals -----------------------------------------------------------------------------------

@pytest.mark.parametrize("data, message", [
    (b"", "an empty frame is a heartbeat, not a message"),
    (pack([1, 2]), "a message must be a MessagePack map"),
    (pack("publish"), "a message must be a MessagePack map"),
    (b"\xc1", "invalid MessagePack (FormatError)"),
    (b"\x91" * 2000 + b"\x01", "invalid MessagePack (StackError)"),
    (b"\xdf\xff\xff\xff\xff", "truncated MessagePack"),  # a map header claiming 2**32-1 entries
    (b"\x82\xa4type", "truncated MessagePack"),
    (b"\x81", "truncated MessagePack"),
    (pack({"type": "ack", "msgId": "m"}) + b"\x00", "extra bytes after the message map"),
    (b"\x81\xa4type\xa3\xff\xfe\xfd", "invalid MessagePack (UnicodeDecodeError)"),
    (b"\x81\x91\x01\x01", "invalid MessagePack (TypeError)"),  # an array as a key
    (pack({}), "missing 'type'"),
    (pack({"type": 3}), "'type' must be a string"),
])
def test_malformed_frames(data, message):
    assert fields(failure(data)) == ("invalid_message", None, message, None, None)


def test_unknown_type_lists_the_supported_ones():
    assert fields(failure({"type": "hello"})) == (
        "unknown_type", None, "unknown message type 'hello'; supported: auth, subscribe, unsubscribe, publish, "
        "setFilters, presence, getPresence, ack, batchAck, lobbySubscribe, lobbyUnsubscribe, getLobbyPresence",
        None, None)
    assert failure({"type": "x" * 100}).message.startswith("unknown message type '" + "x" * 64 + "…'")


SLUG = "'topic' must be 'app/room/topic': three non-empty segments of A-Z a-z 0-9 _ . -"


@pytest.mark.parametrize("topic", ["a/b", "a/b/c/d", "a//c", "/b/c", "a/b/", "a/b/c\n", "a b/c/d", "a/b/#",
                                   "a/+/c", "é/b/c", ""])
def test_invalid_topics_in_every_request_that_has_one(topic):
    for kind in ("subscribe", "unsubscribe", "setFilters"):
        assert fields(failure({"type": kind, "topic": topic, "filters": []})) == (
            "invalid_topic", None, SLUG, topic, None)
    assert fields(failure({"type": "publish", "topic": topic, "msgRef": 9})) == ("invalid_topic", None, SLUG, topic, 9)


def test_topic_type_and_length():
    assert fields(failure({"type": "subscribe"})) == (
        "invalid_topic", None, "'topic' must be a string 'app/room/topic'", None, None)
    assert fields(failure({"type": "publish", "topic": 5, "msgRef": "r"})) == (
        "invalid_topic", None, "'topic' must be a string 'app/room/topic'", None, "r")
    ok = "a/b/" + "c" * 252
    assert decode(pack({"type": "unsubscribe", "topic": ok})) == Unsubscribe(ok)
    assert fields(failure({"type": "unsubscribe", "topic": ok + "c"})) == (
        "invalid_topic", None, "'topic' is 257 characters; at most 256", ok + "c", None)
    assert failure({"type": "unsubscribe", "topic": "a/b/cd"}, Limits(max_topic_length=5)).message == \
        "'topic' is 6 characters; at most 5"
    assert codec.check_topic("Ab.9/x_y/z-1") is None


@pytest.mark.parametrize("filters, error, message", [
    ("user", "invalid_filter", "'filters' must be an array of strings"),
    ([""], "invalid_filter", "filters[0] must be a non-empty string"),
    (["a", 3], "invalid_filter", "filters[1] must be a non-empty string"),
    (["a", ["b", "c"]], "invalid_filter", "filters[1]: AND filter groups are not supported; use strings"),
    (["x" * 257], "invalid_filter", "filters[0] is longer than 256 characters"),
    (["a/b"], "invalid_filter_chars", "filters[0] contains '/', '#' or '+'"),
    (["ok", "a#"], "invalid_filter_chars", "filters[1] contains '/', '#' or '+'"),
    (["+"], "invalid_filter_chars", "filters[0] contains '/', '#' or '+'"),
    ([f"f{i}" for i in range(101)], "too_many_filters", "101 filters; at most 100 per topic"),
])
def test_filter_refusals_carry_the_topic(filters, error, message):
    for kind in ("subscribe", "setFilters"):
        assert fields(failure({"type": kind, "topic": "a/b/c", "filters": filters})) == (
            error, None, message, "a/b/c", None)


def test_filter_limits():
    hundred = [f"f{i}" for i in range(100)]
    assert decode(pack({"type": "subscribe", "topic": "a/b/c", "filters": hundred + hundred})).filters == \
        tuple(hundred)
    assert decode(pack({"type": "subscribe", "topic": "a/b/c", "filters": ["x" * 256]})).filters == ("x" * 256,)
    assert fields(failure({"type": "setFilters", "topic": "a/b/c"})) == (
        "invalid_filter", None, "'filters' must be an array of strings", "a/b/c", None)
    assert failure({"type": "subscribe", "topic": "a/b/c", "filters": ["a", "b", "c"]},
                   Limits(max_filters=2)).message == "3 filters; at most 2 per topic"


@pytest.mark.parametrize("field, value, message", [
    ("qos", 3, "'qos' must be 0, 1 or 2"),
    ("qos", -1, "'qos' must be 0, 1 or 2"),
    ("qos", True, "'qos' must be 0, 1 or 2"),
    ("qos", "1", "'qos' must be 0, 1 or 2"),
    ("loadBalance", "yes", "'loadBalance' must be a boolean"),
])
def test_subscribe_field_refusals(field, value, message):
    assert fields(failure({"type": "subscribe", "topic": "a/b/c", field: value})) == (
        "invalid_message", None, message, "a/b/c", None)


def test_subscribe_group_refusal():
    assert fields(failure({"type": "subscribe", "topic": "a/b/c", "loadBalance": True, "loadBalanceGroup": ""})) == (
        "invalid_message", None, "'loadBalanceGroup' must be a string of 1 to 256 characters", "a/b/c", None)


@pytest.mark.parametrize("extra, error, message", [
    ({"qos": 5}, "invalid_message", "'qos' must be 0, 1 or 2"),
    ({"echo": 0}, "invalid_message", "'echo' must be a boolean"),
    ({"filter": ""}, "invalid_filter", "'filter' must be a non-empty string"),
    ({"filter": 12}, "invalid_filter", "'filter' must be a non-empty string"),
    ({"filter": "y" * 257}, "invalid_filter", "'filter' is longer than 256 characters"),
    ({"filter": "a+b"}, "invalid_filter_chars", "'filter' contains '/', '#' or '+'"),
    ({"filters": ["a", "b"]}, "invalid_filter", "'filters' (AND-composite publish) is not supported; use 'filter'"),
])
def test_publish_refusals_carry_topic_and_msg_ref(extra, error, message):
    frame = {"type": "publish", "topic": "chat/general/messages", "data": {}, "msgRef": "3-f", **extra}
    assert fields(failure(frame)) == (error, None, message, "chat/general/messages", "3-f")


@pytest.mark.parametrize("qos, echo, expected", [
    (None, None, (1, True)),  # nil: the defaults
    (0, False, (0, False)),
    (2, True, (2, True)),
    (True, True, ("invalid_message", None, "'qos' must be 0, 1 or 2", "a/b/c", "r")),  # a bool is not an int here
    (1.0, True, ("invalid_message", None, "'qos' must be 0, 1 or 2", "a/b/c", "r")),
    (-1, True, ("invalid_message", None, "'qos' must be 0, 1 or 2", "a/b/c", "r")),
    (3, True, ("invalid_message", None, "'qos' must be 0, 1 or 2", "a/b/c", "r")),
    (1, 1, ("invalid_message", None, "'echo' must be a boolean", "a/b/c", "r")),
    (1, "yes", ("invalid_message", None, "'echo' must be a boolean", "a/b/c", "r")),
])
def test_a_publish_takes_an_int_qos_and_a_bool_echo_only(qos, echo, expected):
    """The publish decoder's own check of the usual values and its helpers' agree: nil is the
    default, anything but an int 0-2 or a bool is refused with the helper's error."""
    frame = {"type": "publish", "topic": "a/b/c", "data": 1, "qos": qos, "echo": echo, "msgRef": "r"}
    if isinstance(expected[0], str):
        assert fields(failure(frame)) == expected
    else:
        request = decode(pack(frame))
        assert (request.qos, request.echo) == expected


def test_a_publish_to_a_topic_seen_valid_is_still_held_to_the_length_limit():
    frame = {"type": "publish", "topic": "a/b/cd", "data": 1, "msgRef": 4}
    assert decode(pack(frame)).topic == "a/b/cd"  # now among the topics seen valid
    assert fields(failure(frame, Limits(max_topic_length=5))) == (
        "invalid_topic", None, "'topic' is 6 characters; at most 5", "a/b/cd", 4)
    assert fields(failure({**frame, "topic": "a/b/"})) == ("invalid_topic", None, SLUG, "a/b/", 4)


def test_publish_msg_ref_must_be_a_scalar():
    assert fields(failure({"type": "publish", "topic": "a/b/c", "msgRef": [1]})) == (
        "invalid_message", None, "'msgRef' must be a scalar (string or number)", "a/b/c", None)
    assert fields(failure({"type": "publish", "topic": 1, "msgRef": {}})) == (
        "invalid_message", None, "'msgRef' must be a scalar (string or number)", None, None)


@pytest.mark.parametrize("frame, message", [
    ({"type": "presence", "roomId": ""}, "'roomId' must be a string of 1 to 256 characters"),
    ({"type": "getPresence", "roomId": 4}, "'roomId' must be a string of 1 to 256 characters"),
    ({"type": "ack"}, "'msgId' must be a string of 1 to 256 characters"),
    ({"type": "ack", "msgId": 5}, "'msgId' must be a string of 1 to 256 characters"),
    ({"type": "batchAck"}, "'msgIds' must be an array of strings"),
    ({"type": "batchAck", "msgIds": ["a", ""]}, "msgIds[1] must be a string of 1 to 256 characters"),
    ({"type": "batchAck", "msgIds": ["a", "b", 7]}, "msgIds[2] must be a string of 1 to 256 characters"),
    ({"type": "batchAck", "msgIds": ["a", "x" * 257]}, "msgIds[1] must be a string of 1 to 256 characters"),
    ({"type": "batchAck", "msgIds": [["a"], "b"]}, "msgIds[0] must be a string of 1 to 256 characters"),
    ({"type": "batchAck", "msgIds": ["a"] * 1001}, "1001 msgIds; at most 1000 per batchAck"),
    ({"type": "lobbySubscribe"}, "'lobbyId' must be a string of 1 to 256 characters"),
    ({"type": "lobbyUnsubscribe", "lobbyId": "x" * 257}, "'lobbyId' must be a string of 1 to 256 characters"),
    ({"type": "getLobbyPresence", "lobbyId": None}, "'lobbyId' must be a string of 1 to 256 characters"),
])
def test_other_refusals(frame, message):
    assert fields(failure(frame)) == ("invalid_message", None, message, None, None)


def test_error_codes_are_the_spec_table():
    assert codec.ERROR_CODES == {"rate_limit_exceeded": 42910, "monthly_quota_exceeded": 42920,
                                 "message_too_large": 42930}
    assert fields(codec.nolag_error("message_too_large", "too big", "a/b/c", "r")) == (
        "message_too_large", 42930, "too big", "a/b/c", "r")
    for name in ("not_authorized", "not_subscribed", "invalid_filter_chars"):
        assert codec.nolag_error(name, "m").code is None


frames = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats(allow_nan=False) | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=64))
def test_any_bytes_decode_or_raise_nolag_error(data):
    try:
        decode(data)
    except NolagError as error:
        assert error.error in {"invalid_message", "unknown_type", "invalid_topic", "invalid_filter",
                               "invalid_filter_chars", "too_many_filters"}


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["auth", "subscribe", "unsubscribe", "publish", "setFilters", "presence", "getPresence",
                        "ack", "batchAck", "lobbySubscribe", "lobbyUnsubscribe", "getLobbyPresence"]),
       st.dictionaries(st.sampled_from(["token", "topic", "qos", "filters", "filter", "data", "msgRef", "echo",
                                        "roomId", "msgId", "msgIds", "lobbyId", "loadBalance", "loadBalanceGroup"]),
                       frames, max_size=5))
def test_any_map_of_known_fields_decodes_or_raises_nolag_error(kind, body):
    try:
        request = decode(pack({"type": kind, **body}))
    except NolagError:
        return
    if isinstance(request, Publish):
        assert msgpack.unpackb(request.data_packed, raw=False, strict_map_key=False) == request.data


# -- frames to the client -----------------------------------------------------------------------

def unpack(data: bytes):
    return msgpack.unpackb(data, raw=False)


@pytest.mark.parametrize("options, expected", [
    ({}, {}),
    ({"msg_id": "550e8400", "requires_ack": True}, {"msgId": "550e8400", "requiresAck": True}),
    ({"msg_id": "m", "is_replay": True, "filter": "user_123"}, {"msgId": "m", "isReplay": True, "filter": "user_123"}),
    ({"msg_id": "m", "requires_ack": True, "is_replay": True, "filter": "f", "sender": "actor_1",
      "timestamp": 1634567890123},
     {"msgId": "m", "requiresAck": True, "isReplay": True, "filter": "f", "from": "actor_1",
      "timestamp": 1634567890123}),
])
def test_message_splices_data_into_the_same_bytes_as_packb(options, expected):
    data = {"text": "hello world", "sender": "user_12", "n": [1, 2.5, None, b"\x00"]}
    dictionary = {"type": "message", "topic": "chat/general/messages", "data": data, **expected}
    assert codec.message("chat/general/messages", data, **options) == pack(dictionary)
    assert codec.message_packed("chat/general/messages", pack(data), **options) == pack(dictionary)


@settings(max_examples=200, deadline=None)
@given(frames, st.text(max_size=40), st.none() | st.text(max_size=20), st.booleans(), st.booleans())
def test_message_equals_packb_of_the_dict_for_any_data(data, topic, msg_id, requires_ack, is_replay):
    expected = {"type": "message", "topic": topic, "data": data}
    if msg_id is not None:
        expected["msgId"] = msg_id
    if requires_ack:
        expected["requiresAck"] = True
    if is_replay:
        expected["isReplay"] = True
    assert codec.message(topic, data, msg_id, requires_ack, is_replay) == pack(expected)


rows = st.tuples(st.binary(max_size=300).map(pack), st.none() | st.text(max_size=40),
                  st.none() | st.text(min_size=1, max_size=20),
                  st.none() | st.integers(min_value=0, max_value=2**64 - 1) | st.floats(allow_nan=False))


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40), st.lists(rows, max_size=12), st.booleans())
def test_a_run_of_messages_is_built_as_each_one_alone(topic, items, requires_ack):
    """``message_run``: each frame is the bytes ``message_packed`` makes of its row, whatever
    each row carries (an id or not, a filter or not, a stamp of any size or none), and the ids
    come packed in order, as a batchAck carries them."""
    frames, ids = codec.message_run(topic, items, requires_ack)
    assert frames == [codec.message_packed(topic, data, msg_id, requires_ack, False, filter_, None, stamp)
                      for data, msg_id, filter_, stamp in items]
    assert ids == [pack(msg_id) for _, msg_id, _, _ in items if msg_id is not None]


def test_auth_replies():
    assert unpack(codec.auth_ok("actor_123", "proj_1", 2, ["a/b/c"])) == {
        "type": "auth", "success": True, "actorTokenId": "actor_123", "projectId": "proj_1", "protocolVersion": 2,
        "restoredSubscriptions": ["a/b/c"]}
    assert unpack(codec.auth_ok("a", None, 1, (), actor_type="server"))["actorType"] == "server"
    with pytest.raises(ValueError):
        codec.auth_ok("a", None, 1, (), actor_type="robot")
    assert unpack(codec.auth_failed("access_denied")) == {"type": "auth", "success": False, "error": "access_denied"}


def test_subscription_replies():
    assert unpack(codec.subscribed("a/b/c", True)) == {"type": "subscribed", "topic": "a/b/c", "loadBalance": True}
    assert unpack(codec.subscribed("a/b/c")) == {"type": "subscribed", "topic": "a/b/c", "loadBalance": False}
    assert unpack(codec.unsubscribed("a/b/c")) == {"type": "unsubscribed", "topic": "a/b/c"}
    assert unpack(codec.filters_updated("a/b/c", ("user_789",))) == {
        "type": "filtersUpdated", "topic": "a/b/c", "filters": ["user_789"]}
    assert unpack(codec.published("a/b/c", "1-ab")) == {"type": "published", "topic": "a/b/c", "msgRef": "1-ab"}
    assert unpack(codec.published("a/b/c", 7)) == {"type": "published", "topic": "a/b/c", "msgRef": 7}


def test_presence_event_carries_the_spec_and_the_sdk_spellings():
    assert unpack(codec.presence_event("join", "actor_123", {"status": "online"}, 1634567890123, "general")) == {
        "type": "presence", "event": "join", "roomId": "general",
        "data": {"actorTokenId": "actor_123", "actor_token_id": "actor_123", "presence": {"status": "online"},
                 "joinedAt": 1634567890123, "joined_at": 1634567890123}}
    frame = unpack(codec.presence_event("leave", "a", {}, 5, actor_type="user"))
    assert "roomId" not in frame and frame["data"]["actor_type"] == "user"
    with pytest.raises(ValueError):
        codec.presence_event("join", "a", {}, 5, actor_type="robot")
    entries = [{"actorTokenId": "a", "presence": {"s": 1}, "joinedAt": 5}]
    assert unpack(codec.presence_list("general", entries)) == {"type": "presenceList", "data": entries,
                                                               "roomId": "general"}
    assert unpack(codec.presence_list(None, [])) == {"type": "presenceList", "data": []}


def test_lobby_frames():
    snapshot = {"room_1": {"actor_123": {"status": "driving"}}, "room_2": {"actor_456": {"status": "waiting"}}}
    assert unpack(codec.lobby_subscribed("active-trips", snapshot)) == {
        "type": "lobbySubscribed", "lobbyId": "active-trips", "presence": snapshot}
    assert unpack(codec.lobby_presence_list("active-trips", {})) == {
        "type": "lobbyPresenceList", "lobbyId": "active-trips", "presence": {}}
    assert unpack(codec.lobby_presence("join", "active-trips", "room_1", "actor_123", {"status": "driving"})) == {
        "type": "lobbyPresence", "event": "join", "lobbyId": "active-trips", "roomId": "room_1",
        "actorId": "actor_123", "data": {"status": "driving"}}
    assert unpack(codec.lobby_unsubscribed("active-trips")) == {"type": "lobbyUnsubscribed", "lobbyId": "active-trips"}


def test_replay_hydration_disconnect():
    assert unpack(codec.replay_start(247, 1000, 2000)) == {
        "type": "replayStart", "count": 247, "oldestTimestamp": 1000, "newestTimestamp": 2000}
    assert unpack(codec.replay_start(0)) == {"type": "replayStart", "count": 0}
    assert unpack(codec.replay_end(247)) == {"type": "replayEnd", "replayed": 247}
    assert unpack(codec.hydration("a/b/c", {"recentMessages": [1]})) == {
        "type": "hydration", "topic": "a/b/c", "data": {"recentMessages": [1]}}
    assert unpack(codec.disconnect("token_invalid")) == {"type": "disconnect", "reason": "token_invalid"}


def test_error_frames():
    assert unpack(codec.error("rate_limit_exceeded", 42910, "chat/general/messages")) == {
        "type": "error", "error": "rate_limit_exceeded", "code": 42910, "topic": "chat/general/messages"}
    assert unpack(codec.error("message_too_large", 42930, "a/b/c", "r1", maxSizeBytes=262144)) == {
        "type": "error", "error": "message_too_large", "code": 42930, "topic": "a/b/c", "msgRef": "r1",
        "maxSizeBytes": 262144}
    assert unpack(codec.error("not_authenticated")) == {"type": "error", "error": "not_authenticated"}
    refusal = failure({"type": "publish", "topic": "a/b/c", "filter": "#", "msgRef": "r"})
    assert unpack(codec.error_frame(refusal)) == {
        "type": "error", "error": "invalid_filter_chars", "topic": "a/b/c", "msgRef": "r",
        "hint": "'filter' contains '/', '#' or '+'"}
    assert unpack(codec.error_frame(codec.nolag_error("monthly_quota_exceeded", "quota", "a/b/c"))) == {
        "type": "error", "error": "monthly_quota_exceeded", "code": 42920, "topic": "a/b/c", "hint": "quota"}


@settings(max_examples=200, deadline=None)
@given(topic=st.text(min_size=1, max_size=300),
       ref=st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2 ** 63), max_value=2 ** 64 - 1),
                     st.floats(allow_nan=False), st.text(max_size=300), st.binary(max_size=300)))
def test_a_published_answer_made_from_its_topics_head_is_the_bytes_of_the_whole_map(topic, ref):
    assert codec.published_frame(codec.published_head(topic), ref) == codec.published(topic, ref)


def test_a_topic_is_checked_once_and_the_ones_seen_valid_stay_bounded(monkeypatch):
    monkeypatch.setattr(codec, "_SLUG_TOPICS", {})
    monkeypatch.setattr(codec, "SLUG_TOPICS_MAX", 3)
    codec.check_topic("a/b/c")
    assert list(codec._SLUG_TOPICS) == ["a/b/c"]
    for bad in ("a/b", "a/b/c/d", "a b/c/d", ""):
        with pytest.raises(NolagError) as caught:
            codec.check_topic(bad)
        assert caught.value.error == "invalid_topic"
    with pytest.raises(NolagError):  # a topic seen valid is still held to the length limit
        codec.check_topic("a/b/c", max_length=4)
    for topic in ("a/b/d", "a/b/e", "a/b/f"):
        codec.check_topic(topic)
    assert list(codec._SLUG_TOPICS) == ["a/b/f"]  # it was full: started again
