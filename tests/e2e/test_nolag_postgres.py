"""NoLag with ``store.url`` on PostgreSQL, over real sockets: the keys (and their monthly usage),
the message log and the actors' kept sessions are in the database, none under ``data_dir``.

``pg_nolag``: two gateways, one shard of each kind, on a fresh schema of the session's
throwaway PostgreSQL server (tests/pg.py).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import msgpack
import psycopg
import pytest

from actors.nolag.keys import PostgresKeyStore, month_of, open_key_store
from tests.e2e.client import run
from tests.e2e.conftest import RunningRouter, start_router
from tests.e2e.nolag_client import Client, NolagRouter

pytestmark = pytest.mark.e2e

PROJECT = "proj_pg"
SQLITE_FILES = ("keys.sqlite3", "nolag-log.sqlite3", "nolag-actors.sqlite3")


class PgRouter(NolagRouter):
    """Its key store is the one `router keys create` opens with the router's settings: PostgreSQL."""

    def __init__(self, running: RunningRouter, url: str, data_dir: Path) -> None:
        super().__init__(running, PROJECT)
        self.url, self.data_dir = url, data_dir

    def rows(self, query: str) -> list[tuple]:
        with psycopg.connect(self.url) as connection:
            return connection.execute(query).fetchall()


@pytest.fixture(scope="module")
def pg_nolag(ray_runtime, postgres_server, tmp_path_factory) -> PgRouter:
    url = postgres_server.fresh_url()
    data_dir = tmp_path_factory.mktemp("nolag-pg-data")
    running = start_router(
        namespace="e2e-nolag-pg", data_dir=data_dir, port=0, gateways=2, ray_dashboard=False,
        shards={"session": 1, "topic": 1, "registry": 1}, signal={"enabled": False}, cashu={"enabled": False},
        mx={"enabled": False}, baqend={"enabled": False}, analytics={"enabled": False},
        gateway={"sweep_interval_s": 0.1}, nolag={"revocation_poll_s": 0.2}, store={"url": url},
    )
    yield PgRouter(running, url, data_dir)
    running.router.stop()


def key_id_of(token: str) -> str:
    return token.split("_", 2)[2].split(".")[0]


def test_a_key_created_in_postgresql_authenticates_counts_its_quota_there_and_is_revoked(pg_nolag):
    assert type(pg_nolag.keys) is PostgresKeyStore
    token, record = pg_nolag.keys.create(PROJECT, monthly_quota=3)
    topic = "chat/pg/quota"

    async def scenario():
        wrong = await Client.open(pg_nolag.urls[0])
        await wrong.send({"type": "auth", "token": token[:-1] + ("A" if token[-1] != "A" else "B")})
        assert await wrong.recv() == {"type": "auth", "success": False, "error": "access_denied"}
        await asyncio.wait_for(wrong.ws.wait_closed(), 10)

        client = await Client.open(pg_nolag.urls[1])
        # sent together: the subscribe waits behind the auth while the gateway reads the key (it is
        # not refused as not authenticated); the two replies come from two shards, in either order
        await client.send({"type": "auth", "token": token, "reconnect": False, "projectId": PROJECT})
        await client.send({"type": "subscribe", "topic": topic, "qos": 0})
        replies = sorted([await client.recv(), await client.recv()], key=lambda reply: reply["type"])
        assert replies == [{"type": "auth", "success": True, "actorTokenId": f"actor_{record.key_id}",
                            "projectId": PROJECT, "protocolVersion": 1, "restoredSubscriptions": []},
                           {"type": "subscribed", "topic": topic, "loadBalance": False}]
        for n in range(4):
            await client.publish(topic, n, qos=0, echo=False, msgRef=n)
        # keyed by msgRef: the refusal (the gateway's, once the store says the quota is used up)
        # may come before the topic shard's acks of the three accepted publishes
        replies = {reply["msgRef"]: reply for reply in [await client.recv() for _ in range(4)]}
        assert [replies[n] for n in range(3)] == [{"type": "published", "topic": topic, "msgRef": n}
                                                  for n in range(3)]
        assert {key: value for key, value in replies[3].items() if key != "hint"} == {
            "type": "error", "error": "monthly_quota_exceeded", "code": 42920, "topic": topic, "msgRef": 3}
        assert pg_nolag.keys.usage(record.key_id, month_of(time.time())) == 3

        other = open_key_store(pg_nolag.running.settings)  # another process's store: `router keys revoke`
        assert other.revoke(record.key_id)
        assert await client.recv() == {"type": "disconnect", "reason": "token_invalid"}
        await asyncio.wait_for(client.ws.wait_closed(), 10)

    run(scenario())
    assert pg_nolag.rows(f"SELECT project_id, monthly_quota, revoked_at IS NOT NULL FROM nolag_keys "
                         f"WHERE key_id = '{record.key_id}'") == [(PROJECT, 3, True)]
    assert not any((pg_nolag.data_dir / name).exists() for name in SQLITE_FILES)


