"""A shard killed with SIGKILL comes back (Ray restarts it, empty, with a new epoch) and heals
without any client action: each gateway re-announces what its connections held there, and the
shard serves other commands only once every gateway has (``docs/architecture.md``, "Failure and
recovery"). Signal Hub, Cashu and mx here; NoLag and Baqend in their own modules.

Each test kills a real shard process and measures the healing time: from the kill until a new
message reaches a subscriber that did nothing meanwhile (must be under 5 s).
"""

from __future__ import annotations

import asyncio
import os

import pytest
import ray

from gateways.cashu import codec as cashu_codec
from gateways.cashu.feed import FeedError
from gateways.mx import codec, generator, node
from tests.e2e.cashu_client import API_KEY, Wallet, push
from tests.e2e.client import HubClient, eventually, run
from tests.e2e.conftest import RunningRouter, start_router
from tests.e2e.kills import HealingTimes, kill_shard, owner, shard_info
from tests.e2e.mx_client import Consumer, Node

pytestmark = pytest.mark.e2e

HEALING = HealingTimes()  # printed at the end of the module (the note reports them)


@pytest.fixture(scope="module")
def healing(ray_runtime, tmp_path_factory) -> RunningRouter:
    running = start_router(
        namespace="e2e-healing", data_dir=tmp_path_factory.mktemp("healing-data"), port=0, gateways=2,
        ray_dashboard=False, shards={"session": 1, "topic": 2, "registry": 2},
        nolag={"enabled": False}, baqend={"enabled": False},
        cashu={"state_api_key": API_KEY},
    )
    yield running
    running.router.stop()
    HEALING.report("Signal Hub, Cashu, mx")


def main_port_urls(running: RunningRouter, path: str) -> list[str]:
    return [f"ws://127.0.0.1:{gateway['listeners'][0]['port']}{path}" for gateway in running.router.endpoints()]


def http_urls(running: RunningRouter) -> list[str]:
    return [f"http://127.0.0.1:{gateway['listeners'][0]['port']}" for gateway in running.router.endpoints()]


# -- Signal Hub ----------------------------------------------------------------------------------


def test_signal_registrations_keep_token_version_and_ttl_across_a_registry_restart(healing):
    a_url, b_url = main_port_urls(healing, "/signal")

    async def scenario():
        a = await HubClient.open(a_url, "heal/a")
        b = await HubClient.open(b_url, "heal/b")
        registered = await a.request("hub:register", {"actorAddress": "heal/a", "ttl": 60_000,
                                                      "capabilities": ["chat"], "metadata": {"v": 1}})
        before = await b.request("hub:discover", {"pattern": "^heal/a$"})
        index = owner(healing.router, "registry", "heal/a")
        killed_at, epoch = kill_shard(healing.router, "registry", index)

        async def found():
            reply = await b.request("hub:discover", {"pattern": "^heal/a$"})
            return reply["type"] == "hub:discovery_result" and reply["payload"]["totalMatches"] == 1 and reply

        after = await eventually(found, timeout=15, interval=0.02)
        HEALING.healed("signal registry", killed_at)
        assert shard_info(healing.router, "registry", index)["epoch"] != epoch
        assert after["payload"]["actors"] == before["payload"]["actors"]  # same registeredAt, metadata
        await b.send("hub:send", {"after": "restart"}, to="heal/a")
        assert (await a.recv())["payload"] == {"after": "restart"}
        renewed = await a.request("hub:renew", {"actorAddress": "heal/a",
                                                "renewalToken": registered["payload"]["renewalToken"]})
        assert renewed["type"] == "hub:renewed", renewed  # the token it held before the restart
        await a.close()
        await b.close()

    run(scenario())


def test_signal_subscriptions_come_back_and_the_next_publish_reaches_them(healing):
    a_url, b_url = main_port_urls(healing, "/signal")

    async def scenario():
        near = await HubClient.open(a_url, "heal/near")
        far = await HubClient.open(b_url, "heal/far")
        for subscriber in (near, far):
            assert (await subscriber.request("hub:subscribe", {"topic": "heal/news"}))["type"] == "hub:subscribed"
        publisher = await HubClient.open(a_url, "heal/publisher")
        index = owner(healing.router, "topic", "signal/heal/news")
        killed_at, _ = kill_shard(healing.router, "topic", index)
        reply = await publisher.request("hub:publish", {"topic": "heal/news", "message": "after"})
        while reply["type"] != "hub:delivery_ack":  # it may have met the dying process
            reply = await publisher.request("hub:publish", {"topic": "heal/news", "message": "after"})
        assert reply["payload"]["subscriberCount"] == 2, reply  # never a shard that forgot them
        for subscriber in (near, far):
            message = await subscriber.recv()
            assert (message["type"], message["payload"]) == ("hub:publish", {"topic": "heal/news", "message": "after"})
        HEALING.healed("signal topic", killed_at)
        for client in (near, far, publisher):
            await client.close()

    run(scenario())


# -- Cashu ------------------------------------------------------------------------------------------


