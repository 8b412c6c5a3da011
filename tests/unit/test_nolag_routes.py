"""A NoLag topic shard's routes for a publish (no Ray): an unfiltered publish to a topic without
load-balance groups reuses routes kept until the topic's subscriptions change, and gives exactly
what walking the subscribers gives — echo exclusion, filters, groups and every change included."""

from __future__ import annotations

import pytest

from actors.nolag import contract as nolag
from actors.nolag.shard import NolagTopics
from actors.shard import Shard
from router.contract import group_by_gateway
from router.settings import load_settings
from router.shardmap import TOPIC

KEY = nolag.topic_key("p", "chat/room/messages")


@pytest.fixture
def shard(tmp_path) -> Shard:
    return Shard(TOPIC, 0, load_settings(data_dir=tmp_path, metrics={"enabled": False}), (NolagTopics,))


def topics(shard: Shard) -> NolagTopics:
    return shard.components[0]


def run(shard: Shard, gateway: str, *commands: tuple) -> list:
    results, _ = shard.handle(gateway, list(commands))
    return results


def subscribe(shard: Shard, gateway: str, connection: int, filters: tuple = (), group: str | None = None) -> None:
    assert run(shard, gateway, nolag.subscribe(KEY, connection, f"a{connection}", filters, 0, group))[0] is not None


def walked(shard: Shard, filter_: str | None, gateway: str, exclude: int | None) -> tuple[dict, int]:
    """What walking the subscribers gives (the routes without the kept ones)."""
    chosen = topics(shard).subscriptions.route(KEY, filter_, None if exclude is None else (gateway, exclude))
    return group_by_gateway(chosen), len(chosen)


def test_kept_routes_equal_the_walk_through_every_change(shard):
    component = topics(shard)
    for connection in range(5):
        subscribe(shard, "g", connection)
    subscribe(shard, "h", 7)
    subscribe(shard, "g", 9, filters=("f",))  # filtered: not in an unfiltered publish's routes

    def check() -> None:
        for gateway, exclude in [("g", None), ("g", 0), ("g", 3), ("g", 9), ("h", 7), ("h", 99), ("x", 1)]:
            assert component._routes(KEY, None, gateway, exclude) == walked(shard, None, gateway, exclude)
        assert component._routes(KEY, "f", "g", None) == walked(shard, "f", "g", None)

    check()
    assert component._routes(KEY, None, "g", None) == ({"g": (0, 1, 2, 3, 4), "h": (7,)}, 6)
    assert component._routes(KEY, None, "h", 7) == ({"g": (0, 1, 2, 3, 4)}, 5)  # its gateway's only one
    assert component._routes(KEY, None, "g", 2) == ({"g": (0, 1, 3, 4), "h": (7,)}, 5)
    kept = component._routes(KEY, None, "g", None)[0]
    assert component._routes(KEY, None, "g", None)[0] is kept  # kept, not walked again
    assert component._routes(KEY, None, "g", 2)[0] is not kept  # an exclusion never changes the kept ones
    # a publisher that is no route (its subscription filtered, another gateway's id): the kept ones
    assert component._routes(KEY, None, "g", 9)[0] is kept and component._routes(KEY, None, "h", 0)[0] is kept
    assert component._routes(KEY, None, "g", None) == ({"g": (0, 1, 2, 3, 4), "h": (7,)}, 6)

    subscribe(shard, "h", 8)
    check()
    assert component._routes(KEY, None, "g", None) == ({"g": (0, 1, 2, 3, 4), "h": (7, 8)}, 7)
    run(shard, "g", nolag.unsubscribe(KEY, 1))
    check()
    run(shard, "g", nolag.set_filters(KEY, 9, ()))  # now a wildcard subscriber
    check()
    assert component._routes(KEY, None, "g", None) == ({"g": (0, 2, 3, 4, 9), "h": (7, 8)}, 7)
    run(shard, "g", nolag.set_filters(KEY, 0, ("f",)))
    check()
    subscribe(shard, "g", 2, filters=("f",))  # subscribe again, replacing
    check()
    assert component._routes(KEY, None, "g", None) == ({"g": (3, 4, 9), "h": (7, 8)}, 5)
    shard.purge_gateway("h")
    check()
    assert component._routes(KEY, None, "g", None) == ({"g": (3, 4, 9)}, 3)
    for connection in (0, 2, 3, 4, 9):
        run(shard, "g", nolag.unsubscribe(KEY, connection))
    assert component._routes(KEY, None, "g", None) == ({}, 0)
    check()


def test_a_topic_with_a_load_balance_group_is_walked_each_time_and_takes_turns(shard):
    component = topics(shard)
    subscribe(shard, "g", 1)
    for connection in (2, 3):
        subscribe(shard, "g", connection, group="workers")
    turns = [component._routes(KEY, None, "g", None) for _ in range(4)]
    assert turns == [({"g": (1, 2)}, 2), ({"g": (1, 3)}, 2), ({"g": (1, 2)}, 2), ({"g": (1, 3)}, 2)]
    run(shard, "g", nolag.unsubscribe(KEY, 2), nolag.unsubscribe(KEY, 3))  # no group left: kept again
    assert component._routes(KEY, None, "g", None) == ({"g": (1,)}, 1)
    assert component._routes(KEY, None, "g", None)[0] is component._routes(KEY, None, "g", None)[0]


def test_a_publish_delivers_through_the_kept_routes(shard):
    for connection in range(3):
        subscribe(shard, "g", connection)
    for exclude, expected in [(None, (0, 1, 2)), (1, (0, 2)), (None, (0, 1, 2))]:
        results, bundle = shard.handle("g", [nolag.publish(KEY, "chat/room/messages", b"\xc0", 0, None, exclude,
                                                           None, "a")])
        assert results == [len(expected)]
        assert [connection_ids for _, _, connection_ids, _ in bundle[3]] == [expected]


def test_publishes_to_topics_nobody_subscribes_to_keep_nothing(shard):
    component = topics(shard)
    subscribe(shard, "g", 1)
    for index in range(1000):
        key = nolag.topic_key("p", f"nobody/{index}/here")
        results, bundle = shard.handle("g", [nolag.publish(key, f"nobody/{index}/here", b"\xc0", 0, None, None,
                                                           None, "a")])
        assert results == [0] and bundle is None
    component._routes(KEY, None, "g", None)
    assert list(component.subscriptions._memo) == [KEY]  # only the topic with a subscriber
    run(shard, "g", nolag.unsubscribe(KEY, 1))
    assert component._routes(KEY, None, "g", None) == ({}, 0)
    assert component.subscriptions._memo == {}