def test_a_qos1_message_is_replayed_after_a_reconnect_from_the_postgresql_log(pg_nolag):
    token, record = pg_nolag.keys.create(PROJECT)
    publisher_token, _ = pg_nolag.keys.create(PROJECT)
    topic = "chat/pg/replay"
    actor = f"actor_{record.key_id}"

    async def scenario():
        sub = await Client.open(pg_nolag.urls[0], token)
        await sub.subscribe(topic, qos=1)
        pub = await Client.open(pg_nolag.urls[1], publisher_token)
        await pub.subscribe(topic, qos=0)
        await sub.ws.close()  # away
        for n in range(3):
            await pub.publish(topic, f"missed {n}", qos=1, echo=False, msgRef=n)
            assert await pub.recv() == {"type": "published", "topic": topic, "msgRef": n}
        back = await Client.open(pg_nolag.urls[1], None)  # the other gateway
        await back.send({"type": "auth", "token": token, "reconnect": True})
        auth = await back.recv()
        assert auth["success"] is True and auth["restoredSubscriptions"] == [topic]
        start = await back.expect("replayStart")
        assert start["count"] == 3
        replayed = [await back.recv() for _ in range(3)]
        assert [(m["data"], m["isReplay"], m["requiresAck"]) for m in replayed] == [
            (f"missed {n}", True, True) for n in range(3)]
        assert await back.recv() == {"type": "replayEnd", "replayed": 3}
        await back.send({"type": "batchAck", "msgIds": [m["msgId"] for m in replayed]})
        await back.quiet()
        for client in (back, pub):
            await client.close()
        return [m["msgId"] for m in replayed]

    msg_ids = run(scenario())
    segments = pg_nolag.rows(f"SELECT records FROM nolag_message_segments WHERE topic = 'nolag/{PROJECT}/{topic}' "
                             "ORDER BY seq")
    logged = [(msg_id, qos) for (packed,) in segments for msg_id, _, _, qos, _ in msgpack.unpackb(packed)]
    assert logged == [(msg_id, 1) for msg_id in msg_ids]
    assert pg_nolag.rows(f"SELECT topic, qos FROM nolag_subscriptions WHERE actor = '{actor}'") == [(topic, 1)]
    assert not any((pg_nolag.data_dir / name).exists() for name in SQLITE_FILES)


def test_a_key_revoked_from_a_machine_whose_clock_is_behind_still_disconnects_its_sessions(pg_nolag):
    """On a cluster `router keys revoke` runs on any machine: its clock may be behind the gateway's.
    The revocation must reach the live sessions anyway (the gateway asks which of its sessions'
    keys are revoked; it does not compare two machines' clocks)."""
    token, record = pg_nolag.keys.create(PROJECT)

    async def scenario():
        client = await Client.open(pg_nolag.urls[0])
        await client.send({"type": "auth", "token": token, "reconnect": False, "projectId": PROJECT})
        assert (await client.recv())["success"] is True
        behind = open_key_store(pg_nolag.running.settings, clock=lambda: time.time() - 3600)
        assert behind.revoke(record.key_id)
        assert await asyncio.wait_for(client.recv(), 15) == {"type": "disconnect", "reason": "token_invalid"}
        await asyncio.wait_for(client.ws.wait_closed(), 10)

    run(scenario())
