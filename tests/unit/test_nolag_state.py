"""actors/nolag/state.py: routing with filters and load balancing, presence, lobbies."""

from __future__ import annotations

from collections import Counter

import pytest

from actors.nolag.state import Lobby, Presence, PresenceEvent, Subscriptions

T = "chat/general/messages"


# -- routing ------------------------------------------------------------------------------------

def test_wildcard_and_filtered_subscribers():
    subs = Subscriptions()
    subs.subscribe(T, "all")
    subs.subscribe(T, "u1", ["user_1"])
    subs.subscribe(T, "u12", ["user_1", "user_2"])
    assert subs.route(T) == ["all"]  # unfiltered publish: wildcard subscribers only
    assert subs.route(T, "user_1") == ["all", "u1", "u12"]
    assert subs.route(T, "user_2") == ["all", "u12"]
    assert subs.route(T, "user_3") == ["all"]
    assert subs.route("chat/general/other") == []


def test_set_filters_replaces_and_empty_means_wildcard():
    subs = Subscriptions()
    subs.subscribe(T, "c", ["a"])
    assert subs.set_filters(T, "c", ["b"]) is True
    assert subs.route(T, "a") == [] and subs.route(T, "b") == ["c"]
    assert subs.set_filters(T, "c", []) is True
    assert subs.route(T) == ["c"] and subs.route(T, "anything") == ["c"]
    assert subs.set_filters(T, "other", ["x"]) is False
    assert subs.set_filters("x/y/z", "c", ["x"]) is False


def test_echo_exclusion_is_the_sender_connection_only():
    subs = Subscriptions()
    for location in ("sender", "a", "b"):
        subs.subscribe(T, location)
    assert subs.route(T, exclude="sender") == ["a", "b"]
    assert subs.route(T, exclude=None) == ["sender", "a", "b"]


def test_subscribe_again_replaces_and_unsubscribe_and_purge():
    subs = Subscriptions()
    assert subs.subscribe(T, ("gw", 1), ["a"], qos=2) is True
    assert subs.subscribe(T, ("gw", 1), [], qos=0) is False
    assert subs.get(T, ("gw", 1)).qos == 0 and subs.route(T) == [("gw", 1)]
    subs.subscribe("a/b/c", ("gw", 1))
    subs.subscribe("a/b/c", ("gw", 2))
    assert subs.topics_of(("gw", 1)) == ["a/b/c", T]
    assert subs.unsubscribe(T, ("gw", 1)) is True
    assert subs.unsubscribe(T, ("gw", 1)) is False
    assert subs.count(T) == 0
    assert subs.purge_connection(("gw", 1)) == ["a/b/c"]
    assert subs.purge_connection(("gw", 1)) == []
    assert subs.route("a/b/c") == [("gw", 2)] and subs.topics_of(("gw", 1)) == []


def test_route_subscribers_carry_qos():
    subs = Subscriptions()
    subs.subscribe(T, "a", qos=0)
    subs.subscribe(T, "b", qos=2)
    assert [(s.location, s.qos) for s in subs.route_subscribers(T)] == [("a", 0), ("b", 2)]


@pytest.mark.parametrize("members, messages", [(2, 10), (3, 100), (4, 7), (5, 1000)])
def test_load_balance_gives_each_member_n_over_k_plus_minus_one(members, messages):
    subs = Subscriptions()
    for index in range(members):
        subs.subscribe(T, f"m{index}", group="workers")
    subs.subscribe(T, "watcher")  # no group: every message
    counts: Counter = Counter()
    for _ in range(messages):
        route = subs.route(T)
        assert len(route) == 2 and route.count("watcher") == 1
        counts.update(location for location in route if location != "watcher")
    assert sum(counts.values()) == messages
    assert all(abs(counts[f"m{index}"] - messages / members) <= 1 for index in range(members))


def test_load_balance_is_round_robin_in_subscription_order():
    subs = Subscriptions()
    for location in ("a", "b", "c"):
        subs.subscribe(T, location, group="g")
    assert [subs.route(T)[0] for _ in range(7)] == ["a", "b", "c", "a", "b", "c", "a"]


def test_load_balance_groups_are_independent_and_per_topic():
    subs = Subscriptions()
    subs.subscribe(T, "a1", group="A")
    subs.subscribe(T, "a2", group="A")
    subs.subscribe(T, "b1", group="B")
    subs.subscribe("x/y/z", "a1", group="A")
    assert subs.route(T) == ["a1", "b1"]
    assert subs.route("x/y/z") == ["a1"]
    assert subs.route(T) == ["a2", "b1"]
    assert subs.route(T) == ["a1", "b1"]


