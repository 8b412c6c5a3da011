"""gateways/cashu/codec.py: NUT-17 requests, replies, notifications and the mint's state pushes."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateways.cashu import codec
from gateways.cashu.codec import Heartbeat, Limits, RpcError, StateError, Subscribe, Unsubscribe
from gateways.cashu.config import CASHU_KINDS

LIMITS = Limits(frozenset(CASHU_KINDS), max_filters=3, max_filter_length=70, max_sub_id_length=10)
Y = "02e208f9a78cd523444aadf854a4e91281d20f67a923d345239c37f14e137c7c3d"


def request(**fields) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": 0, **fields}).encode()


def error_of(data: bytes) -> tuple[int, str, object]:
    with pytest.raises(RpcError) as caught:
        codec.decode(data, LIMITS)
    return caught.value.code, caught.value.message, caught.value.request_id


# -- requests --------------------------------------------------------------------------------

def test_subscribe_as_in_the_spec_example():
    data = request(method="subscribe", params={"kind": "proof_state", "filters": [Y], "subId": "Ua_IYvRHoC"})
    assert codec.decode(data, LIMITS) == Subscribe(0, "proof_state", "Ua_IYvRHoC", (Y,))


def test_repeated_filters_count_once_in_order():
    data = request(method="subscribe", params={"kind": "bolt11_mint_quote", "filters": ["b", "a", "b"], "subId": "s"})
    assert codec.decode(data, LIMITS).filters == ("b", "a")


def test_params_may_be_serialized_json():
    params = json.dumps({"kind": "bolt11_melt_quote", "filters": ["q"], "subId": "s"})
    assert codec.decode(request(method="subscribe", params=params), LIMITS) == Subscribe(0, "bolt11_melt_quote", "s", ("q",))


def test_unsubscribe_and_heartbeat():
    assert codec.decode(request(id=4, method="unsubscribe", params={"subId": "s"}), LIMITS) == Unsubscribe(4, "s")
    assert codec.decode(request(id=5, method="heartbeat"), LIMITS) == Heartbeat(5)
    assert codec.decode(request(id="x", method="heartbeat"), LIMITS) == Heartbeat("x")


@pytest.mark.parametrize("data, expected", [
    (b"{nope", (codec.PARSE_ERROR, None)),
    (b"[]", (codec.INVALID_REQUEST, "Invalid Request: batch requests are not supported")),
    (b"7", (codec.INVALID_REQUEST, "Invalid Request: expected a JSON object")),
    (json.dumps({"jsonrpc": "2.0", "method": "heartbeat"}).encode(),
     (codec.INVALID_REQUEST, "Invalid Request: 'id' must be an integer or a string")),
    (json.dumps({"jsonrpc": "2.0", "id": 1.5, "method": "heartbeat"}).encode(),
     (codec.INVALID_REQUEST, "Invalid Request: 'id' must be an integer or a string")),
    (json.dumps({"jsonrpc": "2.0", "id": True, "method": "heartbeat"}).encode(),
     (codec.INVALID_REQUEST, "Invalid Request: 'id' must be an integer or a string")),
    (json.dumps({"id": 1, "method": "heartbeat"}).encode(), (codec.INVALID_REQUEST, "Invalid Request: 'jsonrpc' must be \"2.0\"")),
    (request(method=3), (codec.INVALID_REQUEST, "Invalid Request: 'method' must be a string")),
    (request(method="mint"), (codec.METHOD_NOT_FOUND, "Method not found: mint")),
    (request(method="subscribe"), (codec.INVALID_PARAMS, "Invalid params: 'params' must be an object")),
    (request(method="subscribe", params="{x"), (codec.INVALID_PARAMS, "Invalid params: 'params' is a string but not JSON")),
    (request(method="subscribe", params={"kind": "proof_state", "filters": [Y]}),
     (codec.INVALID_PARAMS, "Invalid params: 'subId' must be a non-empty string")),
    (request(method="subscribe", params={"kind": "proof_state", "filters": [Y], "subId": "x" * 11}),
     (codec.INVALID_PARAMS, "Invalid params: 'subId' is longer than 10 characters")),
    (request(method="subscribe", params={"filters": [Y], "subId": "s"}), (codec.INVALID_PARAMS, "Invalid params: 'kind' must be a string")),
    (request(method="subscribe", params={"kind": "bolt13", "filters": [Y], "subId": "s"}),
     (codec.INVALID_PARAMS, "Invalid params: unsupported kind 'bolt13'; supported: " + ", ".join(sorted(CASHU_KINDS)))),
    (request(method="subscribe", params={"kind": "proof_state", "subId": "s"}),
     (codec.INVALID_PARAMS, "Invalid params: 'filters' must be a non-empty array of strings")),
    (request(method="subscribe", params={"kind": "proof_state", "filters": [], "subId": "s"}),
     (codec.INVALID_PARAMS, "Invalid params: 'filters' must be a non-empty array of strings")),
    (request(method="subscribe", params={"kind": "bolt11_mint_quote", "filters": ["a", "b", "c", "d"], "subId": "s"}),
     (codec.INVALID_PARAMS, "Invalid params: 4 filters; at most 3 per subscription")),
    (request(method="subscribe", params={"kind": "bolt11_mint_quote", "filters": ["a", 7], "subId": "s"}),
     (codec.INVALID_PARAMS, "Invalid params: filters[1] must be a non-empty string")),
    (request(method="subscribe", params={"kind": "bolt11_mint_quote", "filters": ["q" * 71], "subId": "s"}),
     (codec.INVALID_PARAMS, "Invalid params: filters[0] is longer than 70 characters")),
    (request(method="subscribe", params={"kind": "proof_state", "filters": ["04" + Y[2:]], "subId": "s"}),
     (codec.INVALID_PARAMS, "Invalid params: filters[0] is not a proof Y (33-byte compressed point, 66 hex digits)")),
    (request(method="unsubscribe", params={}), (codec.INVALID_PARAMS, "Invalid params: 'subId' must be a non-empty string")),
])
def test_bad_requests_get_the_most_specific_code(data, expected):
    code, message, _ = error_of(data)
    assert code == expected[0]
    if expected[1] is not None:
        assert message == expected[1]
    else:
        assert message.startswith("Parse error: ")


def test_errors_carry_the_request_id_once_it_is_known():
    assert error_of(request(id=9, method="nope"))[2] == 9
    assert error_of(b"{")[2] is None
    assert error_of(json.dumps({"jsonrpc": "2.0", "id": {}, "method": "x"}).encode())[2] is None


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)
REQUESTS = st.fixed_dictionaries({}, optional={
    "jsonrpc": st.sampled_from(["2.0", "1.0"]) | JSON,
    "id": st.integers(-5, 5) | JSON,
    "method": st.sampled_from(["subscribe", "unsubscribe", "heartbeat"]) | JSON,
    "params": st.fixed_dictionaries({}, optional={
        "kind": st.sampled_from(CASHU_KINDS) | JSON,
        "subId": st.text(max_size=12) | JSON,
        "filters": st.lists(st.sampled_from([Y, "q1", ""]) | st.text(max_size=80), max_size=5) | JSON,
    }) | JSON,
})


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=200) | (JSON | REQUESTS).map(lambda value: json.dumps(value).encode()))
def test_any_input_decodes_or_raises_rpc_error(data):
    try:
        codec.decode(data, LIMITS)
    except RpcError as error:
        assert error.code in (codec.PARSE_ERROR, codec.INVALID_REQUEST, codec.METHOD_NOT_FOUND, codec.INVALID_PARAMS)


# -- frames out ------------------------------------------------------------------------------

def test_reply_frames():
    assert json.loads(codec.encode_ok(3, "s")) == {"jsonrpc": "2.0", "result": {"status": "OK", "subId": "s"}, "id": 3}
    assert json.loads(codec.encode_error(None, -32700, "Parse error")) == {
        "jsonrpc": "2.0", "error": {"code": -32700, "message": "Parse error"}, "id": None}
    assert json.loads(codec.encode_heartbeat(1)) == {"jsonrpc": "2.0", "id": 1, "result": "heartbeat"}


def test_notification_has_no_id_and_embeds_the_payload_as_is():
    payload = b'{"Y":"02ab","state":"SPENT"}'
    frame = codec.encode_notification(codec.notification_prefix('sub "1"'), payload)
    assert json.loads(frame) == {"jsonrpc": "2.0", "method": "subscribe",
                                 "params": {"subId": 'sub "1"', "payload": {"Y": "02ab", "state": "SPENT"}}}
    assert json.loads(codec.unspent_proof(Y)) == {"Y": Y, "state": "UNSPENT", "witness": None}


def test_object_keys_are_per_kind_and_proof_ys_case_insensitive():
    assert codec.object_key("bolt11_mint_quote", "Ab") == "cashu/bolt11_mint_quote/Ab"
    assert codec.object_key("proof_state", Y.upper().replace("X", "x")) == "cashu/proof_state/" + Y


# -- the state feed --------------------------------------------------------------------------

KINDS = frozenset(CASHU_KINDS)


def test_single_and_batched_pushes():
    one = codec.decode_states(json.dumps({"kind": "bolt11_mint_quote", "payload": {"quote": "q", "state": "PAID"}}).encode(), KINDS, 10)
    assert one == [codec.State("bolt11_mint_quote", "q", b'{"quote":"q","state":"PAID"}')]
    assert one[0].key == "cashu/bolt11_mint_quote/q"
    many = codec.decode_states(json.dumps({"states": [
        {"kind": "proof_state", "payload": {"Y": Y, "state": "SPENT", "witness": None}},
        {"kind": "bolt12_mint_quote", "payload": {"quote": "z", "amount_paid": 5}},
    ]}).encode(), KINDS, 10)
    assert [(s.kind, s.object_id) for s in many] == [("proof_state", Y), ("bolt12_mint_quote", "z")]


@pytest.mark.parametrize("body, message", [
    (b"{", "body is not JSON"),
    (b"[1]", 'expected {"kind", "payload"} or {"states": [...]}'),
    (b'{"states": []}', "'states' must be a non-empty array"),
    (b'{"states": [1, 2, 3]}', "3 states in one push; at most 2"),
    (b'{"states": [7]}', 'states[0]: expected an object {"kind", "payload"}'),
    (b'{"kind": "x", "payload": {}}', "unsupported kind 'x'"),
    (b'{"kind": "proof_state", "payload": 1}', "'payload' must be an object"),
    (b'{"kind": "bolt11_mint_quote", "payload": {"state": "PAID"}}', "payload.quote must be a string of 1 to 256 characters"),
    (b'{"kind": "bolt11_mint_quote", "payload": {"quote": "q", "state": "SPENT"}}',
     "payload.state must be one of ['ISSUED', 'PAID', 'UNPAID'] for bolt11_mint_quote"),
    (b'{"kind": "bolt11_melt_quote", "payload": {"quote": "q", "state": "ISSUED"}}',
     "payload.state must be one of ['PAID', 'PENDING', 'UNPAID'] for bolt11_melt_quote"),
    (b'{"kind": "proof_state", "payload": {"Y": "zz", "state": "SPENT"}}', "payload.Y is not a 33-byte compressed point in hex"),
    (b'{"states": [{"kind": "proof_state", "payload": {"Y": "' + Y.encode() + b'", "state": "GONE"}}]}',
     "states[0]: payload.state must be one of ['PENDING', 'SPENT', 'UNSPENT']"),
])
def test_bad_pushes_name_the_item_and_field(body, message):
    with pytest.raises(StateError) as caught:
        codec.decode_states(body, KINDS, 2)
    assert str(caught.value).startswith(message)
