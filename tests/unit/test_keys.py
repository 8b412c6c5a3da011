"""actors/nolag/keys.py: tokens, hashed secrets, ACL patterns, revocation, monthly quota, the CLI.

The store's tests take ``store_settings`` and open the store with ``open_key_store``: each runs on
SQLite and on PostgreSQL.
"""

from __future__ import annotations

import calendar
import json
import re
import sqlite3
import threading

import psycopg
import pytest

from router import cli
from router.settings import load_settings
from actors.nolag.keys import (AclError, KeyRecord, KeyStore, PostgresKeyStore, SqliteKeyStore, month_of,
                               open_key_store, parse_pattern, parse_token, pattern_matches)


class Clock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(store_settings, clock) -> KeyStore:
    keys = open_key_store(store_settings, clock)
    yield keys
    keys.close()


def test_the_factory_picks_the_backend(store_settings, store):
    if store_settings.store.postgres is None:
        assert type(store) is SqliteKeyStore and store.path == store_settings.data_dir / "keys.sqlite3"
    else:
        assert type(store) is PostgresKeyStore
        assert not (store_settings.data_dir / "keys.sqlite3").exists()


def test_create_returns_a_token_that_verifies(store, clock):
    token, record = store.create("proj_1")
    match = re.fullmatch(r"at_live_([0-9a-f]{16})\.([A-Za-z0-9_-]{43})", token)
    assert match is not None and match.group(1) == record.key_id
    assert record == KeyRecord(record.key_id, "live", "proj_1", ("#",), ("#",), 50, None, clock.now, None)
    assert store.verify(token) == record
    sandbox_token, sandbox = store.create("proj_2", "sandbox", ["chat/#"], ["chat/*/messages"], 10, 1000)
    assert sandbox_token.startswith(f"at_sandbox_{sandbox.key_id}.")
    assert store.verify(sandbox_token) == KeyRecord(sandbox.key_id, "sandbox", "proj_2", ("chat/#",),
                                                    ("chat/*/messages",), 10, 1000, clock.now, None)


def test_only_a_salted_hash_of_the_secret_is_stored(store, store_settings, clock):
    token, record = store.create("p")
    clock.now += 1
    other_token, _ = store.create("p")
    secret = token.split(".")[1]
    url = store_settings.store.postgres
    if url is None:
        path = store_settings.data_dir / "keys.sqlite3"
        raw = path.read_bytes() + path.with_name("keys.sqlite3-wal").read_bytes()
        db = sqlite3.connect(path)
        rows = db.execute("SELECT * FROM keys ORDER BY created_at").fetchall()
        db.close()
    else:
        with psycopg.connect(url) as db:
            rows = db.execute("SELECT * FROM nolag_keys ORDER BY created_at").fetchall()
        raw = repr(rows).encode()
    assert secret.encode() not in raw and secret not in repr(rows)
    (salt_a, hash_a), (salt_b, hash_b) = [(bytes(row[3]), bytes(row[4])) for row in rows]
    assert len(salt_a) == 16 and len(hash_a) == 32 and salt_a != salt_b and hash_a != hash_b


def test_verify_refuses_every_wrong_token(store):
    token, record = store.create("p")
    head, secret = token.split(".")
    wrong = [
        "", "at_live_", head, head + ".", f"{head}.{secret}.x", f"{head}.{secret[:-1]}",
        f"{head}.{secret}x", token.replace("at_live_", "at_sandbox_"), token.replace("at_live_", "at_test_"),
        token.replace("at_live_", "live_"), f"at_live_{'0' * 16}.{secret}", f"at_live_{record.key_id.upper()}.{secret}",
        f"at_live_{record.key_id}0.{secret}", None, 5,
    ]
    assert [store.verify(candidate) for candidate in wrong] == [None] * len(wrong)
    assert store.verify(token) == record


