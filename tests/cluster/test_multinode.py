"""The router on a real multi-node Ray cluster on this machine (router/localcluster.py): three Ray
nodes, a `router serve` on each with its gateway pinned to its node, the stores on PostgreSQL
(`store.url`), the event log in one shared folder (`analytics.directory`).

- `router status --json` lists the nodes, the gateway and shards of each, and the lanes by kind:
  Unix within a node, TLS over TCP between nodes;
- clients of every dialect on different nodes' gateways talk to each other (exact frames);
- a worker node is lost (every process of it SIGKILLed, its router too): its shards come back on the
  other nodes, nothing durable is lost (NoLag QoS 1 messages, a Cashu retained state, a Baqend
  document), and its clients reconnect to another node's gateway and carry on. Recovery time
  (kill -> a new message reaches every subscriber) and lost QoS 1 messages are measured;
- `router analytics` counts the traffic of every node, the lost one's too;
- stopping leaves no process behind.

One cluster for the module; its tests run in this order (the later ones use what the earlier left:
a node lost, traffic in the event log). The measured figures are printed at the end.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from websockets.exceptions import ConnectionClosed

from gateways.mx import codec
from gateways.mx import node as mx_node
from router.eventlog import read_events
from router.localcluster import LocalCluster
from tests.e2e.baqend_client import Events, Rest
from tests.e2e.cashu_client import API_KEY, Wallet, mint_quote, push
from tests.e2e.client import HUB, HubClient, eventually, run
from tests.e2e.mx_client import Consumer, Node
from tests.e2e.nolag_client import Client
from tests.e2e.test_mx import block
from tests.e2e.test_nolag_healing import Reader, publish_until_confirmed, reconnect

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
NODES = 3
# Shards are dealt round the nodes by name, kind after kind (router/runtime.py): with two registry
# shards the victim, node-1, holds the topic shard (NoLag log, Cashu retained states, every
# subscription) and the document shard (Baqend documents).
SHARDS = {"session": 1, "topic": 1, "registry": 2, "document": 1, "query": 1}
PLACEMENT = {"node-0": ["registry-shard-1", "session-shard-0"], "node-1": ["document-shard-0", "topic-shard-0"],
             "node-2": ["query-shard-0", "registry-shard-0"]}
VICTIM = 1
ANALYTICS_TOPIC = "cluster/analytics"
CONFIG = """
namespace = "cluster"
port = 0
log_level = "WARNING"

[shards]
{shards}

[analytics]
directory = "{events}"
writer = "thread"
flush_interval_s = 0.5

