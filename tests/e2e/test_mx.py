"""mx-notifier hub end to end: a node pushes blocks to /save, consumers on /hub/ws get what they select.

``mx``: two gateways (the node on one, consumers on the other), two topic shards; small queues so a
slow consumer is cut off quickly.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gateways.mx import codec, generator, node
from gateways.mx.bech32 import encode_address
from gateways.mx.pb import mx_hub_pb2
from tests.e2e.client import eventually, run
from tests.e2e.conftest import RunningRouter, start_router
from tests.e2e.mx_client import Consumer, Node
from tests.e2e.npm import node_project

pytestmark = pytest.mark.e2e


def hub_urls(running: RunningRouter, path: str = "/hub/ws") -> list[str]:
    return [f"ws://127.0.0.1:{gateway['listeners'][0]['port']}{path}" for gateway in running.router.endpoints()]


MAX_QUEUE_DEPTH = 20


@pytest.fixture(scope="module")
def mx(ray_runtime, tmp_path_factory) -> RunningRouter:
    running = start_router(
        namespace="e2e-mx", data_dir=tmp_path_factory.mktemp("mx-data"), port=0, gateways=2, ray_dashboard=False,
        shards={"session": 1, "topic": 2, "registry": 1}, signal={"enabled": False}, cashu={"enabled": False},
        baqend={"enabled": False},
        gateway={"sweep_interval_s": 0.1},
        mx={"max_queue_depth": MAX_QUEUE_DEPTH, "ack_timeout_s": 60},
    )
    yield running
    running.router.stop()


def hub_stats(running: RunningRouter, index: int) -> dict:
    import ray

    return ray.get(running.router.gateways[index].actor.stats.remote())["dialects"]


def matches(level: str, address: str, identifier: str, topics: list[bytes | None], event) -> bool:
    """The spec's match levels, written out plainly (the router uses an index)."""
    if level == "All":
        return True
    if level == "Address":
        return event.address == address
    if level == "Identifier":
        return event.identifier == identifier
    if level == "AddressIdentifier":
        return event.address == address and event.identifier == identifier
    if not (event.address == address and event.identifier == identifier) or len(topics) > len(event.topics):
        return False
    return all(want is None or want == have for want, have in zip(topics, event.topics))


_seed = iter(range(1000, 100_000))


def block(transactions: int = 25, most_events: int | None = None):
    """A generated block with events, a block_txs and a block_scrs frame (some seeds draw no SCR),
    and at most ``most_events`` events. The seeds are shared with every module that imports this
    one, so which block a test gets depends on what ran before it: bound what the test relies on."""
    while True:
        saved = generator.generate_save_block(next(_seed), transactions=transactions)
        normalized = node.normalize_save_block(saved)
        if (normalized.events and normalized.txs.txs and normalized.scrs.scrs
                and (most_events is None or len(normalized.events) <= most_events)):
            return saved


def test_each_match_level_selects_exactly_its_events(mx):
    node_url, consumer_url = hub_urls(mx, "/save")[0], hub_urls(mx)[1]

    async def scenario():
        saved = block(40)
        events = node.normalize_save_block(saved).events
        with_topics = next(e for e in events if len(e.topics) >= 2)
        filters = [
            ("All", "", "", []),
            ("Address", events[3].address, "", []),
            ("Identifier", "", events[5].identifier, []),
            ("AddressIdentifier", with_topics.address, with_topics.identifier, []),
            ("Topics", with_topics.address, with_topics.identifier, [None, bytes(with_topics.topics[1])]),
            ("Topics", with_topics.address, with_topics.identifier, [bytes(with_topics.topics[0])]),
            ("Address", encode_address(b"\x01" * 32), "", []),  # nobody in the block
        ]
        consumers = []
        for level, address, identifier, topics in filters:
            consumer = await Consumer.open(consumer_url)
            await consumer.subscribe(level, address, identifier, topics)
            consumers.append(consumer)
        feeder = await Node.open(node_url)
        await feeder.save(saved)
        await feeder.finalize(saved)
        block_hash = saved.BlockData.HeaderHash.hex()
        for consumer, (level, address, identifier, topics) in zip(consumers, filters):
            got = await consumer.until_finalized(block_hash)
            expected = [e for e in events if matches(level, address, identifier, topics, e)]
            assert [m for t, m in got if t == codec.EVENTS_TOPIC] == expected, level
            others = [t for t, _ in got if t != codec.EVENTS_TOPIC]
            assert others == ([codec.BLOCK_TXS_TOPIC, codec.BLOCK_SCRS_TOPIC] if level == "All" else []), level
            await consumer.close()
        assert len([e for e in events if matches(*filters[4], e)]) >= 1
        await feeder.close()

    run(scenario())


