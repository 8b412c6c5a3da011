"""gateways/baqend/session.py: match events from the query shards become frames, each with its
subscription's id; equal queries' events (one list) are encoded once for all of them."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any
from unittest import mock

from actors.baqend.contract import matches
from gateways.baqend import codec
from gateways.baqend.config import BaqendConfig
from gateways.baqend.session import BaqendDialect, BaqendSession, _Subscription

DATE = "2026-12-05T12:00:00.000Z"


class Gateway:
    shards = SimpleNamespace(view=lambda timeout: None)  # no shard is asked anything here
    settings = SimpleNamespace(gateway=SimpleNamespace(request_timeout_s=1.0))

    def __init__(self) -> None:
        self.accounted: list[tuple] = []

    def account_delivery(self, meta: tuple, nbytes: int, connection_id: int, sent: bool) -> None:
        self.accounted.append((meta, nbytes, connection_id, sent))


class Wire:
    def __init__(self, connection_id: int) -> None:
        self.id = connection_id
        self.frames: list[bytes] = []

    def send_text(self, frame: bytes) -> bool:
        self.frames.append(frame)
        return True


def session_with(gateway: Gateway, dialect: BaqendDialect, connection_id: int, *sub_ids: str) -> BaqendSession:
    session = BaqendSession(dialect, Wire(connection_id))
    for sub_id in sub_ids:
        sub = _Subscription(sub_id, f"key-{sub_id}", SimpleNamespace(), None, ("meta",), "client", None, frozenset())
        session.subs[sub_id] = session.by_key[sub.key] = sub
    return session


def event(key: str, n: int) -> dict[str, Any]:
    return {"matchType": "add", "operation": "insert", "data": {"id": f"/db/T/{key}", "version": 1, "n": n}}


def test_equal_queries_events_get_each_subscriptions_id_and_a_new_list_or_date_is_encoded_again():
    gateway = Gateway()
    dialect = BaqendDialect(gateway, BaqendConfig())
    first = session_with(gateway, dialect, 1, "a", 'b"')
    second = session_with(gateway, dialect, 2, "c")
    shared = [event("x", 1), event("y", 2)]
    meta = ("write", 1)
    with mock.patch.object(codec, "date_now", return_value=DATE), \
            mock.patch.object(codec, "match_body", wraps=codec.match_body) as body:
        for session, sub_id in ((first, "a"), (first, 'b"'), (second, "c")):
            session.on_event(matches(f"key-{sub_id}", shared, meta))
        assert body.call_count == 2  # one per event, for all three subscriptions
        # another list with the same fields, then the same list at another date: encoded again
        second.on_event(matches("key-c", [event("x", 1)], meta))
        assert body.call_count == 3
    with mock.patch.object(codec, "date_now", return_value="2026-12-05T12:00:00.001Z"):
        second.on_event(matches("key-c", shared, meta))
    assert first.wire.frames == [codec.encode_match(sub_id, fields, DATE) for sub_id in ("a", 'b"')
                                 for fields in shared]
    assert second.wire.frames[:3] == [codec.encode_match("c", fields, DATE) for fields in shared + [event("x", 1)]]
    assert [json.loads(frame)["date"] for frame in second.wire.frames[3:]] == ["2026-12-05T12:00:00.001Z"] * 2
    assert json.loads(first.wire.frames[2]) == {"id": 'b"', "type": "match", "date": DATE, **event("x", 1)}
    assert dialect.matches == 9
    assert [(connection_id, nbytes) for _, nbytes, connection_id, _ in gateway.accounted] == [
        (wire.id, len(frame)) for wire in (first.wire, second.wire) for frame in wire.frames]
