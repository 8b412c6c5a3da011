"""Baqend's bounds on work per client, over real sockets: paged scans and the result limit, token
expiry of live subscriptions, REST and subscribe rates, subscription quotas per client, and the
idle timeout of /v1/events (with the real SDK kept alive by its pongs).

``bounded``: small scan pages and result limits, generous rates (the tests insert many documents).
``strict``: small rates and quotas and a 2 s idle timeout. Tests that count against a client use a
client of their own: another loopback address (``local_addr``) or another token subject.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import subprocess
import time

import jwt
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.frames import Opcode

from router.runtime import cluster_status
from tests.e2e.baqend_client import Events, Rest, key_of
from tests.e2e.client import eventually, run
from tests.e2e.conftest import RunningRouter, start_router
from tests.e2e.rawws import client_frame, open_raw_websocket, read_server_frame

pytestmark = [pytest.mark.e2e, pytest.mark.security]

SECRET = "baqend-limits-" + "0123456789abcdef" * 4
SCHEMA = [{"class": "/db/Todo", "fields": {"name": {"name": "name", "type": "/db/String"},
                                           "n": {"name": "n", "type": "/db/Integer"}}}]
OFF = {"signal": {"enabled": False}, "cashu": {"enabled": False}, "mx": {"enabled": False},
       "analytics": {"enabled": False}}
AUTH = {"enabled": True, "secret": SECRET}


@pytest.fixture(scope="module")
def bounded(ray_runtime, tmp_path_factory) -> RunningRouter:
    running = start_router(
        namespace="e2e-baqend-bounded", data_dir=tmp_path_factory.mktemp("baqend-bounded"), port=0, gateways=1,
        ray_dashboard=False, shards={"session": 1, "topic": 1, "document": 2, "query": 1}, **OFF,
        baqend={"auth": AUTH, "max_scan_documents": 20, "max_scan_bytes": 4096, "max_result_documents": 100,
                "max_query_bytes": 64 * 1024, "max_result_bytes": 1_000_000},
    )
    yield running
    running.router.stop()


@pytest.fixture(scope="module")
def strict(ray_runtime, tmp_path_factory) -> RunningRouter:
    running = start_router(
        namespace="e2e-baqend-strict", data_dir=tmp_path_factory.mktemp("baqend-strict"), port=0, gateways=1,
        ray_dashboard=False, shards={"session": 1, "topic": 1, "document": 1, "query": 1}, **OFF,
        # Loopback is exempt from per-address limits by default: here it stands for client addresses.
        gateway={"sweep_interval_s": 0.1, "connection_limit_exempt": []},
        baqend={"auth": AUTH, "schema": SCHEMA, "max_subscriptions": 4, "max_client_subscriptions": 6,
                "subscribe_rate_limit_per_minute": 6, "subscribe_rate_limit_burst": 10,
                "rest_rate_limit_per_minute": 6, "rest_rate_limit_burst": 5,
                "ping_interval_s": 0.5, "idle_timeout_s": 2},
    )
    yield running
    running.router.stop()


def urls(running: RunningRouter) -> tuple[str, str, int]:
    """(events url, REST base, port) of the router's gateway."""
    port = running.router.endpoints()[0]["listeners"][0]["port"]
    return f"ws://127.0.0.1:{port}/v1/events", f"http://127.0.0.1:{port}/v1", port


_counter = itertools.count(1)


def fresh(prefix: str = "B") -> str:
    """A name no other test uses: a bucket or a token subject."""
    return f"{prefix}{next(_counter)}x{time.monotonic_ns()}"


def token(user: str, expires_in: float = 3600) -> str:
    return jwt.encode({"sub": user, "exp": int(time.time() + expires_in)}, SECRET, algorithm="HS256")


def as_user(user: str) -> dict[str, str]:
    return {"Authorization": "BAT " + token(user)}


def error(sub_id, status, reason, message):
    frame = {"type": "error", "status": status, "error": {"message": message, "status": status, "reason": reason}}
    if sub_id is not None:
        frame["id"] = sub_id
    return frame