[cashu]
state_api_key = "{api_key}"
"""
MEASURED: dict[str, Any] = {}  # printed at the end of the module


class Cluster:
    def __init__(self, local: LocalCluster, config: Path, store_url: str, events: Path) -> None:
        self.local = local
        self.config = config
        self.root = config.parent
        self.store_url = store_url
        self.events = events
        self.tokens: list[str] = []

    def url(self, node: int, dialect: str) -> str:
        return self.local.routers[node].endpoints[dialect]

    def http(self, node: int) -> str:
        return self.local.routers[node].http

    def gateway(self, node: int) -> str:
        return self.local.routers[node].gateway

    def env(self) -> dict[str, str]:
        """The environment of a `router` command run on the head, as an operator runs it."""
        return self.local.env({"ROUTER_CONFIG": str(self.config), "ROUTER_STORE__URL": self.store_url,
                               "ROUTER_DATA_DIR": str(self.root / "data-0")})

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        done = subprocess.run([sys.executable, "-m", "router.cli", *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=timeout, env=self.env())
        assert done.returncode == 0, done.stdout + done.stderr
        return done

    def status(self) -> dict[str, Any]:
        done = self.cli("status", "--address", self.local.address, "--json")
        try:
            return json.loads(done.stdout)
        except json.JSONDecodeError:
            raise AssertionError(f"router status --json printed no JSON:\n{done.stdout}\n{done.stderr}") from None


@pytest.fixture(scope="module")
def cluster(postgres_server, tmp_path_factory):
    root = tmp_path_factory.mktemp("cluster")
    events = root / "events"  # every node's gateway writes here: "shared storage" on one machine
    config = root / "router.toml"
    config.write_text(CONFIG.format(shards="\n".join(f"{kind} = {count}" for kind, count in SHARDS.items()),
                                    events=events, api_key=API_KEY))
    started = time.monotonic()
    local = LocalCluster(NODES, root).start()
    try:
        MEASURED["nodes up (s)"] = round(time.monotonic() - started, 1)
        state = Cluster(local, config, postgres_server.fresh_url(), events)
        local.serve_all(env={"ROUTER_CONFIG": str(config), "ROUTER_STORE__URL": state.store_url},
                        node_env={i: {"ROUTER_DATA_DIR": str(root / f"data-{i}")} for i in range(NODES)})
        MEASURED["routers up (s)"] = round(time.monotonic() - started, 1)
        keys = [subprocess.Popen([sys.executable, "-m", "router.cli", "keys", "create", "--project", "proj_1"],
                                 cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=state.env())
                for _ in range(4)]  # NoLag keys, made on the head: the gateways of every node must know them
        for process in keys:
            out, err = process.communicate(timeout=120)
            assert process.returncode == 0, out + err
            state.tokens.append(re.search(r"^token:\s+(\S+)$", out, re.M)[1])
        yield state
    finally:
        local.stop()
        print(f"\nmulti-node cluster: {MEASURED}")
        for router in local.routers:  # what went wrong, if anything did (all of it: <root>/router-*.log)
            notable = [line for line in router.lines if re.search(r"WARNING|ERROR|Traceback|replaced|raylet", line)
                       and "a warning for every driver" not in line]  # not test_status_json…'s own
            if notable:
                print(f"router of node-{router.node}:", *notable[:40], sep="\n  ")


def checked_lanes(status: dict[str, Any]) -> dict[str, int]:
    """The lane totals `router status` counts, after checking every lane's kind against where its
    two ends run: Unix when the gateway is on the shard's node, TCP otherwise."""
    gateway_nodes = {gateway["gateway"]: gateway["node"] for gateway in status["gateways"]}
    for shard in status["shards"]:
        assert shard["state"] == "ALIVE", shard
        assert sorted(shard["lane_kinds"]) == sorted(gateway_nodes), shard["name"]  # one from every gateway
        for gateway, kind in shard["lane_kinds"].items():
            assert kind == ("unix" if gateway_nodes[gateway] == shard["node"] else "tcp"), (shard["name"], gateway)
    return status["lanes"]


def settled_status(cluster: Cluster, timeout_s: float = 30) -> dict[str, Any]:
    """`router status` once every shard is alive with a lane from every gateway (a gateway reopens
    the lanes of a restarted shard in the background)."""
    deadline = time.monotonic() + timeout_s
    while True:
        status = cluster.status()
        gateways = sorted(gateway["gateway"] for gateway in status["gateways"])
        if all(shard["state"] == "ALIVE" and sorted(shard.get("lane_kinds") or {}) == gateways
               for shard in status["shards"]) or time.monotonic() > deadline:
            return status
        time.sleep(0.5)


def event_rows(events: Path, topic: str) -> dict[tuple[str, str], int]:
    """(gateway, direction) -> events of ``topic`` in the shared event log (the files written so far)."""
    counts: dict[tuple[str, str], int] = {}
    for path in events.glob("date=*/hour=*/*.parquet"):
        if path.name.startswith("."):
            continue
        table = read_events(path).select(["topic", "gateway", "direction"]).to_pandas()  # an event a row
        for (gateway, direction), rows in table[table["topic"] == topic].groupby(["gateway", "direction"]).size().items():
            counts[gateway, direction] = counts.get((gateway, direction), 0) + int(rows)
    return counts


async def logged(cluster: Cluster, expected: dict[tuple[str, str], int]) -> None:
    """Wait until the shared event log holds ``expected`` rows of the analytics topic."""
    seen: list[dict] = []

    async def probe():
        seen.append(await asyncio.to_thread(event_rows, cluster.events, ANALYTICS_TOPIC))
        return all(seen[-1].get(key, 0) == rows for key, rows in expected.items())

    try:
        await eventually(probe, timeout=30, interval=0.2)
    except AssertionError:
        raise AssertionError(f"the event log holds {seen[-1]} rows of {ANALYTICS_TOPIC}, not {expected}") from None


