"""Chaos: SIGKILL one shard of each kind in turn, then a gateway, then the router process that
created the shards, with clients of every dialect connected, and count what they got.

Two routers share one namespace, as on a cluster: ``creator`` is a ``router serve`` process (it
creates the detached shards and runs one gateway), ``joiner`` runs in this process (two gateways,
supervised by the test). Long-lived clients sit on the joiner's first gateway; the second is
the one killed. After each kill the test measures the healing time (from the kill until a new
message reaches every old subscriber with no client action; must be < 5 s) and checks:

- Signal Hub: ``hub:send`` to an actor registered before the kill arrives, ``discover`` finds it,
  a publish reaches every subscriber;
- Cashu: every state pushed (200 OK) reaches the subscriber, the last one last;
- mx: every block the node got an ACK for reaches every consumer (events in order, at least once);
- Baqend: every write (201) shows in the live query's result, as one ``add``, never a second result;
- NoLag: every QoS 1 message confirmed (``published``) reaches the subscriber (which acks), at least once.

The figures are printed at the end (``pytest -s``) and reported in the README.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from pathlib import Path
from typing import Any

import pytest
import ray

from gateways.cashu.feed import FeedError
from gateways.mx import codec as mx_codec
from gateways.mx import generator, node
from actors.nolag.keys import open_key_store
from router.shardmap import GATEWAY_PREFIX
from tests.e2e.baqend_client import Events, Rest, brief, key_of
from tests.e2e.cashu_client import API_KEY, Wallet, push
from tests.e2e.client import HubClient
from tests.e2e.conftest import RunningRouter, start_router
from tests.e2e.kills import HEAL_LIMIT_S, kill_shard
from tests.e2e.mx_client import Consumer, Node
from tests.e2e.nolag_client import Client as NoLagClient
from tests.e2e.test_cli import ROUTER, Served

pytestmark = pytest.mark.e2e

NAMESPACE = "chaos"
SHARDS = {"session": 1, "topic": 2, "registry": 2, "document": 1, "query": 1}
SETTINGS = dict(namespace=NAMESPACE, ray_dashboard=False, shards=SHARDS, cashu={"state_api_key": API_KEY},
                baqend={"enabled": True})


def _env(settings: dict[str, Any], prefix: str = "ROUTER_") -> dict[str, str]:
    env = {}
    for key, value in settings.items():
        if isinstance(value, dict):
            env.update(_env(value, f"{prefix}{key.upper()}__"))
        elif key != "namespace":
            env[f"{prefix}{key.upper()}"] = str(value).lower() if isinstance(value, bool) else str(value)
    return env


@pytest.fixture(scope="module")
def routers(ray_runtime, tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("chaos-data")
    creator = Served([ROUTER, "serve", "--address", ray_runtime, "--namespace", NAMESPACE, "--port", "0"],
                     env={**_env(SETTINGS), "ROUTER_DATA_DIR": str(data_dir)})
    try:
        creator.signal_urls(1, 120)  # every endpoint printed: the scenario reads its URL from them
        joiner = start_router(port=0, gateways=2, data_dir=data_dir, **SETTINGS)
    except BaseException:
        creator.kill()
        raise
    yield creator, joiner, data_dir
    creator.kill()
    joiner.router.stop()


def urls(running: RunningRouter, path: str) -> list[str]:
    return [f"ws://127.0.0.1:{gateway['listeners'][0]['port']}{path}" for gateway in running.router.endpoints()]


class Traffic:
    """Every dialect's long-lived clients and what each has been sent and has received."""

    def __init__(self, joiner: RunningRouter, data_dir: Path) -> None:
        self.joiner = joiner
        self.data_dir = data_dir
        base = urls(joiner, "")[0]
        self.signal_url = base + "/signal"
        self.http_url = "http://" + base.removeprefix("ws://")
        self.cashu_url = base + "/v1/ws"
        self.hub_url = base + "/hub/ws"
        self.save_url = base + "/save"
        self.events_url = base + "/v1/events"
        self.nolag_url = base + "/ws"
        self.published = 0
        self.written: list[str] = []
        self.y = "03" + os.urandom(32).hex()
        self.pushed = 0
        self.last_state: dict | None = None
        self.blocks = 0
        self.probes = 0
        self.heal_times: dict[str, list[float]] = {}
        self.purge_times: dict[str, float] = {}

    async def open(self) -> None:
        self.actor = await HubClient.open(self.signal_url, "chaos/actor")
        reply = await self.actor.request("hub:register", {"actorAddress": "chaos/actor", "ttl": 3_600_000})
        assert reply["type"] == "hub:registered", reply
        self.listeners = [await HubClient.open(self.signal_url, f"chaos/listener-{i}") for i in range(3)]
        for listener in self.listeners:
            topic = f"chaos/topic-{self.listeners.index(listener)}"  # spread over the topic shards
            assert (await listener.request("hub:subscribe", {"topic": topic}))["type"] == "hub:subscribed"
        self.sender = await HubClient.open(self.signal_url, "chaos/sender")
        # hub:send is fire-and-forget: a failed one answers an uncorrelated hub:error, left unread here
        self.prober = await HubClient.open(self.signal_url, "chaos/prober")
        self.wallet = await Wallet.open(self.cashu_url)
        request_id = await self.wallet.subscribe("proof_state", [self.y], "chaos")
        await self.wallet.expect_ok(request_id, "chaos")
        assert (await self.wallet.notification())[1]["state"] == "UNSPENT"
        self.consumers = []
        for _ in range(4):  # their filters land on both topic shards
            consumer = await Consumer.open(self.hub_url)
            await consumer.subscribe("All")
            self.consumers.append(consumer)
        self.node = await Node.open(self.save_url)
        self.rest = Rest(self.http_url + "/v1")
        await self.rest.__aenter__()
        keys = open_key_store(self.joiner.settings)
        self.subscriber = await NoLagClient.open(self.nolag_url, keys.create("chaos")[0])
        await self.subscriber.subscribe("chaos/room/nolag", qos=1)
        self.publisher = await NoLagClient.open(self.nolag_url, keys.create("chaos")[0])
        await self.publisher.subscribe("chaos/room/nolag", qos=0)  # NoLag publishes to topics one joined
        self.live = await Events.open(self.events_url)
        await self.live.subscribe("chaos", "Chaos", query={"n": {"$gte": 0}}, initial=True)
        assert await self.live.result("chaos") == []

    # -- one round of every dialect after a kill --------------------------------------------------

    async def round(self, name: str, killed_at: float) -> None:
        await asyncio.gather(self._signal(name, killed_at), self._cashu(name, killed_at), self._mx(name, killed_at),
                             self._baqend(name, killed_at), self._nolag(name, killed_at))

    def _healed(self, dialect: str, killed_at: float) -> None:
        took = time.monotonic() - killed_at
        self.heal_times.setdefault(dialect, []).append(took)
        assert took < HEAL_LIMIT_S, f"{dialect} took {took:.2f}s to heal"

    async def _signal(self, name: str, killed_at: float) -> None:
        self.probes += 1
        probe = {"probe": self.probes, "after": name}
        await self.prober.send("hub:send", probe, to="chaos/actor")
        while True:
            try:
                message = await self.actor.recv(timeout=0.5)
            except TimeoutError:  # a send that met the dying shard is lost (no QoS): send again
                await self.prober.send("hub:send", probe, to="chaos/actor")
                continue
            if message["payload"] == probe:
                break
            assert message["payload"]["probe"] < self.probes, message  # an earlier one, sent twice
        for index, listener in enumerate(self.listeners):
            topic = f"chaos/topic-{index}"
            reply = await self.sender.request("hub:publish", {"topic": topic, "message": probe})
            while reply["type"] != "hub:delivery_ack":  # an error: it met the dying process
                reply = await self.sender.request("hub:publish", {"topic": topic, "message": probe})
            assert reply["payload"]["subscriberCount"] == 1, reply  # never a shard that forgot them
            got = await listener.recv()
            while got["payload"]["message"] != probe:  # an earlier probe, published twice
                got = await listener.recv()
        found = await self.sender.request("hub:discover", {"pattern": "^chaos/actor$"})
        while found["type"] != "hub:discovery_result":  # another registry shard is still coming back
            found = await self.sender.request("hub:discover", {"pattern": "^chaos/actor$"})
        assert found["payload"]["totalMatches"] == 1, found
        self._healed("signal", killed_at)

    async def _cashu(self, name: str, killed_at: float) -> None:
        self.pushed += 1
        state = {"Y": self.y, "state": "PENDING", "witness": f"{name}-{self.pushed}"}
        while True:
            try:
                await push(self.http_url, "proof_state", state)
                break
            except FeedError as error:  # 503: the shard died under it; a mint's feeder pushes again
                assert error.status == 503, error
        while True:
            sub_id, payload = await self.wallet.notification()
            if payload == state:
                break
            # Nothing else but the last round's state again (a push that got 503 had been stored).
            assert payload == self.last_state, (payload, state)
        self.last_state = state
        self._healed("cashu", killed_at)

    async def _mx(self, name: str, killed_at: float) -> None:
        self.blocks += 1
        saved = generator.generate_save_block(90_000 + self.blocks, transactions=4)
        await self.node.push_until_acknowledged(node.SAVE_BLOCK, generator.save_block_payload(saved, node.GOGO))
        await self.node.finalize(saved)
        events = [event.SerializeToString() for event in node.normalize_save_block(saved).events]
        block_hash = saved.BlockData.HeaderHash.hex()
        for consumer in self.consumers:
            got = await consumer.until_finalized(block_hash)
            received = [m.SerializeToString() for t, m in got if t == mx_codec.EVENTS_TOPIC]
            assert list(dict.fromkeys(received)) == events, name
        self._healed("mx", killed_at)


    async def _baqend(self, name: str, killed_at: float) -> None:
        key = f"d{len(self.written)}"
        body = {"id": f"/db/Chaos/{key}", "n": len(self.written), "round": name}
        failed = False
        while True:
            status, reply = await self.rest.call("POST", "/db/Chaos", body)
            if status == 201 or (status == 409 and failed):  # 409: a try that failed had stored it
                break
            assert status in (500, 503, 504), (status, reply)  # it met the dying process: write it again
            failed = True
        self.written.append(key)
        while True:
            frame = await self.live.recv()
            assert frame["type"] == "match", frame  # never a second result
            if key_of(frame["data"]) == key:
                assert brief(frame) == ("add", "insert", key, None), frame
                break
            assert key_of(frame["data"]) in self.written, frame  # an earlier write, seen again
        self._healed("baqend", killed_at)

    async def _nolag(self, name: str, killed_at: float) -> None:
        self.published += 1
        data, ref = {"n": self.published, "round": name}, f"m{self.published}"
        while True:  # QoS 1: confirmed means stored in the log; one that met the dying shard is refused
            await self.publisher.publish("chaos/room/nolag", data, msgRef=ref, echo=False, qos=1)
            reply = await self.publisher.recv(timeout=30)
            if reply == {"type": "published", "topic": "chaos/room/nolag", "msgRef": ref}:
                break
            assert reply["type"] == "error" and reply["error"] == "internal_error", reply
        while True:
            message = await self.subscriber.recv()
            assert message["type"] == "message" and message["topic"] == "chaos/room/nolag", message
            if message.get("requiresAck"):
                await self.subscriber.send({"type": "ack", "msgId": message["msgId"]})
            if message["data"] == data:
                break
            assert message["data"]["n"] < self.published, message  # an earlier one, delivered again
        self._healed("nolag", killed_at)

    async def close(self) -> None:
        await self.rest.__aexit__(None, None, None)