async def fill(rest: Rest, bucket: str, count: int, **fields) -> None:
    """``count`` documents k000.. with n = 0.., inserted by a user of their own (REST rate per subject)."""
    headers = as_user(fresh("loader"))
    for index in range(count):
        await rest.insert(bucket, f"k{index:03d}", headers, n=index, **fields)


# -- bounded work per subscribe ------------------------------------------------------------------


def test_a_query_matching_more_than_max_result_documents_is_refused_and_a_narrower_one_pages(bounded):
    """Before: every document shard answered the whole bucket in one reply and the gateway handed
    all of it to the query shard in one command (a bucket above 256 MiB closed both lanes)."""
    events_url, rest_url, _ = urls(bounded)

    async def scenario():
        bucket = fresh()
        async with Rest(rest_url) as rest:
            await fill(rest, bucket, 101)
            client = await Events.open(events_url)
            await client.subscribe("all", bucket, initial=True)
            assert await client.recv() == error("all", 413, "Payload Too Large",
                                                "The query matches more than 100 documents (the limit): "
                                                "narrow the query")
            # a sorted window holds every match too (to refill the window): the same bound
            await client.subscribe("top", bucket, sort={"n": 1}, limit=5, initial=True)
            assert (await client.recv())["error"]["status"] == 413
            # 60 matches over 2 shards, 20 rows a page: several pages each, one complete result
            await client.subscribe("some", bucket, query={"n": {"$lt": 60}}, sort={"n": -1}, initial=True)
            assert [key_of(d) for d in await client.result("some")] == [f"k{n:03d}" for n in range(59, -1, -1)]
            await client.close()

    run(scenario())
    shards = [s for s in cluster_status("e2e-baqend-bounded")["shards"] if s["kind"] == "document"]
    assert all(s["scan_page_max_documents"] <= 20 and s["scan_page_max_bytes"] <= 4096 for s in shards), shards
    assert sum(s["scan_pages"] for s in shards) >= 10, shards


def test_a_query_whose_documents_exceed_max_query_bytes_is_refused(bounded):
    events_url, rest_url, _ = urls(bounded)

    async def scenario():
        bucket = fresh()
        async with Rest(rest_url) as rest:
            await fill(rest, bucket, 40, pad="p" * 2000)  # about 80 KB, 40 documents
            client = await Events.open(events_url)
            await client.subscribe("fat", bucket, initial=False)
            assert await client.recv() == error("fat", 413, "Payload Too Large",
                                                f"The query's documents exceed {64 * 1024} bytes (the limit): "
                                                "narrow the query")
            await client.subscribe("thin", bucket, query={"n": {"$lt": 5}}, initial=True)
            assert sorted(key_of(d) for d in await client.result("thin")) == [f"k{n:03d}" for n in range(5)]
            await client.close()

    run(scenario())


def test_writes_racing_a_paged_load_are_applied_exactly_once(bounded):
    """The pages of one shard are read at different moments: each page's writes are folded in or
    skipped by the stamp of that page, so the live window equals the query re-run at the end."""
    events_url, rest_url, _ = urls(bounded)

    async def scenario():
        bucket = fresh()
        headers = as_user(fresh("writer"))
        async with Rest(rest_url) as rest:
            await fill(rest, bucket, 90)
            live = await Events.open(events_url)

            async def writes():
                for step in range(60):
                    key = f"k{(step * 37) % 90:03d}"
                    status, _ = await rest.call("POST", f"/db/{bucket}/{key}", {"$set": {"n": 200 - step}}, headers)
                    assert status == 200

            writer = asyncio.create_task(writes())
            await live.subscribe("live", bucket, query={"n": {"$gte": 30}}, sort={"n": 1}, limit=10, initial=True)
            window = [key_of(d) for d in await live.result("live")]
            await writer
            check = await Events.open(events_url)
            await check.subscribe("check", bucket, query={"n": {"$gte": 30}}, sort={"n": 1}, limit=10, initial=True)
            expected = [key_of(d) for d in await check.result("check")]

            async def caught_up() -> bool:
                while True:
                    try:
                        frame = await live.recv(timeout=0.05)
                    except TimeoutError:
                        return window == expected
                    key, match_type = key_of(frame["data"]), frame["matchType"]
                    if match_type in ("remove", "changeIndex"):
                        window.remove(key)
                    if match_type in ("add", "changeIndex"):
                        window.insert(frame["index"], key)

            await eventually(caught_up, timeout=15)
            await live.close()
            await check.close()

    run(scenario(), timeout=120)