def test_parse_token_splits_on_the_dot():
    assert parse_token("at_live_0123456789abcdef.s3cr-et_") == ("live", "0123456789abcdef", "s3cr-et_")
    assert parse_token("at_sandbox_0123456789abcdef.x") == ("sandbox", "0123456789abcdef", "x")
    assert parse_token("at_live_0123456789abcdef.a.b") is None
    assert parse_token("at_live_0123456789abcde.x") is None


def test_revoke_and_revoked_among(store, clock):
    first_token, first = store.create("p")
    _, second = store.create("p")
    _, third = store.create("p")
    clock.now += 10
    assert store.revoke(first.key_id) is True
    assert store.revoke(first.key_id) is False
    assert store.revoke("0000000000000000") is False
    assert store.verify(first_token) is None
    assert store.get(first.key_id).revoked_at == clock.now
    assert store.revoked_among([]) == []
    assert store.revoked_among([second.key_id, third.key_id]) == []
    store.revoke(second.key_id)
    # unknown keys count as revoked (a key deleted from the store ends its sessions too)
    assert store.revoked_among([third.key_id, second.key_id, first.key_id, "0000000000000000"]) == sorted(
        ["0000000000000000", first.key_id, second.key_id])


def test_revoked_among_asks_about_any_number_of_keys(store):
    keys = [store.create("p")[1].key_id for _ in range(3)]
    store.revoke(keys[1])
    many = [f"{n:016x}" for n in range(1200)] + keys  # more than one query's worth
    assert store.revoked_among(many) == sorted(set(many) - {keys[0], keys[2]})

def test_list_has_no_secrets_and_is_in_creation_order(store, clock):
    _, a = store.create("p1")
    clock.now += 1
    _, b = store.create("p2", "sandbox", monthly_quota=5)
    assert store.list() == [a, b]
    assert "secret" not in json.dumps([record.to_dict() for record in store.list()])
    assert b.to_dict() == {"key_id": b.key_id, "environment": "sandbox", "project_id": "p2", "publish": ["#"],
                           "subscribe": ["#"], "rate_limit_per_s": 50, "monthly_quota": 5,
                           "created_at": clock.now, "revoked_at": None}


@pytest.mark.parametrize("kwargs, message", [
    ({"environment": "prod"}, "environment must be one of ('live', 'sandbox'), not 'prod'"),
    ({"project_id": ""}, "project_id must be a non-empty string"),
    ({"rate_limit_per_s": 0}, "rate_limit_per_s must be positive"),
    ({"monthly_quota": -1}, "monthly_quota must be 0 or more (None: unlimited)"),
    ({"publish": ["a/#/b"]}, "ACL pattern 'a/#/b': '#' is allowed only as the last segment"),
    ({"subscribe": ["a//b"]}, "ACL pattern 'a//b': segment '' must be '*', '+', '#' or letters, digits, '_', '.', '-'"),
    ({"subscribe": ["a/b*/c"]}, "ACL pattern 'a/b*/c': segment 'b*' must be '*', '+', '#' or letters, digits, '_', "
                                "'.', '-'"),
    ({"publish": [""]}, "an ACL pattern must be a non-empty string"),
])
def test_create_refusals(store, kwargs, message):
    arguments = {"project_id": "p", **kwargs}
    with pytest.raises(ValueError) as caught:
        store.create(**arguments)
    assert str(caught.value) == message
    assert store.list() == []


@pytest.mark.parametrize("pattern, topic, allowed", [
    ("#", "a/b/c", True),
    ("chat/#", "chat/general/messages", True),
    ("chat/#", "chat", False),
    ("chat/#", "chats/general/messages", False),
    ("chat/general/#", "chat/general/messages", True),
    ("chat/*/messages", "chat/general/messages", True),
    ("chat/+/messages", "chat/general/messages", True),
    ("chat/*/messages", "chat/general/typing", False),
    ("chat/*/messages", "chat/general/messages/x", False),
    ("chat/*", "chat/general/messages", False),
    ("*/*/*", "a/b/c", True),
    ("*/*/*", "a/b", False),
    ("chat/general/messages", "chat/general/messages", True),
    ("chat/general/messages", "chat/general/Messages", False),
    ("chat/gen.ral/messages", "chat/general/messages", False),  # '.' is literal
])
def test_acl_patterns(pattern, topic, allowed):
    assert pattern_matches(pattern, topic) is allowed


