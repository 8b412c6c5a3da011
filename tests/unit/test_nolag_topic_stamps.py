"""A topic shard's NoLag stamps without Ray: strictly increasing per topic, and kept only while they matter.

The shard stamps each message ``max(now, last stamp of the topic + 1)``. The last stamp matters only
while the clock could still be at or below it (a burst runs stamps ahead of the clock; a wall clock
may step back a little), so the shard forgets stale ones instead of keeping one per topic ever used.
"""

from __future__ import annotations

import pytest

from actors.nolag import contract as nolag
from actors.nolag.shard import STAMPS_KEPT_MS, STAMPS_PRUNED_EVERY_MS, NolagTopics
from actors.shard import Shard
from router import contract
from router.settings import load_settings
from router.shardmap import TOPIC

START = 1_800_000_000_000


class Clock:
    def __init__(self) -> None:
        self.ms = START

    def __call__(self) -> int:
        return self.ms


@pytest.fixture
def clock(monkeypatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(contract, "now_ms", clock)  # what the shard reads at the start of each batch
    return clock


@pytest.fixture
def shard(tmp_path, clock) -> Shard:
    return Shard(TOPIC, 0, load_settings(data_dir=tmp_path, metrics={"enabled": False}), (NolagTopics,))


def publish(topic: str) -> tuple:
    return nolag.publish(nolag.topic_key("p", topic), topic, b"\xc0", 0, None, None, None, "actor_a")


def stamps(shard: Shard) -> int:
    return shard.handle("g", [contract.stats()])[0][0]["nolag_topic_stamps"]


def delivered(shard: Shard, commands: list[tuple]) -> list[int]:
    """The stamps of the messages the batch delivered, in order."""
    _, bundle = shard.handle("g", commands)
    stamped = []
    for _, payload, _, _ in bundle[3]:
        topic, packed, msg_id, qos, filter_, ts_ms, sender, meta = payload  # Message layout
        stamped.append(ts_ms)
    return stamped


def test_100k_distinct_topics_do_not_leave_100k_stamps(shard, clock):
    for batch in range(1000):  # 100 new topics every 100 ms: 100 s
        shard.handle("g", [publish(f"app/r{batch}-{i}/t") for i in range(100)])
        clock.ms += 100
    # What the last keep window (plus one pruning period) stamped, not all 100,000.
    assert stamps(shard) <= (STAMPS_KEPT_MS + STAMPS_PRUNED_EVERY_MS) // 100 * 100
    clock.ms += STAMPS_KEPT_MS + STAMPS_PRUNED_EVERY_MS
    assert stamps(shard) == 0


def test_stamps_stay_strictly_increasing_per_topic(shard, clock):
    key = nolag.topic_key("p", "app/burst/t")
    shard.handle("g", [nolag.subscribe(key, 1, "actor_b", (), 0, None),
                       nolag.subscribe(nolag.topic_key("p", "app/idle/t"), 1, "actor_b", (), 0, None)])
    # A burst runs the topic's stamps ahead of the clock, further than the keep window ...
    burst = 3 * STAMPS_KEPT_MS
    first = delivered(shard, [publish("app/burst/t") for _ in range(burst)] + [publish("app/idle/t")])
    assert first[:burst] == list(range(START, START + burst)) and first[burst] == START
    # ... and later, past the window and the pruning period, it is still ahead: kept, so no stamp repeats.
    clock.ms += STAMPS_KEPT_MS + STAMPS_PRUNED_EVERY_MS
    assert delivered(shard, [publish("app/burst/t"), publish("app/idle/t")]) == [START + burst, clock.ms]
    # A wall clock that steps back by less than the window does not repeat stamps either.
    clock.ms -= STAMPS_KEPT_MS // 2
    assert delivered(shard, [publish("app/idle/t")]) == [clock.ms + STAMPS_KEPT_MS // 2 + 1]
    # The idle topic's stamp, once stale, is forgotten; the next stamp is the clock, above every earlier one.
    clock.ms += 3 * STAMPS_KEPT_MS
    assert stamps(shard) == 1  # the burst topic's stamp is still ahead of the clock
    assert delivered(shard, [publish("app/idle/t")]) == [clock.ms]


def test_a_forgotten_topics_position_is_just_before_any_new_stamp(shard, clock):
    """A subscription's position (replay after it) must come before the next message's stamp."""
    key = nolag.topic_key("p", "app/pos/t")
    shard.handle("g", [publish("app/pos/t")])
    clock.ms += STAMPS_KEPT_MS + STAMPS_PRUNED_EVERY_MS
    assert stamps(shard) == 0
    (position,), _ = shard.handle("g", [nolag.subscribe(key, 1, "actor_b", (), 0, None)])
    assert position == clock.ms - 1
    assert delivered(shard, [publish("app/pos/t")]) == [clock.ms]