def test_events_carry_the_normalised_fields_and_counters_increase(mx):
    node_url, consumer_url = hub_urls(mx, "/save")[0], hub_urls(mx)[1]

    async def scenario():
        saved = block(5)
        normalized = node.normalize_save_block(saved)
        consumer = await Consumer.open(consumer_url)
        await consumer.subscribe("All", with_acknowledge=False)
        await consumer.barrier()  # no ACK for that subscribe: wait until it is in place
        feeder = await Node.open(node_url)
        await feeder.save(saved)
        await feeder.revert(saved)
        counters = []
        for expected in normalized.events:
            frame = await consumer.frame()
            assert (frame.version, frame.with_acknowledge, frame.type, frame.topic) == (1, False, 2, codec.EVENTS_TOPIC)
            event = mx_hub_pb2.NormalizedEvent()
            event.ParseFromString(frame.payload)
            assert event == expected and event.address.startswith("erd1")
            assert event.block_hash == saved.BlockData.HeaderHash.hex()
            counters.append(frame.counter)
        txs, scrs = await consumer.event(), await consumer.event()
        assert txs == (codec.BLOCK_TXS_TOPIC, normalized.txs) and scrs == (codec.BLOCK_SCRS_TOPIC, normalized.scrs)
        topic, revert = await consumer.event()
        assert topic == codec.REVERT_TOPIC and revert == node.normalize_revert(saved.BlockData)
        assert counters == list(range(1, len(normalized.events) + 1))
        await consumer.close()
        await feeder.close()

    run(scenario())


def test_acknowledged_delivery_is_stop_and_wait(mx):
    node_url, consumer_url = hub_urls(mx, "/save")[0], hub_urls(mx)[1]

    async def scenario():
        saved = block(6, most_events=MAX_QUEUE_DEPTH - 2)  # all but one frame queued, not shed (queue_full)
        count = len(node.normalize_save_block(saved).events)
        assert count >= 6
        consumer = await Consumer.open(consumer_url, ack=True)
        await consumer.subscribe("All")  # the subscribe frame's own ACK: counter 1 from the consumer
        feeder = await Node.open(node_url)
        await feeder.save(saved)  # the node is acknowledged once the shards have the block
        first = await consumer.frame()
        assert (first.counter, first.with_acknowledge, first.topic) == (1, True, codec.EVENTS_TOPIC)
        # Nothing more is written until the ACK: the rest waits in the connection's queue.
        last: dict = {}

        async def all_queued() -> bool:
            last.update(hub_stats(mx, 1)["mx"])
            return last["queued"] == count + 1  # + block_txs, block_scrs

        try:
            await eventually(all_queued)
        except AssertionError:  # say what the gateway held instead
            raise AssertionError(f"expected {count + 1} frames queued; the gateway's last mx stats: {last}") from None
        await consumer.ws.send(codec.ack_frame(7))  # the wrong counter changes nothing
        await eventually(lambda: _value(hub_stats(mx, 1)["mx"]["dropped"].get("unexpected_ack") == 1))
        assert hub_stats(mx, 1)["mx"]["queued"] == count + 1
        await consumer.ws.send(codec.encode_frame(codec.ACK, 1, version=0))  # version 0 ACKs are accepted
        counters = [1]
        for _ in range(count + 1):
            frame = await consumer.frame()
            counters.append(frame.counter)
            assert frame.with_acknowledge
            await consumer.ws.send(codec.ack_frame(frame.counter))
        assert counters == list(range(1, count + 3))
        await eventually(lambda: _value(hub_stats(mx, 1)["mx"]["queued"] == 0))
        await consumer.close()
        await feeder.close()

    run(scenario())


