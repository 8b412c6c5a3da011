"""NoLag state of a dead gateway's connections must not stay behind on the topic shards.

When a gateway dies, the supervisor replaces it and calls ``forget_gateway``: every shard purges
the state of the dead gateway's connections. A NoLag connection's state is spread over several
topic shards: its subscriptions (and load-balance group memberships) on the shard of
``nolag/<project>/<topic>``, its presence on the shard of ``nolag-room/<project>/<room>``, its
room memberships on the shard of each room it subscribed in. Those keys usually hash to different
shards, and a connection may be present in a room without subscribing to any of its topics, so
each shard has to find the dead gateway's connections in all of its NoLag state - else a ghost
load-balance member keeps winning turns (and those messages are lost) and a ghost stays present
in its rooms (no ``leave`` is ever sent).

``nolag_death``: its own router, two gateways, two shards of each kind; gateway 1 is killed.
"""

from __future__ import annotations

import asyncio
import time

import pytest
import ray

from actors.nolag.contract import room_key, topic_key
from gateways.nolag.session import room_of
from router.shardmap import shard_index
from tests.e2e.client import run
from tests.e2e.conftest import free_consecutive_ports, start_router
from tests.e2e.nolag_client import Client, NolagRouter

pytestmark = pytest.mark.e2e

PROJECT = "proj_1"
TOPIC = "jobs/pool/tasks"  # the load-balanced topic
GROUP = "workers"
ROOM = "hall"  # a presence room: the victim is present there without subscribing to any of its topics
ROOM_TOPIC = f"chat/{ROOM}/messages"  # the observer's subscription: it makes it a member of ROOM
TOPIC_SHARDS = 2
COUNT = 10


@pytest.fixture(scope="module")
def nolag_death(ray_runtime, tmp_path_factory) -> NolagRouter:
    data_dir = tmp_path_factory.mktemp("nolag-death-data")
    running = start_router(
        namespace="e2e-nolag-death", data_dir=data_dir, port=free_consecutive_ports(2), gateways=2,
        ray_dashboard=False, shards={"session": 2, "topic": TOPIC_SHARDS, "registry": 1},
        signal={"enabled": False}, cashu={"enabled": False}, mx={"enabled": False}, baqend={"enabled": False},
        gateway={"sweep_interval_s": 0.1},
    )
    yield NolagRouter(running, PROJECT)
    running.router.stop()


def test_the_chosen_keys_put_the_victims_state_on_shards_where_it_has_no_room_membership():
    """The scenario below relies on this placement (2 topic shards):

    - the victim's subscription to TOPIC lives on the topic key's shard, and its only room
      membership (the room of TOPIC, "pool") on the other shard;
    - its presence in ROOM (where it subscribes to nothing) lives on a shard where it is no room member.
    """
    subscription = shard_index(topic_key(PROJECT, TOPIC), TOPIC_SHARDS)
    membership = shard_index(room_key(PROJECT, room_of(TOPIC)), TOPIC_SHARDS)
    presence = shard_index(room_key(PROJECT, ROOM), TOPIC_SHARDS)
    assert ROOM != room_of(TOPIC)
    assert subscription != membership
    assert presence != membership


async def _messages(client: Client, count: int, timeout: float) -> list[dict]:
    """Up to ``count`` frames, whatever arrives within ``timeout`` seconds."""
    frames: list[dict] = []
    deadline = time.monotonic() + timeout
    while len(frames) < count:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        try:
            frames.append(await client.recv(timeout=remaining))
        except asyncio.TimeoutError:
            break
    return frames


async def _until_quiet(client: Client) -> list[dict]:
    """Every frame queued before the answer to a getPresence of an empty room."""
    await client.send({"type": "getPresence", "roomId": "__quiet__"})
    frames = []
    while True:
        frame = await client.recv()
        if frame["type"] == "presenceList" and frame.get("roomId") == "__quiet__":
            return frames
        frames.append(frame)


