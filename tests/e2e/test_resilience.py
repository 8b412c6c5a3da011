"""Failures the router must survive: a gateway dying, a shard stalling."""

from __future__ import annotations

import os
import signal
import socket
import time

import pytest
import ray
from websockets.exceptions import ConnectionClosed

from tests.e2e.client import HubClient, run
from tests.e2e.conftest import refresh, start_router
from tests.e2e.kills import stop, thread_states


@pytest.fixture(scope="module")
def fragile(ray_runtime, tmp_path_factory):
    # Ephemeral ports (port 0): a replacement must find its predecessor's port without a configured one.
    # (A configured port is kept by the NoLag healing tests' routers.)
    running = start_router(
        namespace="e2e-fragile", port=0, gateways=2, ray_dashboard=False,
        data_dir=tmp_path_factory.mktemp("fragile-data"),
        shards={"session": 1, "topic": 1, "registry": 1},
        signal={"request_timeout_s": 1.0},
    )
    yield running
    running.router.stop()


def test_a_dead_gateway_is_replaced_on_its_port_and_the_shards_forget_it(fragile):
    router = fragile.router
    victim = router.gateways[1]
    url_of_victim = fragile.ws_urls[1]

    async def before():
        doomed = await HubClient.open(url_of_victim, "res/doomed")
        await doomed.request("hub:register", {"actorAddress": "res/doomed"})
        await doomed.request("hub:subscribe", {"topic": "res/topic"})
        return doomed

    async def observe_drop(doomed):
        try:
            await doomed.recv(timeout=10)
            raise AssertionError("the socket should drop with its gateway")
        except ConnectionClosed:
            pass

    async def after():
        survivor = await HubClient.open(fragile.ws_urls[0], "res/survivor")
        found = await survivor.request("hub:discover", {"pattern": "^res/doomed$"})
        assert found["payload"]["totalMatches"] == 0
        published = await survivor.request("hub:publish", {"topic": "res/topic", "message": 1})
        assert published["payload"]["subscriberCount"] == 0
        # The replacement listens where the dead one did, and routes as before.
        reborn = await HubClient.open(url_of_victim, "res/reborn")
        await reborn.request("hub:register", {"actorAddress": "res/reborn"})
        await survivor.send("hub:send", {"hello": "again"}, to="res/reborn")
        assert (await reborn.recv())["payload"] == {"hello": "again"}
        await survivor.close()
        await reborn.close()

    import asyncio

    loop = asyncio.new_event_loop()
    try:
        doomed = loop.run_until_complete(before())
        ray.kill(victim.actor, no_restart=True)
        loop.run_until_complete(asyncio.wait_for(observe_drop(doomed), 20))
        deadline = time.monotonic() + 60
        while router.restarts == 0 and time.monotonic() < deadline:
            router.supervise(timeout=0.5)
        assert router.restarts == 1
        assert router.gateways[1].gateway_id != victim.gateway_id
        assert router.gateways[1].info["listeners"][0]["port"] == victim.info["listeners"][0]["port"]
    finally:
        loop.close()
    run(after())


def test_a_replacement_whose_port_was_taken_meanwhile_listens_on_a_new_one(fragile):
    router = fragile.router
    victim = router.gateways[1]
    port = victim.info["listeners"][0]["port"]
    ray.kill(victim.actor, no_restart=True)
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past its closed connections' TIME_WAIT
        deadline = time.monotonic() + 20
        while True:  # the port is free once the dead actor's process has closed it
            try:
                squatter.bind(("0.0.0.0", port))
                break
            except OSError:
                assert time.monotonic() < deadline, f"port {port} still taken after the gateway died"
                time.sleep(0.05)
        squatter.listen()
        deadline = time.monotonic() + 60
        while router.restarts < 2 and time.monotonic() < deadline:
            router.supervise(timeout=0.5)
        assert router.restarts == 2
    moved = router.gateways[1].info["listeners"][0]["port"]
    assert moved not in (0, port)
    refresh(fragile)
    assert fragile.ws_urls[1].split("/")[2] == f"127.0.0.1:{moved}"

    async def works():
        client = await HubClient.open(fragile.ws_urls[1], "res/moved")
        assert (await client.request("hub:heartbeat", {}))["type"] == "hub:heartbeat_ack"
        await client.close()

    run(works())


def test_a_stalled_shard_answers_timeout_then_recovers(fragile):
    shard = fragile.router.shards["registry"][0]
    pid = ray.get(shard.info.remote())["pid"]

    async def scenario():
        client = await HubClient.open(fragile.ws_urls[0], "res/patient")
        stop(pid)
        try:
            started = time.monotonic()
            reply = await client.request("hub:discover", {}, correlationId="slow")
            waited = time.monotonic() - started
            states = thread_states(pid)
        finally:
            os.kill(pid, signal.SIGCONT)
        assert reply == {"type": "hub:error", "from": "cloudflare/signal-hub", "to": "res/patient",
                         "payload": {"code": "timeout", "message": "hub:discover timed out; retry with backoff",
                                     "details": {"timeoutMs": 1000}},
                         "correlationId": "slow"}, (
            f"after {waited:.3f}s; shard {pid} in states {states}; gateway: "
            f"{ray.get(fragile.router.gateways[0].actor.stats.remote())['shard_client']}")
        assert 0.9 <= waited < 5
        recovered = await client.request("hub:discover", {})
        assert recovered["type"] == "hub:discovery_result"
        await client.close()

    run(scenario())