def test_invalid_frames_are_dropped_and_the_connection_stays_usable(mx):
    node_url, consumer_url = hub_urls(mx, "/save")[0], hub_urls(mx)[1]

    async def scenario():
        before = hub_stats(mx, 1)["mx"]["dropped"]
        consumer = await Consumer.open(consumer_url)
        bad = [
            (b"\xff\xff\xff", "undecodable"),
            (codec.encode_frame(codec.PAYLOAD, 1, "subscribe", codec.subscribe_payload("All"), version=0), "bad_version"),
            (codec.encode_frame(3, 1, "subscribe", b"x"), "bad_type"),
            (codec.encode_frame(codec.PAYLOAD, 1, "", b"x"), "missing_topic"),
            (codec.encode_frame(codec.PAYLOAD, 1, "subscribe", b""), "empty_payload"),
            (codec.payload_frame(1, "publish", b"x"), "unknown_topic"),
            (codec.payload_frame(1, "subscribe", codec.subscribe_payload("Address", "erd1nope")), "invalid_address"),
            (codec.payload_frame(1, "subscribe", codec.subscribe_payload("Everything")), "unknown_match_level"),
            ("a text frame", "text_frame"),
        ]
        for data, _ in bad:
            await consumer.ws.send(data)
        await consumer.subscribe("All")
        expected = dict(before)
        for _, reason in bad:
            expected[reason] = expected.get(reason, 0) + 1
        await eventually(lambda: _value(hub_stats(mx, 1)["mx"]["dropped"] == expected))
        feeder = await Node.open(node_url)
        saved = block(3)
        await feeder.save(saved)
        await feeder.finalize(saved)
        got = await consumer.until_finalized(saved.BlockData.HeaderHash.hex())
        assert len([t for t, _ in got if t == codec.EVENTS_TOPIC]) == len(node.normalize_save_block(saved).events)
        await consumer.close()
        await feeder.close()

    run(scenario())


def test_slow_consumer_is_closed_at_max_depth_while_a_fast_one_keeps_receiving(mx):
    node_url, consumer_url = hub_urls(mx, "/save")[0], hub_urls(mx)[1]

    async def scenario():
        slow = await Consumer.open(consumer_url, ack=True)  # never acknowledges: its queue only grows
        fast = await Consumer.open(consumer_url)
        await slow.subscribe("All")
        await fast.subscribe("All", with_acknowledge=False)
        await fast.barrier()  # no ACK for that subscribe: wait until it is in place
        feeder = await Node.open(node_url)
        blocks = [block(8) for _ in range(4)]
        expected = sum(len(node.normalize_save_block(b).events) + 2 for b in blocks)
        assert expected > 20 + 1  # more than the slow consumer's window and queue
        for saved in blocks:
            await feeder.save(saved)  # the node is never held up by the slow consumer
        await asyncio.wait_for(slow.ws.wait_closed(), 10)
        assert slow.ws.close_code == 1013 and slow.ws.close_reason == "consumer too slow: 20 frames queued"
        received = [await fast.event() for _ in range(expected)]
        assert [m for t, m in received if t == codec.EVENTS_TOPIC] == [
            e for b in blocks for e in node.normalize_save_block(b).events]
        stats = hub_stats(mx, 1)["mx"]
        assert stats["closed"].get("queue_full", 0) >= 1
        await fast.close()
        await feeder.close()

    run(scenario())


def test_node_frames_gogo_and_json_duplicates_and_ignored_topics(mx):
    node_url, consumer_url = hub_urls(mx, "/save")[0], hub_urls(mx)[1]

    async def scenario():
        consumer = await Consumer.open(consumer_url)
        await consumer.subscribe("All", with_acknowledge=False)
        await consumer.barrier()  # no ACK for that subscribe: wait until it is in place
        saved = block(4)
        events = node.normalize_save_block(saved).events
        json_node = await Node.open(node_url, marshaller=node.JSON)
        await json_node.save(saved)
        await json_node.save(saved)  # the node's retry after an ACK timeout: acknowledged, not delivered again
        await json_node.push("SaveAccounts", b'{"shardID":1}')  # a topic the hub does not stream: ACKed
        await json_node.ws.send(b"{not json")  # undecodable: dropped without an ACK, the connection kept
        await json_node.push(node.FINALIZED_BLOCK, generator.finalized_payload(saved, node.JSON))
        got = await consumer.until_finalized(saved.BlockData.HeaderHash.hex())
        assert [m for t, m in got if t == codec.EVENTS_TOPIC] == events
        counts = hub_stats(mx, 0)["mx-node"]
        assert counts["duplicates"] >= 1 and counts["ignored"] >= 1 and counts["dropped_undecodable"] >= 1
        await consumer.close()
        await json_node.close()

    run(scenario())