# -- token expiry -------------------------------------------------------------------------------------


def test_a_subscription_ends_with_401_when_its_token_expires(bounded):
    """Before: the token was checked once, at subscribe; the subscription got events forever."""
    events_url, rest_url, _ = urls(bounded)

    async def scenario():
        bucket = fresh()
        async with Rest(rest_url) as rest:
            await rest.insert(bucket, "a", as_user(fresh("w")), n=1)
            client = await Events.open(events_url)
            await client.subscribe("short", bucket, initial=True, token=token("u1", expires_in=3))
            assert [key_of(d) for d in await client.result("short")] == ["a"]
            assert await client.recv(timeout=10) == error("short", 401, "Unauthorized", "Invalid token: expired")
            await client.subscribe("anon", bucket, initial=True)
            assert [key_of(d) for d in await client.result("anon")] == ["a"]
            await rest.insert(bucket, "b", as_user(fresh("w")), n=2)
            # the next frame is the anonymous subscription's: the expired one sends nothing more
            frame = await client.recv()
            assert (frame["id"], frame["matchType"], key_of(frame["data"])) == ("anon", "add", "b")
            await client.close()

    run(scenario())


# -- rates and quotas per client -------------------------------------------------------------------------


def test_rest_requests_over_the_rate_get_429_per_address_or_token_subject(strict):
    """Before: REST had no rate limit at all."""
    _, rest_url, _ = urls(strict)

    async def scenario():
        async with Rest(rest_url, local_addr=("127.0.0.2", 0)) as rest:
            for _ in range(5):  # the burst
                assert (await rest.call("GET", "/db/Todo/missing"))[0] == 404
            status, body, headers = await rest.exchange("GET", "/db/Todo/missing")
            assert (status, body) == (429, {"message": "Too many requests: at most 6 a minute; try again later",
                                            "reason": "Too Many Requests",
                                            "className": "baqend.error.TooManyRequests", "status": 429})
            assert 1 <= int(headers["Retry-After"]) <= 10
            # an authenticated client is counted by its token subject, not by its address
            status, _ = await rest.call("GET", "/db/Todo/missing", headers=as_user(fresh("rest")))
            assert status == 404

    run(scenario())


def test_live_subscriptions_per_client_are_bounded_across_connections(strict):
    """Before: only the count per connection was bounded; a client opened as many connections as it liked."""
    events_url, _, _ = urls(strict)

    async def scenario():
        address = ("127.0.0.3", 0)
        bucket = fresh()
        first, second = await Events.open(events_url, address), await Events.open(events_url, address)
        for index in range(4):
            await first.subscribe(f"a{index}", bucket, initial=True)
            assert await first.result(f"a{index}") == []
        for index in range(2):
            await second.subscribe(f"b{index}", bucket, initial=True)
            assert await second.result(f"b{index}") == []
        await second.subscribe("b2", bucket, initial=True)
        assert await second.recv() == error("b2", 429, "Too Many Requests",
                                            "Too many active subscriptions for this client (only 6 allowed)!")
        # a token subject is a client of its own
        await second.subscribe("mine", bucket, initial=True, token=token(fresh("quota")))
        assert await second.result("mine") == []
        await first.unsubscribe("a0")
        await second.subscribe("b3", bucket, initial=True)
        assert await second.result("b3") == []
        await first.close()
        await second.close()

    run(scenario())


def test_subscribes_over_the_rate_get_429(strict):
    """Before: a client could subscribe and unsubscribe in a loop, each subscribe a scan of the bucket."""
    events_url, _, _ = urls(strict)

    async def scenario():
        client = await Events.open(events_url, ("127.0.0.4", 0))
        bucket = fresh()
        for index in range(10):  # the burst
            await client.subscribe(f"s{index}", bucket, initial=True)
            assert await client.result(f"s{index}") == []
            await client.unsubscribe(f"s{index}")
        await client.subscribe("s10", bucket, initial=True)
        frame = await client.recv()
        assert frame == error("s10", 429, "Too Many Requests", frame["error"]["message"])
        assert frame["error"]["message"].startswith("Too many subscribe requests: at most 6 a minute; try again in ")
        await client.close()

    run(scenario())