def test_load_balance_with_filters_and_echo_exclusion():
    subs = Subscriptions()
    subs.subscribe(T, "a", ["f"], group="g")
    subs.subscribe(T, "b", group="g")
    subs.subscribe(T, "c", ["other"], group="g")
    assert sorted(subs.route(T, "f") + subs.route(T, "f")) == ["a", "b"]  # c never matches "f"
    assert subs.route(T) == ["b"]  # only the wildcard member matches an unfiltered publish
    # the excluded sender does not consume the group's turn
    subs2 = Subscriptions()
    for location in ("s", "x", "y"):
        subs2.subscribe(T, location, group="g")
    assert [subs2.route(T, exclude="s")[0] for _ in range(4)] == ["x", "y", "x", "y"]


def test_load_balance_member_joining_and_leaving():
    subs = Subscriptions()
    subs.subscribe(T, "a", group="g")
    subs.subscribe(T, "b", group="g")
    assert [subs.route(T)[0] for _ in range(4)] == ["a", "b", "a", "b"]
    subs.subscribe(T, "c", group="g")  # never served: goes first, then the rotation continues
    assert [subs.route(T)[0] for _ in range(6)] == ["c", "a", "b", "c", "a", "b"]
    subs.unsubscribe(T, "a")
    assert [subs.route(T)[0] for _ in range(4)] == ["c", "b", "c", "b"]  # c was served before b


# -- presence -----------------------------------------------------------------------------------

def test_presence_join_update_leave_ordering():
    presence = Presence()
    assert presence.set("general", "actor_1", "c1", {"status": "online"}, 1000) == [
        PresenceEvent("join", "general", "actor_1", {"status": "online"}, 1000),
        PresenceEvent("update", "general", "actor_1", {"status": "online"}, 1000),
    ]
    assert presence.set("general", "actor_1", "c1", {"status": "away"}, 2000) == [
        PresenceEvent("update", "general", "actor_1", {"status": "away"}, 1000),
    ]
    assert presence.set("other", "actor_1", "c1", {"s": 1}, 3000)[0].event == "join"  # per room
    assert presence.leave("general", actor_id="actor_1") == [
        PresenceEvent("leave", "general", "actor_1", {"status": "away"}, 1000)]
    assert presence.leave("general", actor_id="actor_1") == []
    assert presence.set("general", "actor_1", "c1", {"back": True}, 4000)[0] == PresenceEvent(
        "join", "general", "actor_1", {"back": True}, 4000)


def test_presence_list_in_join_order():
    presence = Presence()
    presence.set("r", "b", "c2", {"n": 2}, 20)
    presence.set("r", "a", "c1", {"n": 1}, 30)
    presence.set("r", "b", "c2", {"n": 3}, 40)
    assert presence.list("r") == [{"actorTokenId": "b", "presence": {"n": 3}, "joinedAt": 20},
                                  {"actorTokenId": "a", "presence": {"n": 1}, "joinedAt": 30}]
    assert presence.list("empty") == []
    assert presence.get("r", "a") == {"n": 1} and presence.get("r", "zz") is None


def test_presence_none_data_is_a_leave():
    presence = Presence()
    presence.set("r", "a", "c1", {"x": 1}, 5)
    assert presence.set("r", "a", "c1", None, 6) == [PresenceEvent("leave", "r", "a", {"x": 1}, 5)]
    assert presence.set("r", "a", "c1", None, 7) == []
    assert presence.rooms() == []


def test_leave_by_location_and_purge_connection():
    presence = Presence()
    presence.set("r1", "a", "c1", {"a": 1}, 1)
    presence.set("r2", "a", "c1", {"a": 2}, 2)
    presence.set("r1", "b", "c2", {"b": 1}, 3)
    assert presence.leave("r1", location="c2") == [PresenceEvent("leave", "r1", "b", {"b": 1}, 3)]
    presence.set("r1", "b", "c2", {"b": 1}, 4)
    assert presence.purge_connection("c1") == [
        ("r1", PresenceEvent("leave", "r1", "a", {"a": 1}, 1)),
        ("r2", PresenceEvent("leave", "r2", "a", {"a": 2}, 2)),
    ]
    assert presence.purge_connection("c1") == []
    assert presence.rooms() == ["r1"] and presence.list("r1")[0]["actorTokenId"] == "b"


def test_an_actor_on_two_connections_leaves_with_the_last_one_that_set_presence():
    presence = Presence()
    presence.set("r", "a", "old", {"v": 1}, 1)
    assert presence.set("r", "a", "new", {"v": 2}, 2) == [PresenceEvent("update", "r", "a", {"v": 2}, 1)]
    assert presence.purge_connection("old") == []
    assert presence.purge_connection("new") == [("r", PresenceEvent("leave", "r", "a", {"v": 2}, 1))]


def test_lobbies_by_rooms_and_by_prefix():
    trips = Lobby("active-trips", prefix="trip-")
    lounge = Lobby("lounge", rooms=frozenset({"general", "random"}))
    assert trips.contains("trip-1") and not trips.contains("general")
    assert lounge.contains("general") and not lounge.contains("trip-1")
    with pytest.raises(ValueError):
        Lobby("bad")
    with pytest.raises(ValueError):
        Lobby("bad", rooms=frozenset({"a"}), prefix="a")
    assert Lobby("everything", prefix="").contains("general")