async def push_until_stored(http_url: str, payload: dict) -> None:
    """As a mint's feeder does: a 503 (the shard died under that push) means push it again."""
    while True:
        try:
            await push(http_url, "proof_state", payload)
            return
        except FeedError as error:
            assert error.status == 503, error


def test_cashu_subscribers_get_every_state_pushed_after_the_restart(healing):
    (_, ws_url), (http_url, _) = main_port_urls(healing, "/v1/ws"), http_urls(healing)
    y = "02" + os.urandom(32).hex()

    async def scenario():
        wallet = await Wallet.open(ws_url)
        request_id = await wallet.subscribe("proof_state", [y], "s1")
        await wallet.expect_ok(request_id, "s1")
        assert (await wallet.notification())[1]["state"] == "UNSPENT"
        index = owner(healing.router, "topic", cashu_codec.object_key("proof_state", y))
        killed_at, _ = kill_shard(healing.router, "topic", index)
        await push_until_stored(http_url, {"Y": y, "state": "PENDING", "witness": None})
        assert await wallet.notification() == ("s1", {"Y": y, "state": "PENDING", "witness": None})
        HEALING.healed("cashu topic", killed_at)
        await push(http_url, "proof_state", {"Y": y, "state": "SPENT", "witness": None})
        assert await wallet.notification() == ("s1", {"Y": y, "state": "SPENT", "witness": None})
        await wallet.quiet()
        await wallet.close()

    run(scenario())


# -- mx ----------------------------------------------------------------------------------------------


def test_mx_every_acknowledged_block_reaches_the_consumers_after_each_topic_shard_restart(healing):
    node_url, consumer_url = main_port_urls(healing, "/save")[0], main_port_urls(healing, "/hub/ws")[1]

    async def scenario():
        consumers = []
        for _ in range(4):  # their filters are spread over both topic shards
            consumer = await Consumer.open(consumer_url)
            await consumer.subscribe("All")
            consumers.append(consumer)
        feeder = await Node.open(node_url)
        seed = 7000
        for index in range(len(healing.router.shards["topic"])):
            killed_at, _ = kill_shard(healing.router, "topic", index)
            saved = generator.generate_save_block(seed + index, transactions=5)
            # Acknowledged once every topic shard took it; a frame that met the dying shard gets no
            # ACK and is sent again, so consumers of the other shard may see its events twice.
            payload = generator.save_block_payload(saved, feeder.marshaller)
            await feeder.push_until_acknowledged(node.SAVE_BLOCK, payload)
            await feeder.finalize(saved)
            events = [event.SerializeToString() for event in node.normalize_save_block(saved).events]
            block_hash = saved.BlockData.HeaderHash.hex()
            for consumer in consumers:
                got = await consumer.until_finalized(block_hash)
                received = [m.SerializeToString() for t, m in got if t == codec.EVENTS_TOPIC]
                assert list(dict.fromkeys(received)) == events  # every event, in order, at least once
            HEALING.healed(f"mx topic {index}", killed_at)
        for consumer in consumers:
            await consumer.close()
        await feeder.close()

    run(scenario())


# -- without lanes ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def laneless(ray_runtime, tmp_path_factory) -> RunningRouter:
    running = start_router(
        namespace="e2e-healing-nolanes", data_dir=tmp_path_factory.mktemp("healing-nolanes"), port=0, gateways=2,
        ray_dashboard=False, shards={"session": 1, "topic": 1, "registry": 1}, gateway={"lanes": False},
        nolag={"enabled": False}, baqend={"enabled": False}, cashu={"enabled": False}, mx={"enabled": False},
    )
    yield running
    running.router.stop()


def test_without_lanes_an_idle_gateway_notices_the_restart_and_re_announces(laneless):
    """No lane closes to tell of the restart, and the subscriber's gateway sends nothing: it asks
    every shard's epoch on its sweep, so the shard heals without waiting for its timeout."""
    subscriber_url, publisher_url = main_port_urls(laneless, "/signal")

    async def scenario():
        subscriber = await HubClient.open(subscriber_url, "quiet/subscriber")
        assert (await subscriber.request("hub:subscribe", {"topic": "quiet"}))["type"] == "hub:subscribed"
        publisher = await HubClient.open(publisher_url, "quiet/publisher")
        killed_at, epoch = kill_shard(laneless.router, "topic", 0)

        async def healed_by_both():
            try:
                info = await asyncio.to_thread(shard_info, laneless.router, "topic", 0)
            except ray.exceptions.RayError:  # still restarting
                return False
            return info["epoch"] != epoch and info["healed_in"] is not None and info["healing"] == []

        # healed_in is set only when every gateway re-announced
        await eventually(healed_by_both, timeout=15, interval=0.02)
        reply = await publisher.request("hub:publish", {"topic": "quiet", "message": 1})
        assert reply["type"] == "hub:delivery_ack" and reply["payload"]["subscriberCount"] == 1, reply
        assert (await subscriber.recv())["payload"] == {"topic": "quiet", "message": 1}
        HEALING.healed("signal topic, no lanes", killed_at)
        await subscriber.close()
        await publisher.close()

    run(scenario())
