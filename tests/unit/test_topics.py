"""actors/topics.py: subscriptions per topic and fan-out routes grouped by gateway."""

from __future__ import annotations

import pytest

from actors.topics import TopicTable

A = ("g1", 1)
B = ("g1", 2)
C = ("g2", 7)
D = ("g2", 3)


@pytest.fixture
def table() -> TopicTable:
    return TopicTable()


def test_subscribe_is_idempotent(table):
    assert table.subscribe("news", A) is True
    assert table.subscribe("news", A) is False
    assert table.routes("news") == (1, {"g1": (1,)})
    assert table.stats() == {"topics": 1, "subscriptions": 1, "connections": 1}


def test_resubscribe_updates_info_without_changing_routes(table):
    table.subscribe("news", A, info={"v": 1})
    cached = table.routes("news")[1]
    assert table.subscribe("news", A, info={"v": 2}) is False
    assert table._topics["news"][A] == {"v": 2}
    assert table.routes("news")[1] is cached


def test_unknown_topic_has_no_routes(table):
    assert table.routes("nothing") == (0, {})
    assert table.routes("nothing", exclude=A) == (0, {})


def test_routes_group_by_gateway_in_subscription_order(table):
    for location in (C, A, D, B):
        table.subscribe("news", location)
    assert table.routes("news") == (4, {"g2": (7, 3), "g1": (1, 2)})


def test_routes_are_cached_until_subscribers_change(table):
    table.subscribe("news", A)
    first = table.routes("news")[1]
    assert table.routes("news")[1] is first  # no rebuild without a change
    table.subscribe("news", C)
    assert table.routes("news") == (2, {"g1": (1,), "g2": (7,)})
    table.unsubscribe("news", A)
    assert table.routes("news") == (1, {"g2": (7,)})
    table.subscribe("news", B)
    assert table.routes("news") == (2, {"g2": (7,), "g1": (2,)})


def test_routes_of_other_topics_are_not_affected(table):
    table.subscribe("a", A)
    table.subscribe("b", B)
    cached_a = table.routes("a")[1]
    table.subscribe("b", C)
    assert table.routes("a")[1] is cached_a
    assert table.routes("b") == (2, {"g1": (2,), "g2": (7,)})


def test_exclude_removes_the_sender(table):
    for location in (A, B, C):
        table.subscribe("news", location)
    assert table.routes("news", exclude=A) == (2, {"g1": (2,), "g2": (7,)})
    # The cached grouping is untouched by an exclusion.
    assert table.routes("news") == (3, {"g1": (1, 2), "g2": (7,)})


def test_exclude_drops_an_emptied_gateway(table):
    table.subscribe("news", A)
    table.subscribe("news", C)
    count, routes = table.routes("news", exclude=C)
    assert count == 1
    assert routes == {"g1": (1,)}
    assert "g2" not in routes


def test_exclude_of_the_only_subscriber(table):
    table.subscribe("news", A)
    assert table.routes("news", exclude=A) == (0, {})


def test_exclude_of_a_non_subscriber_changes_nothing(table):
    table.subscribe("news", A)
    table.subscribe("news", C)
    assert table.routes("news", exclude=B) == (2, {"g1": (1,), "g2": (7,)})
    assert table.routes("news", exclude=("g9", 1)) == (2, {"g1": (1,), "g2": (7,)})


def test_unsubscribe(table):
    table.subscribe("news", A)
    table.subscribe("news", B)
    table.subscribe("sport", A)
    assert table.unsubscribe("news", A) is True
    assert table.unsubscribe("news", A) is False
    assert table.unsubscribe("nothing", A) is False
    assert table.routes("news") == (1, {"g1": (2,)})
    assert table.routes("sport") == (1, {"g1": (1,)})
    assert table.stats() == {"topics": 2, "subscriptions": 2, "connections": 2}
    assert table.unsubscribe("sport", A) is True
    assert table.purge_connection(A) == []
    assert table.stats() == {"topics": 1, "subscriptions": 1, "connections": 1}
    assert table.unsubscribe("news", B) is True
    assert table.routes("news") == (0, {})
    assert table.stats() == {"topics": 0, "subscriptions": 0, "connections": 0}


def test_purge_connection(table):
    for topic in ("b", "e", "a", "d", "f", "c"):
        table.subscribe(topic, A)
    table.subscribe("a", C)
    table.routes("a")  # warm the cache
    assert table.purge_connection(A) == ["a", "b", "c", "d", "e", "f"]
    assert table.routes("a") == (1, {"g2": (7,)})
    assert table.routes("b") == (0, {})
    assert table.purge_connection(A) == []
    assert table.stats() == {"topics": 1, "subscriptions": 1, "connections": 1}  # only "a" at C


def test_purge_gateway(table):
    table.subscribe("x", A)
    table.subscribe("y", B)
    table.subscribe("x", C)
    table.subscribe("z", D)
    table.routes("x")
    assert table.purge_gateway("g1") == 2
    assert table.routes("x") == (1, {"g2": (7,)})
    assert table.routes("y") == (0, {})
    assert table.stats() == {"topics": 2, "subscriptions": 2, "connections": 2}
    assert table.purge_gateway("g1") == 0
    assert table.purge_gateway("g2") == 2
    assert table.stats() == {"topics": 0, "subscriptions": 0, "connections": 0}


def test_stats(table):
    assert table.stats() == {"topics": 0, "subscriptions": 0, "connections": 0}
    table.subscribe("x", A)
    table.subscribe("y", A)
    table.subscribe("x", B)
    table.subscribe("x", B)
    assert table.stats() == {"topics": 2, "subscriptions": 3, "connections": 2}
