"""A NoLag topic shard that Ray restarted, re-announced to (no Ray: shards built directly over one
data directory, as Ray would start the new incarnation).

- A subscription re-announced with the last message its connection got is caught up with what
  this incarnation logged after it (published before the re-announce arrived): filters apply, the
  connection's own ``echo: false`` messages are left out, a load-balance group catches up once.
- Presence comes back quietly (no join, no lobby event); the next change is an ``update``.
- Stamps go on increasing per topic across the restart.
- Actors present in a room hear its presence events like its subscribers (the SDK's rooms).
"""

from __future__ import annotations

import pytest

from actors.nolag import contract as nolag
from actors.nolag.contract import LobbyChange, LobbySpec, PresenceChange, room_key, topic_key
from actors.nolag import shard as shard_module
from actors.nolag.shard import NolagTopics
from actors.shard import Shard
from router import contract
from router.settings import load_settings
from router.shardmap import TOPIC

TOPIC_NAME = "app/room/t"
KEY = topic_key("p", TOPIC_NAME)
ROOM = room_key("p", "room")


class Clock:
    def __init__(self) -> None:
        self.ms = 1_800_000_000_000

    def __call__(self) -> int:
        return self.ms


@pytest.fixture
def clock(monkeypatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(contract, "now_ms", clock)
    return clock


def build(tmp_path) -> Shard:
    settings = load_settings(data_dir=tmp_path, metrics={"enabled": False}, shards={"topic": 1})
    return Shard(TOPIC, 0, settings, (NolagTopics,))


def publish(data: bytes, msg_id: str | None, filter_: str | None = None, exclude: int | None = None,
            qos: int = 1) -> tuple:
    return nolag.publish(KEY, TOPIC_NAME, data, qos, filter_, exclude, msg_id, "actor_p")


def deliveries(bundle: tuple | None) -> list[tuple]:
    """(gateway's connection ids, payload) of each delivery in a bundle."""
    return [] if bundle is None else [(connections, payload) for _, payload, connections, _ in bundle[3]]


def messages(bundle: tuple | None) -> list[tuple]:
    return [(connections, payload[1], payload[2]) for connections, payload in deliveries(bundle)
            if type(payload) is tuple]


def test_a_reannounced_subscription_gets_what_this_incarnation_logged_after_its_position(tmp_path, clock):
    old = build(tmp_path)
    old.handle("g", [nolag.subscribe(KEY, 1, "actor_s", (), 1, None)])
    _, bundle = old.handle("g", [publish(b"old", "m0")])
    position = deliveries(bundle)[0][1][5]  # its stamp: the last message connection 1 got
    old.handle("g", [publish(b"lost", "m1")])  # logged by the old incarnation after it: not caught up
    clock.ms += 2000
    new = build(tmp_path)  # restarted, empty
    _, bundle = new.handle("g", [publish(b"a", "m2"), publish(b"q0", None, qos=0), publish(b"b", "m3", "vip"),
                                 publish(b"own", "m4", exclude=1), publish(b"other-gw", "m5")])
    assert bundle is None  # nobody subscribed yet
    results, bundle = new.handle("g", [nolag.subscribe(KEY, 1, "actor_s", (), 1, None, position)])
    assert messages(bundle) == [([1], b"a", "m2"), ([1], b"b", "m3"), ([1], b"other-gw", "m5")]
    assert results[0] >= clock.ms  # the topic's position: after everything stamped
    _, bundle = new.handle("g2", [nolag.subscribe(KEY, 7, "actor_f", ("vip",), 1, None, position)])
    assert messages(bundle) == [([7], b"b", "m3")]  # filters apply
    _, bundle = new.handle("g", [nolag.subscribe(KEY, 2, "actor_t", (), 1, None)])
    assert bundle is None  # a fresh subscribe (not a re-announce) gets nothing from the log


def restarted_with_two_subscribers(tmp_path, clock, nolag_settings: dict) -> tuple:
    """Settings, a topic shard restarted 2 s after connections 1 and 2 subscribed to the topic on
    its previous incarnation, and the position both got there (one message)."""
    settings = load_settings(data_dir=tmp_path, metrics={"enabled": False}, shards={"topic": 1},
                             nolag=nolag_settings)
    old = Shard(TOPIC, 0, settings, (NolagTopics,))
    old.handle("g", [nolag.subscribe(KEY, 1, "actor_s", (), 1, None), nolag.subscribe(KEY, 2, "actor_o", (), 1, None)])
    _, bundle = old.handle("g", [publish(b"old", "m0")])
    position = deliveries(bundle)[0][1][5]
    clock.ms += 2000
    return settings, Shard(TOPIC, 0, settings, (NolagTopics,)), position


def test_a_senders_own_messages_are_remembered_within_bounds_and_still_left_out(tmp_path, clock, monkeypatch):
    """The ids a catch-up leaves out for their sender (``echo: false``) are kept for a topic's first
    ``max_replay`` messages (all one catch-up from the start can deliver) and ``EXCLUDED_MAX`` in
    all, not for every message of the catch-up window: the catch-up is the same."""
    monkeypatch.setattr(shard_module, "EXCLUDED_MAX", 5, raising=False)  # (raising: the code before had none)
    _, new, position = restarted_with_two_subscribers(tmp_path, clock, {"max_replay": 3})
    topics = new.component(NolagTopics)
    other = topic_key("p", "app/room/u")
    new.handle("g", [publish(f"own{n}".encode(), f"m{n}", exclude=1) for n in range(1, 7)])
    assert list(topics._excluded) == ["m1", "m2", "m3"]  # the topic's first max_replay
    new.handle("g", [nolag.publish(other, "app/room/u", b"u", 1, None, 1, f"u{n}", "actor_p") for n in range(4)])
    assert list(topics._excluded) == ["m1", "m2", "m3", "u0", "u1"]  # EXCLUDED_MAX in all
    _, bundle = new.handle("g", [nolag.subscribe(KEY, 1, "actor_s", (), 1, None, position)])
    assert messages(bundle) == []  # the first three after the start are its own
    _, bundle = new.handle("g", [nolag.subscribe(KEY, 2, "actor_o", (), 1, None, position)])
    assert messages(bundle) == [([2], b"own1", "m1"), ([2], b"own2", "m2"), ([2], b"own3", "m3")]
    clock.ms += shard_module.CATCH_UP_WINDOW_MS + 1
    new.handle("g", [publish(b"late", "m9", exclude=1)])
    assert topics._excluded is None and topics._excluded_in == {}  # the window is over


def test_a_topic_kept_less_than_the_window_keeps_every_exclusion_a_prune_could_make_needed(tmp_path, clock):
    """A topic whose messages are kept 5 s: its first messages after the start may be pruned before
    a re-announce, and the catch-up then reads later ones; their exclusions are kept too (a
    topic's first ``max_replay`` would not be enough), so the sender gets none of its own."""
    settings, new, position = restarted_with_two_subscribers(tmp_path, clock,
                                                             {"max_replay": 3, "log_retention": {"app/#": 5}})
    new.handle("g", [publish(f"own{n}".encode(), f"m{n}", exclude=1) for n in range(1, 4)])
    clock.ms += 10_000
    new.handle("g", [publish(f"own{n}".encode(), f"m{n}", exclude=1) for n in range(4, 7)])
    assert list(new.component(NolagTopics)._excluded) == [f"m{n}" for n in range(1, 7)]
    Shard(TOPIC, 0, settings, (NolagTopics,)).handle("g", [])  # another topic shard on the log prunes m1-m3
    _, bundle = new.handle("g", [nolag.subscribe(KEY, 1, "actor_s", (), 1, None, position)])
    assert messages(bundle) == []
    _, bundle = new.handle("g", [nolag.subscribe(KEY, 2, "actor_o", (), 1, None, position)])
    assert messages(bundle) == [([2], b"own4", "m4"), ([2], b"own5", "m5"), ([2], b"own6", "m6")]


def test_the_same_batch_and_a_later_position_are_respected(tmp_path, clock):
    shard = build(tmp_path)
    _, bundle = shard.handle("g", [publish(b"x", "m1"), publish(b"y", "m2"), nolag.subscribe(KEY, 1, "a", (), 1, None,
                                                                                              clock.ms)])
    assert messages(bundle) == [([1], b"y", "m2")]  # m1 (stamped at clock.ms) is at the position, m2 after


def test_a_load_balance_group_catches_up_once(tmp_path, clock):
    shard = build(tmp_path)
    shard.handle("g", [publish(b"x", "m1")])
    _, bundle = shard.handle("g", [nolag.subscribe(KEY, 1, "a", (), 1, "pool", 0),
                                   nolag.subscribe(KEY, 2, "b", (), 1, "pool", 0)])
    assert messages(bundle) == [([1], b"x", "m1")]


def test_stamps_go_on_increasing_across_a_restart(tmp_path, clock):
    old = build(tmp_path)
    _, bundle = old.handle("g", [nolag.subscribe(KEY, 1, "a", (), 1, None)] + [publish(b"x", f"m{n}")
                                                                             for n in range(50)])
    last = deliveries(bundle)[-1][1][5]
    assert last == clock.ms + 49  # a burst runs ahead of the clock
    new = build(tmp_path)
    _, bundle = new.handle("g", [nolag.subscribe(KEY, 1, "a", (), 1, None), publish(b"y", "n1")])
    assert deliveries(bundle)[-1][1][5] == last + 1


def test_presence_comes_back_quietly_and_the_next_change_is_an_update(tmp_path, clock):
    old = build(tmp_path)
    old.handle("g", [nolag.room(ROOM, 9, True), nolag.presence(ROOM, 1, "actor_a", {"s": 1}, 1000)])
    new = build(tmp_path)
    spec = LobbySpec("p", None, "ro")
    results, bundle = new.handle("g", [nolag.room(ROOM, 9, True), nolag.lobby_subscribe("L", spec, 8, True),
                                       nolag.presence_restore(ROOM, 1, "actor_a", {"s": 1}, 1000)])
    assert results[2] is True and bundle is None  # no event for anyone
    assert new.handle("g", [nolag.presence_list(ROOM)])[0] == [[{"actorTokenId": "actor_a", "presence": {"s": 1},
                                                                  "joinedAt": 1000}]]
    results, bundle = new.handle("g", [nolag.presence(ROOM, 1, "actor_a", {"s": 2}, 5000)])
    assert results == [1000]  # the joinedAt it had
    assert [(sorted(c), p) for c, p in deliveries(bundle)] == [
        ([1, 9], PresenceChange("room", "update", "actor_a", {"s": 2}, 1000)),
        ([8], LobbyChange("L", "room", "update", "actor_a", {"s": 2}))]


def test_a_restore_keeps_join_order_and_an_entry_already_back(tmp_path, clock):
    shard = build(tmp_path)
    assert shard.handle("g", [nolag.presence_restore(ROOM, 2, "actor_b", "b", 2000),
                              nolag.presence_restore(ROOM, 1, "actor_a", "a", 1000),
                              nolag.presence_restore(ROOM, 3, "actor_a", "a2", 1500)])[0] == [True, True, False]
    listed = shard.handle("g", [nolag.presence_list(ROOM)])[0][0]
    assert [(e["actorTokenId"], e["presence"]) for e in listed] == [("actor_a", "a"), ("actor_b", "b")]
    results, _ = shard.handle("g", [nolag.presence(ROOM, 4, "actor_c", None, 1)])
    assert results == [None]  # not present: nothing to clear


def test_actors_present_in_a_room_hear_its_events_without_subscribing(tmp_path, clock):
    shard = build(tmp_path)
    shard.handle("g", [nolag.presence(ROOM, 1, "actor_a", "a", 1000)])
    _, bundle = shard.handle("g", [nolag.presence(ROOM, 2, "actor_b", "b", 2000)])
    assert [(sorted(c), p.event, p.actor) for c, p in deliveries(bundle)] == [([1, 2], "join", "actor_b"),
                                                                           ([1, 2], "update", "actor_b")]