def test_without_a_node_token_a_loopback_node_is_accepted(mx):
    """``mx.node_token`` unset (the default): /save takes loopback peers, with no credential
    (tests/unit/test_mx_ingest.py: any other peer gets 403)."""
    node_url = hub_urls(mx, "/save")[0]

    async def scenario():
        feeder = await Node.open(node_url)
        await feeder.push("SaveAccounts", b"\x08\x01")  # a topic the hub does not stream: acknowledged
        stats = hub_stats(mx, 0)["mx-node"]
        assert "refused_not_loopback" not in stats and "refused_token" not in stats
        await feeder.close()

    run(scenario())


async def _value(value):
    return value


def mx_filters(running: RunningRouter) -> int:
    """Filters held by the topic shards (the consumer side of a subscription is in place)."""
    import ray

    infos = ray.get([shard.info.remote() for shard in running.router.shards["topic"]])
    return sum(info.get("mx", {}).get("subscriptions", 0) for info in infos)


def test_seed_javascript_example_works_as_written(mx):
    project = node_project("mx-hub", ["protobufjs@7", "ws@8"], ["mx_hub_example.mjs", "ws_message.proto"])
    node_url, consumer_url = hub_urls(mx, "/save")[0], hub_urls(mx)[1]
    before = mx_filters(mx)
    process = subprocess.Popen(["node", "mx_hub_example.mjs", consumer_url + "?ack=1"], cwd=project,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        async def feed():
            await eventually(lambda: _value(mx_filters(mx) > before), timeout=30)
            feeder = await Node.open(node_url)
            saved = block(3)
            await feeder.save(saved)
            await feeder.close()
            return node.normalize_save_block(saved)

        normalized = run(feed())
        expected = len(normalized.events) + 2
        lines: list[str] = []
        deadline = time.monotonic() + 30
        while sum(1 for line in lines if line.startswith("topic:")) < expected and time.monotonic() < deadline:
            lines.append(process.stdout.readline().strip())
        topics = [line.split(": ", 1)[1] for line in lines if line.startswith("topic:")]
        assert topics == [codec.EVENTS_TOPIC] * len(normalized.events) + [codec.BLOCK_TXS_TOPIC, codec.BLOCK_SCRS_TOPIC]
        lengths = [int(line.split(": ", 1)[1]) for line in lines if line.startswith("payload length:")]
        assert lengths[: len(normalized.events)] == [e.ByteSize() for e in normalized.events]
    finally:
        process.kill()
        process.wait(10)


def test_router_mx_generate_and_replay(mx, tmp_path):
    router_bin = str(Path(sys.executable).with_name("router"))
    node_url, consumer_url = hub_urls(mx, "/save")[0], hub_urls(mx)[1]
    frames = tmp_path / "blocks.jsonl"
    done = subprocess.run([router_bin, "mx", "generate", str(frames), "--blocks", "3", "--transactions", "5",
                           "--seed", "42", "--marshaller", "json"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    blocks = [generator.generate_save_block(42 + i, transactions=5) for i in range(3)]
    events = [e for b in blocks for e in node.normalize_save_block(b).events]
    assert done.stdout.strip() == f"wrote {frames}: 3 blocks, {len(events)} log events, 3 finalized (json)"

    async def scenario():
        consumer = await Consumer.open(consumer_url)
        await consumer.subscribe("All")
        replayed = await asyncio.to_thread(subprocess.run, [router_bin, "mx", "replay", str(frames), "--url", node_url],
                                           capture_output=True, text=True, timeout=60)
        assert replayed.returncode == 0, replayed.stderr
        result = json.loads(replayed.stdout)
        assert (result["frames"], result["acknowledged"], result["marshaller"]) == (6, 6, "json")
        got = []
        for saved in blocks:
            got += [m for t, m in await consumer.until_finalized(saved.BlockData.HeaderHash.hex())
                    if t == codec.EVENTS_TOPIC]
        assert got == events
        await consumer.close()

    run(scenario())