def test_a_dead_gateways_nolag_state_is_purged_from_every_topic_shard(nolag_death):
    router = nolag_death.running.router
    urls = nolag_death.urls
    subscribe_lb = {"qos": 0, "loadBalance": True, "loadBalanceGroup": GROUP}

    async def scenario():
        # The observer, on the surviving gateway: a member of ROOM, so it hears ROOM's presence events.
        observer = await Client.open(urls[0], nolag_death.token())
        await observer.subscribe(ROOM_TOPIC, qos=0)
        await observer.send({"type": "getPresence", "roomId": ROOM})  # after its room membership, on that shard
        assert await observer.recv() == {"type": "presenceList", "roomId": ROOM, "data": []}

        # The survivor worker on gateway 0, the victim worker on gateway 1: one load-balance group.
        survivor = await Client.open(urls[0], nolag_death.token())
        assert await survivor.subscribe(TOPIC, **subscribe_lb) == {"type": "subscribed", "topic": TOPIC,
                                                                   "loadBalance": True}
        victim = await Client.open(urls[1], nolag_death.token())
        victim_actor = victim.auth["actorTokenId"]
        assert await victim.subscribe(TOPIC, **subscribe_lb) == {"type": "subscribed", "topic": TOPIC,
                                                                 "loadBalance": True}
        await victim.send({"type": "presence", "roomId": ROOM, "data": {"status": "online"}})
        assert [(await victim.expect("presence"))["event"] for _ in range(2)] == ["join", "update"]
        seen = [await observer.expect("presence") for _ in range(2)]
        assert [(e["event"], e["roomId"], e["data"]["actorTokenId"]) for e in seen] == [
            ("join", ROOM, victim_actor), ("update", ROOM, victim_actor)]

        publisher = await Client.open(urls[0], nolag_death.token())
        assert await publisher.subscribe(TOPIC, qos=0) == {"type": "subscribed", "topic": TOPIC, "loadBalance": False}

        # Both workers really share the group: two messages, one each.
        for n in range(2):
            await publisher.publish(TOPIC, f"warm {n}", qos=0, echo=False, msgRef=f"w{n}")
            assert await publisher.recv() == {"type": "published", "topic": TOPIC, "msgRef": f"w{n}"}
        shares = {(await victim.expect("message"))["data"], (await survivor.expect("message"))["data"]}
        assert shares == {"warm 0", "warm 1"}
        for client in (victim, survivor, observer, publisher):
            assert await _until_quiet(client) == []

        # Gateway 1 dies; its socket drops; the supervisor replaces it and the shards forget it.
        dead = router.gateways[1]
        restarts = router.restarts
        ray.kill(dead.actor, no_restart=True)
        await asyncio.wait_for(victim.ws.wait_closed(), 20)
        deadline = time.monotonic() + 30
        while router.restarts == restarts and time.monotonic() < deadline:
            await asyncio.to_thread(router.supervise, 0.5)
        assert router.restarts == restarts + 1, "the supervisor did not replace the dead gateway"
        assert router.gateways[1].gateway_id != dead.gateway_id

        # The survivor is the group's only live member: it gets every message, once.
        for n in range(COUNT):
            await publisher.publish(TOPIC, n, qos=0, echo=False, msgRef=n)
        acks = [await publisher.recv() for _ in range(COUNT)]
        assert acks == [{"type": "published", "topic": TOPIC, "msgRef": n} for n in range(COUNT)]
        received = await _messages(survivor, COUNT, timeout=5)
        received += await _until_quiet(survivor)  # anything more (a duplicate) shows here
        data = [frame["data"] for frame in received if frame["type"] == "message"]

        # The observer hears the victim leave ROOM, and ROOM's presence no longer lists it.
        await observer.send({"type": "getPresence", "roomId": ROOM})
        leave, listed, others = None, None, []
        deadline = time.monotonic() + 5
        while (leave is None or listed is None) and time.monotonic() < deadline:
            try:
                frame = await observer.recv(timeout=max(0.01, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                break
            if frame["type"] == "presence" and frame.get("event") == "leave":
                leave = frame
            elif frame["type"] == "presenceList" and frame.get("roomId") == ROOM:
                listed = frame
            else:
                others.append(frame)

        problems = []
        if sorted(data) != list(range(COUNT)) or len(received) != COUNT:
            problems.append(f"the only live member of group {GROUP!r} got {len(data)} of {COUNT} messages "
                            f"(data {data}; all frames {received}): the dead worker's ghost still takes turns")
        if leave is None or (leave["roomId"], leave["data"]["actorTokenId"]) != (ROOM, victim_actor):
            problems.append(f"no presence leave for {victim_actor} in room {ROOM!r} (got {leave!r}; "
                            f"other frames {others})")
        if listed is None or [entry["actorTokenId"] for entry in listed["data"]] != []:
            problems.append(f"getPresence {ROOM!r} still lists the dead gateway's actor: {listed!r}")
        assert not problems, "dead gateway's NoLag state left on the topic shards:\n- " + "\n- ".join(problems)

        for client in (survivor, observer, publisher):
            await client.close()

    run(scenario(), timeout=55)
