"""gateways/baqend/codec.py: subscribe/unsubscribe frames, server frames, REST helpers."""

from __future__ import annotations

import json

import pytest

from gateways.baqend import codec
from gateways.baqend.codec import ProtocolError, RestError, Subscribe, Unsubscribe


def test_subscribe_fields_as_the_sdk_sends_them():
    request = codec.decode(json.dumps({
        "id": "be22", "type": "subscribe", "token": None, "initial": True, "bucket": "eventbucket",
        "query": '{"value": 42}', "sort": '{"name": 1}', "offset": 20, "limit": 10, "operations": ["any"],
        "matchTypes": ["all"], "reconnects": -1}).encode())
    assert isinstance(request, Subscribe) and request.sub_id == "be22" and request.token is None
    spec = request.spec
    assert (spec.bucket, spec.query, spec.sort, spec.offset, spec.limit, spec.initial) == (
        "eventbucket", {"value": 42}, {"name": 1}, 20, 10, True)
    assert codec.decode(b'{"id": "x", "type": "unsubscribe"}') == Unsubscribe("x")


@pytest.mark.parametrize(("frame", "sub_id", "status", "reason", "message"), [
    (b"{nope", None, 400, "Bad Request", "Invalid message: not JSON"),
    (b"[1]", None, 400, "Bad Request", "Invalid message: a message is a JSON object"),
    (b'{"type": "subscribe"}', None, 400, "Bad Request", "Invalid message: id must be"),
    (b'{"id": "s", "type": "hello"}', "s", 400, "Bad Request", "Invalid message type 'hello'"),
    (b'{"id": "s", "type": "subscribe"}', "s", 400, "Bad Request", "bucket must be"),
    (b'{"id": "s", "type": "subscribe", "bucket": "T", "initial": 1}', "s", 400, "Bad Request", "initial must be"),
    (b'{"id": "s", "type": "subscribe", "bucket": "T", "offset": 500, "sort": "{\\"a\\": 1}"}', "s", 400,
     "Query Not Supported", "Offset + limit may not exceed 500, but offset already was 500."),
    (b'{"id": "s", "type": "subscribe", "bucket": "T", "query": "{\\"$where\\": \\"1\\"}"}', "s", 400,
     "Query Not Supported", "$where is not supported"),
    (b'{"id": "s", "type": "subscribe", "bucket": "T", "matchTypes": ["add"], "operations": ["insert"]}', "s", 400,
     "Bad Request", "Only subscriptions for either operations or matchTypes are allowed."),
])
def test_refused_frames(frame, sub_id, status, reason, message):
    with pytest.raises(ProtocolError) as caught:
        codec.decode(frame)
    error = caught.value
    assert (error.sub_id, error.status, error.reason) == (sub_id, status, reason)
    assert error.message.startswith(message)


def test_server_frames():
    date = "2017-08-17T05:02:46.467Z"
    assert json.loads(codec.encode_result("s", [{"id": "/db/T/a"}], date)) == {
        "id": "s", "type": "result", "date": date, "data": [{"id": "/db/T/a"}]}
    assert json.loads(codec.encode_match("s", {"matchType": "add", "operation": "insert", "data": {}, "index": 0},
                                         date)) == {
        "id": "s", "type": "match", "date": date, "matchType": "add", "operation": "insert", "data": {}, "index": 0}
    assert json.loads(codec.encode_error("s", codec.too_many(20, "s"), date)) == {
        "id": "s", "type": "error", "date": date, "status": 429,
        "error": {"message": "Too many active subscriptions (only 20 allowed)!", "status": 429,
                  "reason": "Too Many Requests"}}
    assert "id" not in json.loads(codec.encode_error(None, ProtocolError("x"), date))


def test_rest_helpers():
    assert codec.parse_object_path("Todo", 256) == ("Todo", None)
    assert codec.parse_object_path("Todo/a%20b", 256) == ("Todo", "a b")
    assert codec.if_match('"3"') == "3" and codec.if_match('W/"4"') == "4" and codec.if_match("*") == "*"
    assert codec.if_match(None) is None
    assert codec.key_from_insert("Todo", {"id": "/db/Todo/k"}, 256) == "k"
    assert codec.key_from_insert("Todo", {"id": "k2"}, 256) == "k2"
    assert codec.key_from_insert("Todo", {}, 256) is None
    for call in (lambda: codec.parse_object_path("9x", 256), lambda: codec.if_match("abc"),
                 lambda: codec.key_from_insert("Todo", {"id": "/db/Other/k"}, 256),
                 lambda: codec.decode_object(b"[]", 100), lambda: codec.parse_object_path("T/" + "k" * 300, 256)):
        with pytest.raises(RestError):
            call()
    with pytest.raises(RestError) as caught:
        codec.decode_object(b"{}" * 100, 100)
    assert caught.value.status == 413
    assert json.loads(codec.error_body(412, "m")) == {
        "message": "m", "reason": "Precondition Failed", "className": "baqend.error.ObjectOutOfDate", "status": 412}


def test_document_and_query_shards_start_only_with_the_dialect():
    from router.settings import load_settings
    from gateways.dialects import shard_kinds

    assert shard_kinds(load_settings()) == ("session", "topic", "registry", "document", "query")
    assert shard_kinds(load_settings(baqend={"enabled": False})) == ("session", "topic", "registry")


def test_a_match_frame_is_its_subscriptions_prefix_and_a_body_shared_by_every_subscription():
    date = "2017-08-17T05:02:46.467Z"
    fields = {"matchType": "add", "operation": "insert", "data": {"id": "/db/T/a", "n": 1}, "index": 0}
    body = codec.match_body(fields, date)
    assert body == b'"type":"match","date":"2017-08-17T05:02:46.467Z","matchType":"add","operation":"insert",' \
                   b'"data":{"id":"/db/T/a","n":1},"index":0}'
    for sub_id in ("s", 'q"1\\', "ü\u2028"):  # escaped as JSON, once, in the prefix
        assert codec.match_prefix(sub_id) + body == codec.encode_match(sub_id, fields, date)
        assert json.loads(codec.encode_match(sub_id, fields, date)) == {
            "id": sub_id, "type": "match", "date": date, **fields}


def test_date_now_is_iso_utc_to_the_millisecond_across_second_boundaries():
    from datetime import datetime, timezone

    from gateways.baqend.codec import date_now

    for now_ns in (1_700_000_000_999_999_999, 1_700_000_001_000_000_000, 1_700_000_001_000_999_999,
                   1_700_000_001_001_000_000, 1_600_000_000_123_456_789, 1_700_000_000_999_000_000):
        moment = datetime.fromtimestamp(now_ns // 1_000_000 / 1000, timezone.utc)
        assert date_now(now_ns) == moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
    assert date_now(1_700_000_001_000_000_000) == "2023-11-14T22:13:21.000Z"
    assert len(date_now()) == 24 and date_now().endswith("Z")
