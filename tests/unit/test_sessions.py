"""actors/sessions.py: connection state kept by the session shards."""

from __future__ import annotations

import pytest

from actors.sessions import Session, SessionTable


@pytest.fixture
def table() -> SessionTable:
    return SessionTable()


def test_open_creates_a_session(table):
    session = table.open("s1", "signal", ("g1", 4), "rt/alice", ["send", "receive"], 1_000)
    assert session == Session("s1", "signal", ("g1", 4), "rt/alice", ("send", "receive"), 1_000)
    assert session.registrations == set()
    assert session.subscriptions == set()
    assert table.get("s1") is session
    assert table.get("nope") is None
    assert table.stats() == {"sessions": 1, "by_dialect": {"signal": 1}, "gateways": 1}


def test_record_registrations_and_subscriptions(table):
    table.open("s1", "signal", ("g1", 4), None, [], 1_000)
    assert table.record("s1", "registration", "rt/a", True) is True
    assert table.record("s1", "registration", "rt/b", True) is True
    assert table.record("s1", "subscription", "news", True) is True
    assert table.record("s1", "registration", "rt/a", False) is True
    assert table.record("s1", "subscription", "missing", False) is True  # discarding is safe
    session = table.get("s1")
    assert session.registrations == {"rt/b"}
    assert session.subscriptions == {"news"}
    assert table.record("unknown", "registration", "rt/a", True) is False


def test_reopen_keeps_what_the_session_holds(table):
    table.open("s1", "signal", ("g1", 4), "rt/alice", ["send"], 1_000)
    table.record("s1", "registration", "rt/a", True)
    table.record("s1", "subscription", "news", True)
    again = table.open("s1", "mqtt", ("g2", 9), "rt/bob", ("receive",), 2_000)
    assert again.location == ("g2", 9)
    assert again.dialect == "mqtt"
    assert again.identity == "rt/bob"
    assert again.capabilities == ("receive",)
    assert again.opened_at == 2_000
    assert again.registrations == {"rt/a"}
    assert again.subscriptions == {"news"}
    assert table.get("s1") is again
    # Re-bound to g2: g1 holds nothing any more.
    assert table.stats() == {"sessions": 1, "by_dialect": {"mqtt": 1}, "gateways": 1}
    assert table.purge_gateway("g1") == []
    assert table.get("s1") is again


def test_close(table):
    table.open("s1", "signal", ("g1", 4), None, [], 1_000)
    table.open("s2", "signal", ("g1", 5), None, [], 1_000)
    closed = table.close("s1")
    assert closed is not None and closed.session_id == "s1"
    assert table.get("s1") is None
    assert table.close("s1") is None
    assert table.stats() == {"sessions": 1, "by_dialect": {"signal": 1}, "gateways": 1}
    table.close("s2")
    assert table.stats() == {"sessions": 0, "by_dialect": {}, "gateways": 0}


def test_close_then_reopen_starts_empty(table):
    table.open("s1", "signal", ("g1", 4), None, [], 1_000)
    table.record("s1", "registration", "rt/a", True)
    table.close("s1")
    fresh = table.open("s1", "signal", ("g1", 4), None, [], 2_000)
    assert fresh.registrations == set()


def test_purge_gateway_returns_its_sessions_sorted(table):
    for number, session_id in enumerate(("s3", "s1", "s5", "s0", "s4", "s6")):
        table.open(session_id, "signal", ("g1", number), None, [], 1)
    table.open("s2", "mqtt", ("g2", 2), None, [], 1)
    purged = table.purge_gateway("g1")
    assert [s.session_id for s in purged] == ["s0", "s1", "s3", "s4", "s5", "s6"]
    assert table.get("s1") is None
    assert table.get("s2") is not None
    assert table.stats() == {"sessions": 1, "by_dialect": {"mqtt": 1}, "gateways": 1}
    assert table.purge_gateway("g1") == []


def test_stats_by_dialect(table):
    table.open("s1", "signal", ("g1", 1), None, [], 1)
    table.open("s2", "signal", ("g2", 2), None, [], 1)
    table.open("s3", "mqtt", ("g2", 3), None, [], 1)
    table.open("s4", "stomp", ("g3", 4), None, [], 1)
    assert table.stats() == {
        "sessions": 4,
        "by_dialect": {"signal": 2, "mqtt": 1, "stomp": 1},
        "gateways": 3,
    }
