"""Lanes, the data plane between gateways and shards (router/lane.py), through real actors."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import ssl
import struct

import pytest
import ray

from actors.signal.contract import topic_key
from gateways.shardclient import ShardClient
from router import contract, lane
from router.shardmap import shard_name
from tests.e2e.client import HubClient, eventually, run
from tests.e2e.conftest import start_router

ONLY_SIGNAL = {"cashu": {"enabled": False}, "mx": {"enabled": False}, "nolag": {"enabled": False},
               "baqend": {"enabled": False}}
SHARDS = {"session": 1, "topic": 1, "registry": 1}


def _gateway_stats(running) -> list[dict]:
    return ray.get([record.actor.stats.remote() for record in running.router.gateways], timeout=30)


async def _pubsub_across_gateways(running, prefix: str) -> None:
    """A subscriber on gateway 1, a publisher on gateway 0; and hub:send the other way."""
    subscriber = await HubClient.open(running.ws_urls[1], f"{prefix}/sub")
    publisher = await HubClient.open(running.ws_urls[0], f"{prefix}/pub")
    await subscriber.request("hub:subscribe", {"topic": f"{prefix}/news"})
    await publisher.request("hub:register", {"actorAddress": f"{prefix}/pub"})
    for n in range(20):
        ack = await publisher.request("hub:publish", {"topic": f"{prefix}/news", "message": n})
        assert ack["payload"]["subscriberCount"] == 1
    received = [(await subscriber.recv())["payload"]["message"] for _ in range(20)]
    assert received == list(range(20))
    await subscriber.send("hub:send", {"back": True}, to=f"{prefix}/pub")
    assert (await publisher.recv())["payload"] == {"back": True}
    await subscriber.close()
    await publisher.close()


@pytest.fixture(scope="module")
def laned(ray_runtime, tmp_path_factory):
    running = start_router(namespace="e2e-lanes", port=0, gateways=2, ray_dashboard=False,
                           data_dir=tmp_path_factory.mktemp("lanes-data"), shards=SHARDS,
                           signal={"request_timeout_s": 2.0}, **ONLY_SIGNAL)
    yield running
    running.router.stop()


def test_every_gateway_has_a_lane_to_every_shard_and_traffic_takes_it(laned):
    before = _gateway_stats(laned)
    assert [stats["shard_client"]["lanes"] for stats in before] == [3, 3]
    gateway_ids = sorted(record.gateway_id for record in laned.router.gateways)
    for shards in laned.router.shards.values():
        assert sorted(ray.get(shards[0].info.remote())["lanes"]) == gateway_ids

    run(_pubsub_across_gateways(laned, "lane"))

    after = _gateway_stats(laned)
    for old, new in zip(before, after):
        sent = new["shard_client"]["batches"] - old["shard_client"]["batches"]
        assert sent > 0
        assert new["shard_client"]["lane_batches"] - old["shard_client"]["lane_batches"] == sent  # none by Ray
    assert sum(stats["delivered"] for stats in after) - sum(stats["delivered"] for stats in before) >= 21


@pytest.mark.security
def test_a_gateway_on_another_node_routes_over_a_tls_lane(laned):
    """A gateway on another node gets TCP lanes, TLS pinned to each shard's certificate. The test
    process plays that gateway (the real shard client, with a node id that is not the shards') beside
    the router's own gateways: deliveries reach it over its lane and its publishes reach theirs."""
    handles = {kind: [(shard_name(kind, index), handle) for index, handle in enumerate(shards)]
               for kind, shards in laned.router.shards.items()}
    topic_shard = laned.router.shards["topic"][0]
    address = ray.get(topic_shard.open_lane.remote("node-elsewhere"))
    assert address[0] == "tcp" and address[4].startswith("-----BEGIN CERTIFICATE-----")

    async def scenario():
        bundles: asyncio.Queue = asyncio.Queue()
        client = ShardClient("gw-elsewhere", handles, asyncio.get_running_loop(), bundles.put_nowait,
                             batch_max=100, max_inflight=4, timeout_s=10)
        try:
            assert await client.open_lanes("node-elsewhere") == 3
            assert "gw-elsewhere" in (await topic_shard.info.remote())["lanes"]
            link = client.link("topic", topic_key("tcp/news"))
            subscribed = contract.subscribe(topic_key("tcp/news"), 7, "tcp/sub")
            assert await client.request(link, subscribed) is True

            publisher = await HubClient.open(laned.ws_urls[0], "tcp/pub")
            ack = await publisher.request("hub:publish", {"topic": "tcp/news", "message": "to elsewhere"})
            assert ack["payload"]["subscriberCount"] == 1
            _, _, _, [(kind, payload, connection_ids, _)] = await asyncio.wait_for(bundles.get(), 10)
            assert (kind, connection_ids) == (contract.DELIVER_TEXT, (7,))
            assert json.loads(payload)["payload"] == {"topic": "tcp/news", "message": "to elsewhere"}

            subscriber = await HubClient.open(laned.ws_urls[1], "tcp/back-sub")
            await subscriber.request("hub:subscribe", {"topic": "tcp/back"})
            frame = json.dumps({"type": "hub:message", "from": "tcp/elsewhere", "payload": {"n": 1}}).encode()
            published = contract.publish(topic_key("tcp/back"), frame, contract.DELIVER_TEXT)
            assert await client.request(link, published) == 1
            assert await subscriber.recv() == json.loads(frame)

            assert await client.request(link, contract.unsubscribe(topic_key("tcp/news"), 7)) is True
            assert client.lane_batches_sent == client.batches_sent > 0  # no batch went by Ray
            await publisher.close()
            await subscriber.close()
        finally:
            client.close()

    try:
        run(scenario())
    finally:
        ray.get([shard.purge_gateway.remote("gw-elsewhere") for shards in laned.router.shards.values()
                 for shard in shards])


def _until_closed(sock: socket.socket) -> bytes:
    sock.settimeout(10)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    return data


@pytest.mark.security
def test_a_shards_lanes_let_in_only_peers_that_prove_the_secret(laned):
    """Whoever finds a shard's lane (its abstract Unix socket is listed in /proc/net/unix, its TCP
    port is on the network) and even knows the secret gets nothing without the handshake: the
    first version's hello, which sent the secret itself, is refused, and in the clear TCP says
    nothing at all. The router's own lanes carry on."""
    shard = laned.router.shards["registry"][0]
    unix = ray.get(shard.open_lane.remote(ray.get_runtime_context().get_node_id()))
    tcp = ray.get(shard.open_lane.remote("node-elsewhere"))
    assert unix[0] == "unix" and tcp[0] == "tcp"
    old_hello = struct.pack("!I", lane.SECRET_BYTES + 8) + unix[2] + b"gw-rogue"

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(unix[1])
        sock.sendall(old_hello)
        data = _until_closed(sock)
        assert data[:4] == struct.pack("!I", lane.NONCE_BYTES) and len(data) == 4 + lane.NONCE_BYTES

    with socket.create_connection(tcp[1:3], timeout=10) as sock:
        sock.sendall(old_hello)
        data = _until_closed(sock)
        assert data == b"" or data[0] == 0x15  # nothing, or a TLS alert

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.load_verify_locations(cadata=tcp[4])
    with context.wrap_socket(socket.create_connection(tcp[1:3], timeout=10)) as sock:
        sock.sendall(old_hello)  # inside TLS, still not the handshake
        data = _until_closed(sock)
        assert data[:4] == struct.pack("!I", lane.NONCE_BYTES) and len(data) == 4 + lane.NONCE_BYTES

    assert "gw-rogue" not in ray.get(shard.info.remote())["lanes"]
    run(_pubsub_across_gateways(laned, "after-rogue"))
    assert [stats["shard_client"]["lanes"] for stats in _gateway_stats(laned)] == [3, 3]


def test_a_crashed_shard_comes_back_and_the_lanes_reopen(laned):
    shard = laned.router.shards["topic"][0]
    old = ray.get(shard.info.remote())
    os.kill(old["pid"], signal.SIGKILL)

    async def scenario():
        client = await HubClient.open(laned.ws_urls[0], "lane/survivor")

        async def subscribed():
            reply = await client.request("hub:subscribe", {"topic": "lane/after"})
            return reply["type"] == "hub:subscribed"

        # Requests fail (internal_error / timeout) until Ray has restarted the shard, then work.
        await eventually(subscribed, timeout=60, interval=0.2)
        ack = await client.request("hub:publish", {"topic": "lane/after", "message": "back"})
        assert ack["payload"]["subscriberCount"] == 1
        assert (await client.recv())["payload"]["message"] == "back"
        await client.close()

    run(scenario(), timeout=90)
    new = ray.get(shard.info.remote())
    assert new["pid"] != old["pid"] and new["epoch"] != old["epoch"]

    async def reopened():
        stats = _gateway_stats(laned)
        return all(s["shard_client"]["lanes"] == 3 for s in stats) and stats

    stats = run(eventually(reopened, timeout=30, interval=0.2))
    assert all(s["shard_client"]["lanes_lost"] >= 1 for s in stats)
    assert len(ray.get(shard.info.remote())["lanes"]) == 2
    run(_pubsub_across_gateways(laned, "lane2"))


def test_with_lanes_off_every_hop_is_a_ray_call(ray_runtime, tmp_path_factory):
    running = start_router(namespace="e2e-nolanes", port=0, gateways=2, ray_dashboard=False,
                           data_dir=tmp_path_factory.mktemp("nolanes-data"), shards=SHARDS,
                           gateway={"lanes": False}, **ONLY_SIGNAL)
    try:
        run(_pubsub_across_gateways(running, "ray"))
        stats = _gateway_stats(running)
        assert [s["shard_client"]["lanes"] for s in stats] == [0, 0]
        assert [s["shard_client"]["lane_batches"] for s in stats] == [0, 0]
        assert all(s["shard_client"]["batches"] > 0 for s in stats)
        assert ray.get(running.router.shards["topic"][0].info.remote())["lanes"] is None
    finally:
        running.router.stop()
