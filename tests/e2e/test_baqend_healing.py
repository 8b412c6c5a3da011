"""Baqend live queries heal when a shard dies (docs/baqend.md, "Restarts and failures").

A query shard killed with SIGKILL comes back empty: each gateway registers every live query again
with what its client holds, and the client gets exactly the events that bring its result to the
database as it is now, never a second result. A document shard killed keeps every acknowledged
write (SQLite), and the live queries go on. Each test measures the healing time: from the kill
until a write made after it reaches every subscriber that did nothing meanwhile (< 5 s).

``healing``: two gateways (subscribers on both), four document shards, one query shard (so every
live query is on the shard that dies). The writes made while the query shard is down go to
distinct document shards at once: each is stored at once (a document shard's batch waits for the
query shards only after it stored its writes), so all are stored before the shard is back, and
what the clients get does not depend on how fast Ray restarts it.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import time
from typing import Any

import pytest
import ray

from actors.baqend.contract import object_key
from router.shardmap import shard_index
from tests.e2e.baqend_client import Events, Rest, brief, key_of
from tests.e2e.client import eventually, run
from tests.e2e.conftest import RunningRouter, start_router
from tests.e2e.kills import HealingTimes, kill_shard, shard_info, threads_stopped
from tests.e2e.test_baqend import SCHEMA, urls

pytestmark = pytest.mark.e2e

HEALING = HealingTimes()  # printed at the end of the module


@pytest.fixture(scope="module")
def healing(ray_runtime, tmp_path_factory) -> RunningRouter:
    running = start_router(
        namespace="e2e-baqend-healing", data_dir=tmp_path_factory.mktemp("baqend-healing"), port=0, gateways=2,
        ray_dashboard=False, shards={"session": 1, "topic": 1, "registry": 1, "document": 4, "query": 1},
        signal={"enabled": False}, cashu={"enabled": False}, mx={"enabled": False}, nolag={"enabled": False},
        analytics={"enabled": False},
        baqend={"schema": SCHEMA, "rest_rate_limit_per_minute": 6_000_000, "rest_rate_limit_burst": 100_000,
                "subscribe_rate_limit_per_minute": 6_000_000, "subscribe_rate_limit_burst": 100_000},
    )
    yield running
    running.router.stop()
    HEALING.report("Baqend")


_buckets = itertools.count(1)


def fresh_bucket() -> str:
    return f"Heal{next(_buckets)}x{time.monotonic_ns()}"


def placed(running: RunningRouter, bucket: str, key: str) -> int:
    """The document shard that owns ``key`` of ``bucket``."""
    return shard_index(object_key(bucket, key), len(running.router.shards["document"]))


def spread_bucket(running: RunningRouter, keys: list[str]) -> str:
    """A fresh bucket in which each of ``keys`` is on a document shard of its own."""
    while True:
        bucket = fresh_bucket()
        if len({placed(running, bucket, key) for key in keys}) == len(keys):
            return bucket


def resynced(running: RunningRouter) -> list[int]:
    """How many live queries each gateway registered again after a restart."""
    return [ray.get(record.actor.stats.remote(), timeout=30)["dialects"]["baqend"]["resynced"]
            for record in running.router.gateways]


async def all_loaded(running: RunningRouter, queries: int) -> None:
    """The query shard holds ``queries`` live queries, none still reading pages."""
    async def loaded():
        info = await asyncio.to_thread(shard_info, running.router, "query")
        return info["queries"] == queries and info["loading"] == 0

    await eventually(loaded, timeout=15)


async def written(call: Any) -> Any:
    """A write made while its document shard may be dead: a 503 (the request met the dying
    process) means send it again, as a client would."""
    deadline = time.monotonic() + 15
    while True:
        status, body = await call()
        if status != 503:
            return status, body
        assert time.monotonic() < deadline, body


async def setup(rest: Rest, bucket: str) -> dict[str, dict]:
    return {f"d{n}": await rest.insert(bucket, f"d{n}", n=n, on=True, name=f"d{n}") for n in range(10, 80, 10)}


SUBSCRIPTIONS = {
    "plain": dict(query={"on": True}, initial=True),
    "window": dict(query={"on": True}, sort={"n": 1}, offset=2, limit=3, initial=True),
    "stream": dict(query={"on": True}, initial=False),
    "matches": dict(query={"on": True}, sort={"n": 1}, offset=2, limit=3, initial=True, matchTypes=["match"]),
}


async def subscribe_all(running: RunningRouter, bucket: str, clients: list[Events]) -> None:
    """One connection per gateway (added to ``clients``), each with every subscription; returns
    once all are loaded."""
    await all_loaded(running, 0)  # the tests before closed theirs
    for events_url, _ in urls(running):
        client = await Events.open(events_url)
        clients.append(client)
        for sub_id, fields in SUBSCRIPTIONS.items():
            await client.subscribe(sub_id, bucket, **json.loads(json.dumps(fields)))
        results = {}
        for _ in range(3):
            frame = await client.recv()
            assert frame["type"] == "result", frame
            results[frame["id"]] = [key_of(d) for d in frame["data"]]
        assert sorted(results["plain"]) == [f"d{n}" for n in range(10, 80, 10)]
        assert results["window"] == results["matches"] == ["d30", "d40", "d50"]
    await all_loaded(running, len(SUBSCRIPTIONS) * len(clients))


def with_clients(scenario: Any) -> None:
    """Run ``scenario(clients)``, bounded in time; the connections it opened are closed after it."""
    async def bounded():
        clients: list[Events] = []
        try:
            await scenario(clients)
        finally:
            for client in clients:
                await client.close()

    run(bounded(), timeout=90)


async def received(client: Events, count: int) -> dict[str, list[tuple]]:
    """The next ``count`` match frames, per subscription id."""
    found: dict[str, list[tuple]] = {}
    for _ in range(count):
        frame = await client.recv()
        assert frame["type"] == "match", frame  # never a second result
        found.setdefault(frame["id"], []).append(brief(frame))
    return found


# -- a query shard dies ------------------------------------------------------------------------------


def test_a_restarted_query_shard_sends_each_live_query_exactly_what_changed_while_it_was_down(healing):
    """Before: the restarted query shard had forgotten every live query; no client heard of the
    writes made after the kill, nor of any later one."""
    _, (_, rest_url) = urls(healing)

    async def scenario(clients: list[Events]):
        bucket = spread_bucket(healing, ["d35", "d50", "d60", "d20"])
        async with Rest(rest_url) as rest:
            stored = await setup(rest, bucket)
            await subscribe_all(healing, bucket, clients)
            before = resynced(healing)
            killed_at, epoch = kill_shard(healing.router, "query")
            # While it is down and restarting: no live query hears of these writes until it heals.
            d35, _, d60, d20 = await asyncio.gather(
                rest.insert(bucket, "d35", n=35, on=True, name="d35"), rest.delete(bucket, "d50"),
                rest.set(bucket, "d60", name="renamed"), rest.set(bucket, "d20", on=False))
            expected = {
                # removes first (by id), then adds and changes (by id)
                "plain": [("remove", "update", "d20", None), ("remove", "delete", "d50", None),
                          ("add", "insert", "d35", None), ("change", "update", "d60", None)],
                # the window [d30 d40 d50] becomes [d35 d40 d60]: d30 was pushed into the offset
                # zone (unchanged: none), d50 deleted, d35 inserted, d60 renamed while past the limit
                "window": [("remove", "none", "d30", None), ("remove", "delete", "d50", None),
                           ("add", "insert", "d35", 0), ("add", "update", "d60", 2)],
                # no initial result, and none now: the same events as "plain"
                "stream": [("remove", "update", "d20", None), ("remove", "delete", "d50", None),
                           ("add", "insert", "d35", None), ("change", "update", "d60", None)],
                "matches": [("match", "insert", "d35", 0), ("match", "update", "d60", 2)],
            }
            for client in clients:
                frames = [await client.recv() for _ in range(sum(len(events) for events in expected.values()))]
                got: dict[str, list[tuple]] = {}
                for frame in frames:
                    assert frame["type"] == "match", frame  # never a second result
                    got.setdefault(frame["id"], []).append(brief(frame))
                assert got == expected
                data = {(frame["id"], key_of(frame["data"])): frame["data"] for frame in frames}
                assert data["plain", "d20"] == d20  # what it is now: it no longer matches
                assert data["plain", "d50"] == {"id": f"/db/{bucket}/d50"}  # deleted: no version
                assert data["window", "d30"] == stored["d30"]
                assert data["window", "d35"] == d35 and data["window", "d60"] == d60
            await rest.set(bucket, "d40", name="probe")
            for client in clients:  # the next frames: the probe's, in every live query
                assert await received(client, 4) == {
                    "plain": [("change", "update", "d40", None)], "window": [("change", "update", "d40", 1)],
                    "stream": [("change", "update", "d40", None)], "matches": [("match", "update", "d40", 1)]}
            HEALING.healed("query shard", killed_at)
            assert shard_info(healing.router, "query")["epoch"] != epoch
            assert resynced(healing) == [count + len(SUBSCRIPTIONS) for count in before]

    with_clients(scenario)


def test_a_write_made_while_the_query_shard_waits_for_another_gateway_reaches_the_queries_registered_again(
        healing):
    """The restarted query shard serves nothing but re-registrations until every gateway has sent
    its own. A write stored after one gateway's query read its pages, and forwarded while the shard
    still waits for another gateway (stopped here), is refused; before, the document shard dropped
    it, and that query never heard of it."""
    (_, rest_url), _ = urls(healing)

    async def scenario(clients: list[Events]):
        bucket = fresh_bucket()
        async with Rest(rest_url) as rest:
            await setup(rest, bucket)
            await all_loaded(healing, 0)
            for events_url, _ in urls(healing):
                client = await Events.open(events_url)
                clients.append(client)
                await client.subscribe("plain", bucket, query={"on": True}, initial=True)
                assert len(await client.result("plain")) == 7
            await all_loaded(healing, 2)
            stopped = (await asyncio.to_thread(ray.get, healing.router.gateways[1].actor.stats.remote(),
                                               timeout=30))["pid"]

            def pages_read() -> int:
                return sum(shard_info(healing.router, "document", index)["scan_pages"]
                           for index in range(len(healing.router.shards["document"])))

            before = pages_read()
            os.kill(stopped, signal.SIGSTOP)
            try:
                await eventually(lambda: asyncio.to_thread(threads_stopped, stopped), timeout=10)
                kill_shard(healing.router, "query")

                async def registered_again():  # the first gateway's query read a page of each shard
                    return await asyncio.to_thread(pages_read) >= before + len(healing.router.shards["document"])

                await eventually(registered_again, timeout=15)
                assert (await asyncio.to_thread(shard_info, healing.router, "query"))["healing"]  # still waiting
                await rest.insert(bucket, "late", n=1, on=True)
            finally:
                os.kill(stopped, signal.SIGCONT)
            for client in clients:
                assert await received(client, 1) == {"plain": [("add", "insert", "late", None)]}
            await rest.set(bucket, "d10", name="probe")
            for client in clients:
                assert await received(client, 1) == {"plain": [("change", "update", "d10", None)]}

    with_clients(scenario)


def test_a_query_registering_when_its_query_shard_dies_starts_over_and_gets_one_result(healing):
    """Before: the registration that met the dying shard ended the subscription with error 503."""
    (events_url, rest_url), _ = urls(healing)

    async def scenario(clients: list[Events]):
        bucket = fresh_bucket()
        async with Rest(rest_url) as rest:
            stored = await setup(rest, bucket)
            await all_loaded(healing, 0)
            client = await Events.open(events_url)
            clients.append(client)
            pid = shard_info(healing.router, "query")["pid"]
            gateway = healing.router.gateways[0].actor

            async def batches_sent() -> int:
                return (await asyncio.to_thread(ray.get, gateway.stats.remote(), timeout=30))["shard_client"][
                    "lane_batches"]

            os.kill(pid, signal.SIGSTOP)  # the registration waits in it
            try:
                await eventually(lambda: asyncio.to_thread(threads_stopped, pid), timeout=10)
                sent = await batches_sent()
                await client.subscribe("late", bucket, sort={"n": 1}, limit=2, initial=True)

                async def in_flight():
                    return await batches_sent() > sent

                await eventually(in_flight, timeout=10)
            finally:
                os.kill(pid, signal.SIGKILL)
            assert await client.result("late") == [stored["d10"], stored["d20"]]
            await rest.set(bucket, "d10", name="probe")
            assert await received(client, 1) == {"late": [("change", "update", "d10", 0)]}
            await all_loaded(healing, 1)  # and no second registration left behind

    with_clients(scenario)


# -- a document shard dies -------------------------------------------------------------------------


def test_a_restarted_document_shard_keeps_acknowledged_writes_and_live_queries_see_later_ones(healing):
    """Writes acknowledged before the kill are still there after it, and writes made while the
    shard was down and restarting reach every live query exactly once."""
    _, (_, rest_url) = urls(healing)

    async def scenario(clients: list[Events]):
        bucket = fresh_bucket()
        victim = placed(healing, bucket, "d70")
        new_on_victim = next(f"x{i}" for i in itertools.count() if placed(healing, bucket, f"x{i}") == victim)
        new_on_survivor = next(f"x{i}" for i in itertools.count() if placed(healing, bucket, f"x{i}") != victim)
        async with Rest(rest_url) as rest:
            await setup(rest, bucket)
            acknowledged = await rest.set(bucket, "d70", name="acknowledged")
            await subscribe_all(healing, bucket, clients)
            before = resynced(healing)
            killed_at, epoch = kill_shard(healing.router, "document", victim)
            # While it is down and restarting: a new document on it and one on another shard, then
            # a change on the dead one, none of them in the window (past its limit), each seen
            # before the next is made.
            writes = [(new_on_victim, {"id": f"/db/{bucket}/{new_on_victim}", "n": 99, "on": True}, "add", "insert"),
                      (new_on_survivor, {"id": f"/db/{bucket}/{new_on_survivor}", "n": 98, "on": True}, "add",
                       "insert"),
                      ("d70", {"$set": {"n": 71}}, "change", "update")]
            for key, body, match_type, operation in writes:
                path = f"/db/{bucket}" if match_type == "add" else f"/db/{bucket}/{key}"
                status, _ = await written(lambda: rest.call("POST", path, body))
                assert status == (201 if match_type == "add" else 200)
                for client in clients:
                    assert await received(client, 2) == {"plain": [(match_type, operation, key, None)],
                                                         "stream": [(match_type, operation, key, None)]}
            await rest.set(bucket, "d40", name="probe")
            for client in clients:  # the next frames: the probe's; the window heard nothing before it
                assert await received(client, 4) == {
                    "plain": [("change", "update", "d40", None)], "window": [("change", "update", "d40", 1)],
                    "stream": [("change", "update", "d40", None)], "matches": [("match", "update", "d40", 1)]}
            HEALING.healed("document shard", killed_at)
            assert shard_info(healing.router, "document", victim)["epoch"] != epoch
            # every live query was registered again (writes the shard stored in the instant it
            # died may not have reached them), and that sent nothing the writes did not
            assert resynced(healing) == [count + len(SUBSCRIPTIONS) for count in before]
            status, after = await rest.call("GET", f"/db/{bucket}/d70")
            assert status == 200 and after["name"] == acknowledged["name"] == "acknowledged"
            assert after["version"] == acknowledged["version"] + 1 and after["n"] == 71

    with_clients(scenario)


# -- the real SDK ------------------------------------------------------------------------------------


def test_the_baqend_sdk_streams_heal_without_resubscribing(healing):
    """baqend@3.4.1: a resultStream of a sorted window and an eventStream without initial result
    follow a query shard restart: the window ends as the database is, no stream starts again."""
    from tests.e2e.npm import node_project

    project = node_project("baqend-sdk", ["baqend@3.4.1", "ws@8"], ["baqend_sdk_heal.mjs"])
    (_, rest_url), _ = urls(healing)

    # t25 (inserted), t30 (deleted) and t40 (changed) while the shard is down, at once: each on a
    # document shard of its own, so that all are stored before it is back
    suffix = next(suffix for suffix in itertools.chain([""], (f"v{i}" for i in itertools.count()))
                  if len({placed(healing, "Todo", f"t{n}{suffix}") for n in (25, 30, 40)}) == 3)
    t = {n: f"t{n}{suffix}" for n in range(10, 60, 5)}

    async def scenario():
        await all_loaded(healing, 0)
        async with Rest(rest_url) as rest:
            for n in range(10, 60, 10):
                await rest.insert("Todo", t[n], n=n, on=True, name=t[n])
            node = await asyncio.create_subprocess_exec("node", "baqend_sdk_heal.mjs", rest_url, cwd=project,
                                                        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
            lines: list[dict] = []
            taken: dict[str, int] = {}

            async def line(step: str) -> dict:
                """The next line of ``step`` (lines of other steps stay for their own turn)."""
                while True:
                    seen = [entry for entry in lines if entry["step"] == step]
                    if len(seen) > taken.get(step, 0):
                        taken[step] = taken.get(step, 0) + 1
                        return seen[taken[step] - 1]
                    raw = await asyncio.wait_for(node.stdout.readline(), 20)
                    assert raw, f"the SDK script ended: {lines}"
                    if raw.startswith(b"{"):
                        lines.append(json.loads(raw))
                        assert lines[-1]["step"] != "error", lines[-1]

            try:
                assert (await line("subscribed"))["step"] == "subscribed"
                assert (await line("result"))["result"] == [f"{t[20]}:20", f"{t[30]}:30", f"{t[40]}:40"]
                await all_loaded(healing, 2)
                killed_at, _ = kill_shard(healing.router, "query")
                await asyncio.gather(rest.insert("Todo", t[25], n=25, on=True, name=t[25]), rest.delete("Todo", t[30]),
                                     rest.set("Todo", t[40], on=False))
                events = [await line("event") for _ in range(3)]
                assert [(e["matchType"], e["operation"], e["key"], e["initial"]) for e in events] == sorted([
                    ("remove", "delete", t[30], False), ("remove", "update", t[40], False)],
                    key=lambda e: e[2]) + [("add", "insert", t[25], False)]
                results = [(await line("result"))["result"] for _ in range(4)]
                assert results == [[f"{t[20]}:20", f"{t[40]}:40"], [f"{t[20]}:20"], [f"{t[20]}:20", f"{t[25]}:25"],
                                   [f"{t[20]}:20", f"{t[25]}:25", f"{t[50]}:50"]]
                await rest.set("Todo", t[50], name="probe")
                event = await line("event")
                assert (event["matchType"], event["operation"], event["key"]) == ("change", "update", t[50])
                assert (await line("result"))["result"] == [f"{t[20]}:20", f"{t[25]}:25", f"{t[50]}:50"]
                HEALING.healed("query shard, baqend SDK", killed_at)
                assert [entry["step"] for entry in lines].count("subscribed") == 1
            finally:
                node.stdin.close()
                await asyncio.wait_for(node.wait(), 20)

    run(scenario(), timeout=120)