# -- the cluster as it starts --------------------------------------------------------------------

def test_status_lists_nodes_gateways_shards_and_lanes_by_kind(cluster):
    status = settled_status(cluster)
    nodes = {node["name"]: node for node in status["nodes"]}
    assert sorted(nodes) == ["node-0", "node-1", "node-2"]
    assert [(nodes[f"node-{i}"]["alive"], nodes[f"node-{i}"]["head"]) for i in range(NODES)] == [
        (True, True), (True, False), (True, False)]
    assert [nodes[f"node-{i}"]["id"] for i in range(NODES)] == [node.node_id for node in cluster.local.nodes]
    for index in range(NODES):  # each router's gateway on its own node
        assert nodes[f"node-{index}"]["gateways"] == [cluster.gateway(index)]
    assert {name: node["shards"] for name, node in nodes.items()} == PLACEMENT
    lanes = checked_lanes(status)
    MEASURED["lanes at start"] = lanes
    assert lanes == {"unix": 6, "tcp": 12}  # 6 shards: one gateway on its node, two elsewhere
    store = status["store"]
    assert (store["backend"], store["ok"], store["error"]) == ("postgresql", True, None)
    assert re.fullmatch(r"postgresql://router@127\.0\.0\.1:\d+/router", store["url"])  # no password

    human = cluster.cli("status", "--address", cluster.local.address).stdout
    assert "namespace cluster: 3 of 3 node(s) alive, 3 gateway(s), 6 shard(s); lanes 6 unix, 12 tcp" in human
    assert re.search(r"^node node-1 \w{12} \S+ alive$", human, re.M)
    assert re.search(r"^  topic-shard-0 .* lanes 1 unix 2 tcp ", human, re.M)


# Published to every driver of the cluster, as a raylet's warnings are (too many workers starting, a
# node marked dead), until killed: a driver prints them on its standard output.
WARN_EVERY_DRIVER = """
import sys, time
from ray._private.utils import publish_error_to_driver
from ray._raylet import GcsClient

client = GcsClient(address=sys.argv[1])
publish_error_to_driver("router_test", "a warning for every driver", client)
print("warning", flush=True)
while True:
    time.sleep(0.02)
    publish_error_to_driver("router_test", "a warning for every driver", client)
"""