def test_acl_parse_and_record_checks():
    assert parse_pattern("a/+/#") == ("a", "*", "#")
    with pytest.raises(AclError):
        parse_pattern("#/a")
    record = KeyRecord("k", "live", "p", ("chat/*/messages", "news/#"), ("chat/#",), 50, None, 0.0)
    assert record.can_publish("chat/room1/messages") and record.can_publish("news/x/y")
    assert not record.can_publish("chat/room1/typing")
    assert record.can_subscribe("chat/room1/typing") and not record.can_subscribe("news/x/y")
    assert not KeyRecord("k", "live", "p", (), (), 50, None, 0.0).can_publish("a/b/c")


def test_month_of_is_utc():
    assert month_of(calendar.timegm((2024, 1, 31, 23, 59, 59))) == "2024-01"
    assert month_of(calendar.timegm((2024, 2, 1, 0, 0, 0))) == "2024-02"


def test_consume_counts_per_calendar_month(store):
    _, record = store.create("p", monthly_quota=10)
    january = calendar.timegm((2024, 1, 31, 23, 59, 59))
    february = january + 1
    assert store.consume(record.key_id, 4, january) is True
    assert store.consume(record.key_id, 6, january) is True
    assert store.consume(record.key_id, 1, january) is False
    assert store.usage(record.key_id, "2024-01") == 10
    assert store.consume(record.key_id, 11, february) is False
    assert store.usage(record.key_id, "2024-02") == 0
    assert store.consume(record.key_id, 10, february) is True
    assert store.consume(record.key_id, 1, february) is False


def test_consume_unlimited_unknown_and_zero_quota(store, clock):
    _, unlimited = store.create("p")
    _, blocked = store.create("p", monthly_quota=0)
    assert store.consume(unlimited.key_id, 1_000_000) is True
    assert store.consume(unlimited.key_id) is True
    assert store.usage(unlimited.key_id, month_of(clock.now)) == 1_000_001
    assert store.consume(blocked.key_id) is False
    assert store.consume(blocked.key_id, 0) is True
    assert store.consume("0000000000000000") is False
    with pytest.raises(ValueError):
        store.consume(unlimited.key_id, -1)


def test_two_processes_share_the_store(store_settings, clock):
    one = open_key_store(store_settings, clock)
    two = open_key_store(store_settings, clock)
    token, record = one.create("p", monthly_quota=3)
    assert two.verify(token) == record and two.list() == [record]
    assert one.consume(record.key_id, 2) and not two.consume(record.key_id, 2) and two.consume(record.key_id, 1)
    assert one.usage(record.key_id, month_of(clock.now)) == 3
    assert two.revoke(record.key_id) and one.verify(token) is None
    assert one.revoked_among([record.key_id]) == [record.key_id]
    if store_settings.store.postgres is None:
        assert one._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    one.close()
    two.close()


def test_a_reopened_store_keeps_keys_and_usage(store_settings, clock):
    first = open_key_store(store_settings, clock)
    token, record = first.create("p", monthly_quota=5)
    assert first.consume(record.key_id, 4)
    first.close()
    again = open_key_store(store_settings, clock)
    assert again.verify(token) == record
    assert again.usage(record.key_id, month_of(clock.now)) == 4
    assert not again.consume(record.key_id, 2) and again.consume(record.key_id, 1)
    again.close()