# -- idle timeout -------------------------------------------------------------------------------------------


def test_a_connection_without_subscriptions_that_sends_nothing_is_closed_1001(strict):
    """Before: an idle connection stayed open forever."""
    events_url, _, _ = urls(strict)

    async def scenario():
        client = await Events.open(events_url, ("127.0.0.5", 0))
        with pytest.raises(ConnectionClosed) as closed:
            await client.recv(timeout=10)
        assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (1001, "idle for 2 s")

    run(scenario())


def test_a_subscriber_that_answers_no_ping_is_closed_and_one_that_answers_stays(strict):
    """Before: a dead subscriber's connection (and its subscription) stayed forever. The server
    pings a quiet connection; a pong is activity, as is every message."""
    events_url, rest_url, port = urls(strict)

    async def scenario():
        bucket = fresh()
        alive = await Events.open(events_url)  # the websockets client answers pings
        await alive.subscribe("alive", bucket, initial=True)
        assert await alive.result("alive") == []
        reader, writer = await open_raw_websocket(port, "/v1/events")
        subscribe = {"id": "dead", "type": "subscribe", "bucket": bucket, "initial": True}
        writer.write(client_frame(Opcode.TEXT, json.dumps(subscribe).encode()))
        opcode, body = await read_server_frame(reader)
        assert opcode == Opcode.TEXT and json.loads(body)["type"] == "result"
        pings = 0
        while True:  # never answered
            opcode, body = await read_server_frame(reader)
            if opcode == Opcode.CLOSE:
                break
            assert opcode == Opcode.PING
            pings += 1
        assert int.from_bytes(body[:2], "big") == 1001 and body[2:] == b"idle for 2 s" and pings >= 1
        writer.close()
        # `alive` has been as quiet as the dead one, but it answered every ping
        async with Rest(rest_url) as rest:
            await rest.insert(bucket, "late", as_user(fresh("w")), n=1)
        frame = await alive.recv()
        assert (frame["id"], frame["matchType"], key_of(frame["data"])) == ("alive", "add", "late")
        await alive.close()

    run(scenario())


def test_the_baqend_sdk_stays_connected_through_a_quiet_spell_longer_than_the_idle_timeout(strict):
    """baqend@3.4.1 sends nothing while it waits for events; its WebSocket library answers the
    server's pings, which keeps its event stream open."""
    from tests.e2e.npm import node_project

    project = node_project("baqend-sdk", ["baqend@3.4.1", "ws@8"], ["baqend_sdk_quiet.mjs"])
    _, rest_url, _ = urls(strict)
    done = subprocess.run(["node", "baqend_sdk_quiet.mjs", rest_url, "5000"], cwd=project, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, (done.stdout, done.stderr)
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [line["step"] for line in lines] == ["subscribed", "inserted", "event", "done"], lines
    inserted, event = lines[1], lines[2]
    assert (event["matchType"], event["operation"], event["key"]) == ("add", "insert", inserted["key"])


# -- nesting ---------------------------------------------------------------------------------------


def test_a_subscribe_nested_too_deep_is_refused_and_the_connection_goes_on(bounded):
    """Before: a query value nested 600 levels ({"n": {"$in": [[[...]]]}}) overflowed the recursion
    limit while the query compiled, and the gateway closed the connection with 1011."""
    events_url, _, _ = urls(bounded)
    bucket = fresh()
    deep = "[" * 600 + "]" * 600

    async def scenario():
        events = await Events.open(events_url)
        for field, value in (("query", f'{{"n": {{"$in": {deep}}}}}'), ("matchTypes", deep), ("operations", deep)):
            await events.send(f'{{"id": "deep", "type": "subscribe", "bucket": "{bucket}", "{field}": {value}}}')
            assert await events.recv() == error("deep", 400, "Bad Request",
                                                "Invalid message: a message may nest at most 32 levels"), field
        await events.subscribe("plain", bucket, initial=True)
        assert await events.result("plain") == []
        await events.close()

    run(scenario())