def test_status_json_is_json_alone_while_the_cluster_warns_every_driver(cluster):
    warner = subprocess.Popen([sys.executable, "-c", WARN_EVERY_DRIVER, cluster.local.address], env=cluster.env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    asked = 0
    try:
        assert warner.stdout.readline() == "warning\n", warner.stderr.read()  # it publishes: now ask
        deadline = time.monotonic() + 90
        while True:  # `status` is connected for a moment only: ask until a warning reaches it
            done = cluster.cli("status", "--address", cluster.local.address, "--json")
            asked += 1
            assert sorted(json.loads(done.stdout)) == ["gateways", "lanes", "namespace", "nodes", "shards", "store"]
            if "a warning for every driver" in done.stderr:  # it came, and went to stderr
                break
            assert time.monotonic() < deadline and warner.poll() is None, warner.stderr.read()
    finally:
        warner.kill()
        warner.wait(10)
    MEASURED["status asked until a warning reached it"] = asked


# -- every dialect, across nodes -----------------------------------------------------------------

async def signal_across_nodes(cluster: Cluster) -> None:
    """A subscriber on each node gets every node's publications (each origin's in order), and a
    hub:send crosses nodes byte for byte. The analytics topic: test_router_analytics counts it."""
    clients = [await HubClient.open(cluster.url(i, "signal"), f"cluster/a{i}") for i in range(NODES)]
    for client in clients:
        assert (await client.request("hub:subscribe", {"topic": ANALYTICS_TOPIC}))["type"] == "hub:subscribed"
    sent = []
    for n in range(2):
        for index, client in enumerate(clients):
            publication = client.envelope("hub:publish", {"topic": ANALYTICS_TOPIC, "message": {"node": index, "n": n}},
                                          correlationId=f"p{index}-{n}")
            await client.send_raw(json.dumps(publication))
            sent.append(publication)
    for client in clients:
        frames = [await client.recv() for _ in range(2 * NODES + 2)]  # every publication, its own 2 acks
        for origin in clients:
            assert [f for f in frames if f["type"] == "hub:publish" and f["from"] == origin.address] == [
                p for p in sent if p["from"] == origin.address]
        assert [f for f in frames if f["type"] == "hub:delivery_ack"] == [
            {"type": "hub:delivery_ack", "from": HUB, "to": client.address, "correlationId": p["correlationId"],
             "payload": {"topic": ANALYTICS_TOPIC, "subscriberCount": NODES, "deliveredCount": NODES}}
            for p in sent if p["from"] == client.address]
    assert (await clients[1].request("hub:register", {"actorAddress": "cluster/a1"}))["type"] == "hub:registered"
    message = json.dumps({"type": "hub:send", "from": "cluster/a2", "to": "cluster/a1", "payload": {"across": True}})
    await clients[2].send_raw(message)
    assert await clients[1].recv_raw() == message
    for client in clients:
        await client.close()


async def nolag_across_nodes(cluster: Cluster) -> None:
    topic = "cluster/cross/messages"
    subscriber = await Client.open(cluster.url(2, "nolag"), cluster.tokens[0])
    publisher = await Client.open(cluster.url(1, "nolag"), cluster.tokens[1])
    assert await subscriber.subscribe(topic, qos=1) == {"type": "subscribed", "topic": topic, "loadBalance": False}
    await publisher.subscribe(topic, qos=0)
    await publisher.publish(topic, {"text": "from node-1"}, qos=1, echo=False, msgRef=7)
    assert await publisher.recv() == {"type": "published", "topic": topic, "msgRef": 7}
    message = await subscriber.expect("message")
    assert {key: value for key, value in message.items() if key not in ("timestamp", "msgId")} == {
        "type": "message", "topic": topic, "data": {"text": "from node-1"}, "requiresAck": True}
    await subscriber.send({"type": "ack", "msgId": message["msgId"]})
    await subscriber.quiet()
    for client in (subscriber, publisher):
        await client.close()


async def cashu_across_nodes(cluster: Cluster) -> None:
    quote = f"cross-{time.monotonic_ns()}"
    wallet = await Wallet.open(cluster.url(2, "cashu"))
    await wallet.expect_ok(await wallet.subscribe("bolt11_mint_quote", [quote], "w"), "w")
    stored = await push(cluster.http(0), "bolt11_mint_quote", mint_quote(quote, "UNPAID"))
    assert stored == {"kind": "bolt11_mint_quote", "id": quote, "stored": True, "version": 1, "subscribers": 1}
    assert await wallet.notification() == ("w", mint_quote(quote, "UNPAID"))
    await wallet.quiet()
    await wallet.close()


async def baqend_across_nodes(cluster: Cluster) -> None:
    bucket = f"Cross{time.monotonic_ns()}"
    events = await Events.open(cluster.url(2, "baqend"))
    await events.subscribe("e", bucket, initial=True)
    assert await events.result("e") == []
    async with Rest(cluster.http(1) + "/v1") as rest:
        stored = await rest.insert(bucket, "k1", n=1, name="from node-1")
    assert await events.recv() == {"id": "e", "type": "match", "matchType": "add", "operation": "insert", "data": stored}
    await events.close()


async def mx_events(consumers: list[Consumer], node_url: str) -> None:
    """A block pushed through ``node_url`` reaches every consumer (subscribed to All) exactly."""
    saved = block(8)
    normalized = mx_node.normalize_save_block(saved)
    feeder = await Node.open(node_url)
    await feeder.save(saved)
    await feeder.finalize(saved)
    for consumer in consumers:
        got = await consumer.until_finalized(saved.BlockData.HeaderHash.hex())
        assert [message for topic, message in got if topic == codec.EVENTS_TOPIC] == list(normalized.events)
        assert [topic for topic, _ in got if topic != codec.EVENTS_TOPIC] == [codec.BLOCK_TXS_TOPIC,
                                                                              codec.BLOCK_SCRS_TOPIC]
    await feeder.close()


async def mx_across_nodes(cluster: Cluster) -> None:
    consumers = [await Consumer.open(cluster.url(i, "mx")) for i in (1, 2)]
    for consumer in consumers:
        await consumer.subscribe("All")
    await mx_events(consumers, cluster.url(0, "mx").replace("/hub/ws", "/save"))
    for consumer in consumers:
        await consumer.close()


def test_clients_of_every_dialect_on_different_nodes_talk_to_each_other(cluster):
    async def scenario():
        await signal_across_nodes(cluster)
        await nolag_across_nodes(cluster)
        await cashu_across_nodes(cluster)
        await baqend_across_nodes(cluster)
        await mx_across_nodes(cluster)

    run(scenario(), timeout=90)


# -- a node lost ---------------------------------------------------------------------------------

class SignalBeat:
    """Signal Hub subscribers of one topic, and a publisher sending ``{"n": n}`` every ``pace`` s
    without waiting for acks; each subscriber records when each ``n`` first reached it."""

    topic = "cluster/loss/beat"

    def __init__(self, publisher: HubClient, pace: float = 0.1) -> None:
        self.publisher, self.pace = publisher, pace
        self.sent_at: dict[int, float] = {}
        self.arrivals: list[dict[int, float]] = []
        self.tasks: list[asyncio.Task] = [asyncio.ensure_future(self._drain(publisher))]
        self.stopped = asyncio.Event()

    async def subscribe(self, client: HubClient) -> dict[int, float]:
        """Subscribe ``client`` (its reader started first: a publication may overtake the reply)."""
        arrivals: dict[int, float] = {}
        subscribed = asyncio.Event()
        self.arrivals.append(arrivals)
        self.tasks.append(asyncio.ensure_future(self._read(client, arrivals, subscribed)))
        await client.send("hub:subscribe", {"topic": self.topic})
        await asyncio.wait_for(subscribed.wait(), 30)
        return arrivals

    def start(self) -> None:
        self.tasks.append(asyncio.ensure_future(self._publish()))

    async def _publish(self) -> None:
        n = 0
        while not self.stopped.is_set():
            self.sent_at[n] = time.monotonic()
            await self.publisher.send("hub:publish", {"topic": self.topic, "message": {"n": n}})
            n += 1
            await asyncio.sleep(self.pace)

    @staticmethod
    async def _drain(client: HubClient) -> None:
        try:
            while True:
                await client.recv(timeout=600)
        except ConnectionClosed:
            return

    @staticmethod
    async def _read(client: HubClient, arrivals: dict[int, float], subscribed: asyncio.Event) -> None:
        try:
            while True:
                frame = await client.recv(timeout=600)
                if frame["type"] == "hub:subscribed":
                    subscribed.set()
                elif frame["type"] == "hub:publish":
                    arrivals.setdefault(frame["payload"]["message"]["n"], time.monotonic())
        except ConnectionClosed:
            return

    def reached_all(self, after: float, arrivals: list[dict[int, float]]) -> float | None:
        """When the first publication sent after ``after`` had reached every one of ``arrivals``."""
        for n, sent in sorted(self.sent_at.items()):
            if sent > after and all(n in each for each in arrivals):
                return max(each[n] for each in arrivals)
        return None

    async def close(self) -> None:
        self.stopped.set()
        for task in self.tasks:
            task.cancel()


class NolagStream:
    """QoS 1 messages ``{"n": n}`` from one NoLag client, one at a time, each published again until
    ``published`` confirms it (a publish that met the dying shard gets ``internal_error``)."""

    def __init__(self, client: Client, topic: str, pace: float = 0.05) -> None:
        self.client, self.topic, self.pace = client, topic, pace
        self.sent_at: dict[int, float] = {}
        self.confirmed = 0
        self.stopped = asyncio.Event()
        self.task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        n = 0
        while not self.stopped.is_set():
            self.sent_at[n] = time.monotonic()
            await publish_until_confirmed(self.client, self.topic, {"n": n}, n, qos=1)
            n = self.confirmed = n + 1
            await asyncio.sleep(self.pace)

    async def stop(self) -> int:
        self.stopped.set()
        await asyncio.wait_for(self.task, 60)
        return self.confirmed


async def value(result: Any) -> Any:
    return result


def first_arrival(reader: Reader, n: int) -> float | None:
    return next((at for at, frame in reader.messages if frame["data"]["n"] == n), None)


def test_a_lost_node_loses_nothing_durable_and_its_clients_carry_on_elsewhere(cluster):
    victim_gateway = cluster.gateway(VICTIM)
    save_url = cluster.url(2, "mx").replace("/hub/ws", "/save")

    async def scenario():
        # The lost node's gateway wrote its records to the shared event log (test_router_analytics).
        await logged(cluster, {(cluster.gateway(i), direction): rows for i in range(NODES)
                               for direction, rows in (("in", 3), ("out", 6))})

        # NoLag: a QoS 1 stream from node-0 to three acking subscribers: one on node-2 that stays, one on
        # the victim that the loss cuts off, and one on the victim that leaves before it and comes back after.
        topic = "cluster/loss/stream"
        readers = {"stays": Reader(), "moves": Reader(), "returns": Reader()}
        tokens = dict(zip(readers, cluster.tokens))
        clients = {}
        for name, node in (("stays", 2), ("moves", VICTIM), ("returns", VICTIM)):
            clients[name] = await Client.open(cluster.url(node, "nolag"), tokens[name])
            assert (await clients[name].subscribe(topic, qos=1))["type"] == "subscribed"
            readers[name].follow(clients[name])
        publisher = await Client.open(cluster.url(0, "nolag"), cluster.tokens[3])
        await publisher.subscribe(topic, qos=0)
        stream = NolagStream(publisher, topic)

        # Signal Hub: a beat from node-0 to a subscriber on each node.
        beat = SignalBeat(await HubClient.open(cluster.url(0, "signal"), "cluster/beat"))
        signal_subscribers = [await HubClient.open(cluster.url(i, "signal"), f"cluster/s{i}") for i in range(NODES)]
        arrivals = [await beat.subscribe(client) for client in signal_subscribers]
        beat.start()

        # Durable state on the victim's shards: a Cashu state (topic shard), a Baqend document (document shard).
        quote = f"loss-{time.monotonic_ns()}"
        wallet = await Wallet.open(cluster.url(2, "cashu"))
        await wallet.expect_ok(await wallet.subscribe("bolt11_mint_quote", [quote], "w"), "w")
        await push(cluster.http(0), "bolt11_mint_quote", mint_quote(quote, "UNPAID"))
        assert (await push(cluster.http(0), "bolt11_mint_quote", mint_quote(quote, "PAID")))["version"] == 2
        assert [await wallet.notification() for _ in range(2)] == [("w", mint_quote(quote, "UNPAID")),
                                                                   ("w", mint_quote(quote, "PAID"))]
        bucket = f"Loss{time.monotonic_ns()}"
        watcher = await Events.open(cluster.url(2, "baqend"))
        await watcher.subscribe("e", bucket, initial=True)
        assert await watcher.result("e") == []
        async with Rest(cluster.http(VICTIM) + "/v1") as rest:
            document = await rest.insert(bucket, "kept", n=1, name="written on node-1")
        assert (await watcher.recv())["data"] == document

        # mx: consumers on node-0 and on the victim.
        consumers = [await Consumer.open(cluster.url(i, "mx")) for i in (0, VICTIM)]
        for consumer in consumers:
            await consumer.subscribe("All")

        returning = readers["returns"]
        await eventually(lambda: value(len(returning.messages) >= 20), 20, what="the NoLag stream flows")
        await returning.flushed(clients["returns"])
        await clients["returns"].close()
        await asyncio.wait_for(returning.task, 20)
        had = set(returning.count())
        left_at = stream.confirmed
        await eventually(lambda: value(stream.confirmed >= left_at + 10), 20, what="messages while it is away")

        killed_at = await asyncio.to_thread(cluster.local.remove_node, VICTIM)
        confirmed_before = stream.confirmed  # at least: more may have been confirmed in the last instant

        # The victim's clients' sockets close; each reconnects to another node's gateway (as a load
        # balancer would send it), and so does the client that had left.
        await asyncio.wait_for(readers["moves"].task, 20)
        clients["moves"] = await reconnect(cluster.url(2, "nolag"), tokens["moves"], topic)
        readers["moves"].follow(clients["moves"])
        replay_from = len(returning.messages)
        clients["returns"] = await reconnect(cluster.url(0, "nolag"), tokens["returns"], topic)
        returning.follow(clients["returns"])
        await asyncio.wait_for(signal_subscribers[VICTIM].ws.wait_closed(), 20)
        moved = await HubClient.open(cluster.url(2, "signal"), f"cluster/s{VICTIM}")
        arrivals[VICTIM] = await beat.subscribe(moved)
        await asyncio.wait_for(consumers[1].ws.wait_closed(), 20)
        consumers[1] = await Consumer.open(cluster.url(2, "mx"))
        await consumers[1].subscribe("All")

        async def signal_recovered():
            return beat.reached_all(killed_at, arrivals)

        async def nolag_recovered():
            first = next((n for n, sent in sorted(stream.sent_at.items()) if sent > killed_at), None)
            every = None if first is None else [first_arrival(reader, first) for reader in readers.values()]
            return every is not None and None not in every and max(every)

        signal_at = await eventually(signal_recovered, 60, what="Signal Hub publications reach every subscriber")
        nolag_at = await eventually(nolag_recovered, 60, what="NoLag messages reach every subscriber")
        MEASURED["recovery: Signal Hub, kill -> a new publication at every subscriber (s)"] = round(
            signal_at - killed_at, 2)
        MEASURED["recovery: NoLag QoS 1, kill -> a new message at every subscriber (s)"] = round(
            nolag_at - killed_at, 2)
        await beat.close()

        # Nothing confirmed is lost: every QoS 1 message reaches every subscriber; those confirmed
        # while the returning one was away (logged on the lost node's shard) come back in its replay.
        target = stream.confirmed + 20
        await eventually(lambda: value(len(readers["stays"].count()) >= target), 30, what="20 more messages")
        confirmed = await stream.stop()

        async def everything_arrived():
            return all(set(range(confirmed)) <= set(reader.count()) for reader in readers.values())

        await eventually(everything_arrived, 30, what="every confirmed message")
        lost = {name: sorted(set(range(confirmed)) - set(reader.count())) for name, reader in readers.items()}
        MEASURED["NoLag QoS 1 messages confirmed / lost"] = (confirmed, sum(len(n) for n in lost.values()))
        assert lost == {"stays": [], "moves": [], "returns": []}
        replayed = {frame["data"]["n"] for _, frame in returning.messages[replay_from:] if frame.get("isReplay")}
        assert set(range(confirmed_before)) - had <= replayed
        assert len(set(range(confirmed_before)) - had) >= 10
        for client in (*clients.values(), publisher):
            await client.close()

        # Cashu: the retained state survived its shard; a wallet elsewhere gets it, then the next one.
        fresh = await Wallet.open(cluster.url(0, "cashu"))
        await fresh.expect_ok(await fresh.subscribe("bolt11_mint_quote", [quote], "f"), "f")
        assert await fresh.notification() == ("f", mint_quote(quote, "PAID"))
        stored = await push(cluster.http(2), "bolt11_mint_quote", mint_quote(quote, "ISSUED"))
        assert (stored["version"], stored["subscribers"]) == (3, 2)
        assert await wallet.notification() == ("w", mint_quote(quote, "ISSUED"))
        assert await fresh.notification() == ("f", mint_quote(quote, "ISSUED"))
        for each in (wallet, fresh):
            await each.quiet()
            await each.close()

        # Baqend: the document survived its shard; the live query on node-2 goes on.
        async with Rest(cluster.http(0) + "/v1") as rest:
            assert await rest.call("GET", f"/db/{bucket}/kept") == (200, document)
            changed = await rest.set(bucket, "kept", n=2)
        assert await watcher.recv() == {"id": "e", "type": "match", "matchType": "change", "operation": "update",
                                        "data": changed}
        await watcher.close()

        # mx: blocks reach the consumer that stayed and the one that moved.
        await mx_events(consumers, save_url)
        for consumer in consumers:
            await consumer.close()
        for client in signal_subscribers[:VICTIM] + signal_subscribers[VICTIM + 1:] + [moved, beat.publisher]:
            await client.close()

    run(scenario(), timeout=150)

    status = settled_status(cluster)
    nodes = {node["name"]: node for node in status["nodes"]}
    assert [nodes[f"node-{i}"]["alive"] for i in range(NODES)] == [True, False, True]
    assert nodes["node-1"]["gateways"] == [] and nodes["node-1"]["shards"] == []
    assert sorted(gateway["gateway"] for gateway in status["gateways"]) == sorted(
        cluster.gateway(i) for i in (0, 2)) and victim_gateway not in str(status["shards"])
    assert sorted(nodes["node-0"]["shards"] + nodes["node-2"]["shards"]) == sorted(
        name for names in PLACEMENT.values() for name in names)  # all six, on the two nodes left
    lanes = checked_lanes(status)
    MEASURED["lanes after the loss"] = lanes
    assert lanes == {"unix": 6, "tcp": 6}
    # All of it came from PostgreSQL: no node kept a SQLite file (on one machine a restarted shard
    # could have reopened one of another node's, which a lost machine would have taken with it).
    assert sorted(cluster.root.glob("data-*/*.sqlite3")) == []


# -- the event log of every node -----------------------------------------------------------------

def test_router_analytics_counts_the_traffic_of_every_node(cluster, tmp_path):
    """Before the loss, a subscriber on each of the three nodes got 6 publications (3 subscribes and
    6 publishes in); after it, one on each of the two nodes left gets 4 (2 subscribes, 4 publishes)."""
    async def scenario():
        clients = [await HubClient.open(cluster.url(i, "signal"), f"cluster/b{i}") for i in (0, 2)]
        for client in clients:
            assert (await client.request("hub:subscribe", {"topic": ANALYTICS_TOPIC}))["type"] == "hub:subscribed"
        for n in range(2):
            for client in clients:
                await client.send("hub:publish", {"topic": ANALYTICS_TOPIC, "message": n})
        for client in clients:
            frames = [await client.recv() for _ in range(6)]  # 4 publications, 2 acks
            assert sorted(frame["type"] for frame in frames) == ["hub:delivery_ack"] * 2 + ["hub:publish"] * 4
            await client.close()
        await logged(cluster, {(cluster.gateway(0), "in"): 6, (cluster.gateway(0), "out"): 10,
                               (cluster.gateway(1), "in"): 3, (cluster.gateway(1), "out"): 6,
                               (cluster.gateway(2), "in"): 6, (cluster.gateway(2), "out"): 10})

    run(scenario(), timeout=60)
    out = tmp_path / "report"
    started = time.monotonic()
    done = cluster.cli("analytics", "--address", cluster.local.address, "--since", "1h", "--out", str(out),
                       "--top", "100", timeout=300)
    MEASURED["router analytics (s)"] = round(time.monotonic() - started, 1)
    assert re.search(rf"^analytics: read [\d,]+ events from {re.escape(str(cluster.events))}$", done.stdout, re.M)
    topics = pd.read_parquet(out / "top_topics.parquet").set_index("topic")
    assert (int(topics.loc[ANALYTICS_TOPIC, "messages_in"]), int(topics.loc[ANALYTICS_TOPIC, "deliveries"])) == (
        3 * 3 + 2 * 3, 3 * 6 + 2 * 4)


# -- the end -------------------------------------------------------------------------------------

def test_stop_ends_every_router_and_node_and_leaves_no_process(cluster):
    started = time.monotonic()
    forced = cluster.local.stop()
    MEASURED["stop (s)"] = round(time.monotonic() - started, 1)
    assert forced == []  # nothing had to be killed: every process ended on its own
    assert cluster.local.processes() == []
    for router in cluster.local.routers:
        if router.node != VICTIM:
            assert router.process.returncode == 0 and "router: stopped" in router.lines, router.lines