def test_concurrent_consumers_never_exceed_the_quota(store_settings, clock):
    """Two store objects (two gateways) consume one message at a time from 4 threads at once:
    exactly the quota is granted, and the usage is exactly the quota."""
    stores = [open_key_store(store_settings, clock) for _ in range(2)]
    _, record = stores[0].create("p", monthly_quota=150)
    granted = [0] * 4
    start = threading.Barrier(4, timeout=30)

    def consume(index: int) -> None:
        store = stores[index % 2]
        start.wait()
        for _ in range(60):
            granted[index] += store.consume(record.key_id, 1)

    threads = [threading.Thread(target=consume, args=(index,)) for index in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    assert sum(granted) == 150
    assert stores[1].usage(record.key_id, month_of(clock.now)) == 150
    assert stores[0].consume(record.key_id, 0) and not stores[1].consume(record.key_id, 1)
    for store in stores:
        store.close()


def _store_env(monkeypatch, store_settings) -> None:
    """`router keys` reads its settings from the environment: the same store as ``store_settings``."""
    monkeypatch.setenv("ROUTER_DATA_DIR", str(store_settings.data_dir))
    monkeypatch.delenv("ROUTER_CONFIG", raising=False)
    if store_settings.store.postgres is None:
        monkeypatch.delenv("ROUTER_STORE__URL", raising=False)
    else:
        monkeypatch.setenv("ROUTER_STORE__URL", store_settings.store.postgres)


def test_cli_create_list_revoke(store_settings, monkeypatch, capsys):
    _store_env(monkeypatch, store_settings)
    assert cli.main(["keys", "create", "--project", "proj_1", "--sandbox", "--publish", "chat/*/messages", "news/#",
                     "--rate-limit", "20", "--monthly-quota", "500"]) == 0
    out = capsys.readouterr().out.splitlines()
    key_id = out[0].removeprefix("key id: ")
    token = out[1].removeprefix("token:  ")
    store = open_key_store(store_settings)
    record = store.verify(token)
    assert (record.key_id, record.environment, record.project_id, record.publish, record.subscribe,
            record.rate_limit_per_s, record.monthly_quota) == (
        key_id, "sandbox", "proj_1", ("chat/*/messages", "news/#"), ("#",), 20, 500)
    assert cli.main(["keys", "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [item["key_id"] for item in listed] == [key_id] and token.split(".")[1] not in json.dumps(listed)
    assert cli.main(["keys", "list"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert len(table) == 2 and table[1].startswith(f"{key_id}  sandbox  proj_1")
    assert cli.main(["keys", "revoke", key_id]) == 0
    assert capsys.readouterr().out == f"revoked {key_id}\n"
    assert store.verify(token) is None
    assert cli.main(["keys", "revoke", key_id]) == 1
    assert capsys.readouterr().err == f"router keys revoke: no active key {key_id!r}\n"
    assert cli.main(["keys", "create", "--project", "p", "--subscribe", "#/x"]) == 2
    assert capsys.readouterr().err == "router keys create: ACL pattern '#/x': '#' is allowed only as the last segment\n"
    store.close()


def test_cli_writes_the_store_the_gateway_reads(tmp_path, monkeypatch, capsys):
    """`nolag.keys_path` moves the SQLite key store: `router keys` must write where the gateway reads."""
    monkeypatch.setenv("ROUTER_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("ROUTER_NOLAG__KEYS_PATH", str(tmp_path / "elsewhere" / "keys.db"))
    monkeypatch.delenv("ROUTER_CONFIG", raising=False)
    monkeypatch.delenv("ROUTER_STORE__URL", raising=False)
    (tmp_path / "elsewhere").mkdir()
    assert cli.main(["keys", "create", "--project", "proj_1"]) == 0
    token = capsys.readouterr().out.splitlines()[1].removeprefix("token:  ")
    store = open_key_store(load_settings())  # as the gateway opens it
    assert store.path == tmp_path / "elsewhere" / "keys.db"
    assert store.verify(token).project_id == "proj_1"
    assert not (tmp_path / "data" / "keys.sqlite3").exists()
    store.close()