def test_every_kill_heals_in_under_5s_and_nothing_acknowledged_is_lost(routers):
    creator, joiner, data_dir = routers
    traffic = Traffic(joiner, data_dir)

    async def scenario() -> None:
        await traffic.open()
        await traffic.round("warm-up", time.monotonic())
        traffic.heal_times.clear()
        # Clients of the gateways that will die: their registrations must go with them.
        roamer = await _register(urls(joiner, "/signal")[1], "chaos/roamer")
        (creator_url,) = creator.signal_urls(1, 10)
        stranded = await _register(creator_url, "chaos/stranded")
        for kind, count in SHARDS.items():
            for index in range(count):
                await traffic.round(f"{kind}{index}", kill_shard(joiner.router, kind, index)[0])
        # A gateway of the joiner (the clients are on the other one): its supervisor replaces it.
        victim = joiner.router.gateways[1]
        ray.kill(victim.actor, no_restart=True)
        killed_at = time.monotonic()
        await traffic.round("gateway", killed_at)  # the other gateway's clients do not notice
        await asyncio.to_thread(_supervise_until_replaced, joiner)
        traffic.purge_times["replaced gateway"] = time.monotonic() - killed_at
        await _until_gone(traffic.sender, "chaos/roamer")
        roamer = await _register(traffic.signal_url, "chaos/roamer")  # it reconnects elsewhere: no conflict
        # The process that created the shards: its gateway goes with it; the shards stay.
        creator.kill()
        killed_at = time.monotonic()
        await traffic.round("creator", killed_at)
        await _until_gone(traffic.sender, "chaos/stranded")
        traffic.purge_times["creator's gateway"] = time.monotonic() - killed_at
        stranded = await _register(traffic.signal_url, "chaos/stranded")
        for client in (roamer, stranded):
            await client.close()
        await traffic.close()
        assert [entry["name"] for entry in ray.util.list_named_actors(all_namespaces=True)
                if entry.get("namespace") == NAMESPACE and entry["name"].startswith(GATEWAY_PREFIX)
                and entry["name"] not in {f"{GATEWAY_PREFIX}{g.gateway_id}" for g in joiner.router.gateways}] == []

    asyncio.run(asyncio.wait_for(scenario(), 240))
    print("\nchaos healing times (s), per dialect over",
          {dialect: len(times) for dialect, times in traffic.heal_times.items()}, "kills:")
    for dialect, times in traffic.heal_times.items():
        print(f"  {dialect:<8} p50 {statistics.median(times):.2f}  max {max(times):.2f}")
    print("  a dead gateway: replaced / its registrations purged after (s):",
          {name: round(took, 2) for name, took in traffic.purge_times.items()})


async def _register(url: str, address: str) -> HubClient:
    client = await HubClient.open(url, address)
    reply = await client.request("hub:register", {"actorAddress": address, "ttl": 3_600_000})
    assert reply["type"] == "hub:registered", reply
    return client


async def _until_gone(client: HubClient, address: str, timeout: float = 15) -> None:
    """Until ``discover`` no longer finds ``address`` (registered for an hour: purged, not expired)."""
    deadline = time.monotonic() + timeout
    while True:
        found = await client.request("hub:discover", {"pattern": f"^{address}$"})
        if found["type"] == "hub:discovery_result" and found["payload"]["totalMatches"] == 0:
            return
        assert time.monotonic() < deadline, f"{address} still registered: {found}"
        await asyncio.sleep(0.1)


def _supervise_until_replaced(joiner: RunningRouter) -> None:
    deadline = time.monotonic() + 60
    restarts = joiner.router.restarts
    while joiner.router.restarts == restarts:
        assert time.monotonic() < deadline, "the gateway was not replaced"
        joiner.router.supervise(timeout=0.5)
