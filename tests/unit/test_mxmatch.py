"""actors/mxmatch.py: the hub's match levels (the spec's filtering page), indexed per shard."""

from __future__ import annotations

import pickle
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.mx.match import (
    ADDRESS,
    ADDRESS_IDENTIFIER,
    ALL,
    IDENTIFIER,
    TOPICS,
    MxMatchIndex,
    Subscription,
)
from gateways.mx import generator
from gateways.mx.codec import parse_subscribe, subscribe_payload
from gateways.mx.node import normalize_save_block


@dataclass(frozen=True)
class Event:
    address: str
    identifier: str
    topics: tuple[bytes, ...] = ()


def selects(subscription: Subscription, event) -> bool:
    """The spec's table, one subscription at a time: what the index must agree with."""
    if subscription.level == ALL:
        return True
    if subscription.level == ADDRESS:
        return event.address == subscription.address
    if subscription.level == IDENTIFIER:
        return event.identifier == subscription.identifier
    same = event.address == subscription.address and event.identifier == subscription.identifier
    if subscription.level == ADDRESS_IDENTIFIER:
        return same
    topics = list(event.topics)
    return (
        same
        and len(subscription.topics) <= len(topics)
        and all(want is None or want == got for want, got in zip(subscription.topics, topics))
    )


def brute_force(subscriptions: dict, event) -> set:
    return {key for key, held in subscriptions.items() if any(selects(s, event) for s in held)}


@pytest.fixture(scope="module")
def block_events():
    """Normalized events of generated blocks: the events a shard really matches."""
    events = []
    for seed in (21, 22, 23):
        events.extend(normalize_save_block(generator.generate_save_block(seed, 40)).events)
    return events


# -- each level selects exactly the right events of a block -------------------------------------------


def selected(index: MxMatchIndex, key, events) -> list[int]:
    return [i for i, event in enumerate(events) if key in index.match(event)]


def test_all_selects_every_event(block_events):
    index = MxMatchIndex()
    index.add("c", Subscription(ALL))
    assert selected(index, "c", block_events) == list(range(len(block_events)))


def test_address_selects_the_events_of_that_address(block_events):
    address = block_events[0].address
    index = MxMatchIndex()
    index.add("c", Subscription(ADDRESS, address))
    expected = [i for i, e in enumerate(block_events) if e.address == address]
    assert 0 < len(expected) < len(block_events)
    assert selected(index, "c", block_events) == expected


def test_identifier_selects_that_identifier_from_any_address(block_events):
    index = MxMatchIndex()
    index.add("c", Subscription(IDENTIFIER, None, "ESDTTransfer"))
    expected = [i for i, e in enumerate(block_events) if e.identifier == "ESDTTransfer"]
    assert len({block_events[i].address for i in expected}) > 1
    assert selected(index, "c", block_events) == expected


def test_address_identifier_needs_both(block_events):
    target = next(e for e in block_events if e.identifier == "ESDTTransfer")
    index = MxMatchIndex()
    index.add("c", Subscription(ADDRESS_IDENTIFIER, target.address, "ESDTTransfer"))
    expected = [i for i, e in enumerate(block_events) if e.address == target.address and e.identifier == "ESDTTransfer"]
    same_address_other_identifier = [i for i, e in enumerate(block_events)
                                     if e.address == target.address and e.identifier != "ESDTTransfer"]
    assert expected and same_address_other_identifier
    assert selected(index, "c", block_events) == expected


def test_topics_selects_by_prefix(block_events):
    target = next(e for e in block_events if e.identifier == "ESDTTransfer")
    token = bytes(target.topics[0])
    index = MxMatchIndex()
    index.add("c", Subscription(TOPICS, target.address, "ESDTTransfer", (token,)))
    expected = [i for i, e in enumerate(block_events)
                if e.address == target.address and e.identifier == "ESDTTransfer" and e.topics[0] == token]
    assert expected
    assert selected(index, "c", block_events) == expected


def test_topics_wildcards_match_any_value_including_empty(block_events):
    # ESDTTransfer topics: [token, nonce (empty), amount, receiver]; filter on the receiver only.
    target = next(e for e in block_events if e.identifier == "ESDTTransfer")
    receiver = bytes(target.topics[3])
    index = MxMatchIndex()
    index.add("c", Subscription(TOPICS, target.address, "ESDTTransfer", (None, None, None, receiver)))
    expected = [i for i, e in enumerate(block_events)
                if e.address == target.address and e.identifier == "ESDTTransfer" and e.topics[3] == receiver]
    assert selected(index, "c", block_events) == expected
    assert block_events.index(target) in expected


def test_topics_longer_than_the_event_never_match(block_events):
    target = next(e for e in block_events if e.identifier == "writeLog")  # one topic
    index = MxMatchIndex()
    index.add("c", Subscription(TOPICS, target.address, "writeLog", (bytes(target.topics[0]), None)))
    assert selected(index, "c", block_events) == []
    index.add("d", Subscription(TOPICS, target.address, "writeLog", (bytes(target.topics[0]),)))
    assert block_events.index(target) in selected(index, "d", block_events)


def test_levels_from_subscribe_payloads(block_events):
    """The codec's filters drive the index: one consumer per level over one block."""
    target = next(e for e in block_events if e.identifier == "ESDTTransfer")
    payloads = {
        "all": subscribe_payload("All"),
        "address": subscribe_payload("Address", target.address.upper()),
        "identifier": subscribe_payload("Identifier", "", "ESDTTransfer"),
        "pair": subscribe_payload("AddressIdentifier", target.address, "ESDTTransfer"),
        "topics": subscribe_payload("Topics", target.address, "ESDTTransfer", [bytes(target.topics[0]), None]),
    }
    index = MxMatchIndex()
    subscriptions = {}
    for key, payload in payloads.items():
        subscription = parse_subscribe(payload)
        index.add(key, subscription)
        subscriptions[key] = {subscription}
    for event in block_events:
        assert index.match(event) == brute_force(subscriptions, event)
    assert index.match(target) == set(payloads)


# -- subscriptions per connection -----------------------------------------------------------------


def test_repeated_subscribes_add_filters():
    index = MxMatchIndex()
    assert index.add("c", Subscription(ADDRESS, "erd1a"))
    assert index.add("c", Subscription(IDENTIFIER, None, "writeLog"))
    assert not index.add("c", Subscription(ADDRESS, "erd1a"))  # the same filter again
    assert index.subscriptions_of("c") == {Subscription(ADDRESS, "erd1a"), Subscription(IDENTIFIER, None, "writeLog")}
    assert index.match(Event("erd1a", "x")) == {"c"}
    assert index.match(Event("erd1b", "writeLog")) == {"c"}
    assert index.match(Event("erd1b", "x")) == set()


def test_an_event_matching_several_filters_is_delivered_once():
    index = MxMatchIndex()
    index.add("c", Subscription(ALL))
    index.add("c", Subscription(ADDRESS, "erd1a"))
    index.add("c", Subscription(TOPICS, "erd1a", "i", (b"t",)))
    assert index.match(Event("erd1a", "i", (b"t",))) == {"c"}


def test_remove_connection_drops_all_its_filters_and_leaves_nothing_behind():
    index = MxMatchIndex()
    index.add("c", Subscription(ALL))
    index.add("c", Subscription(TOPICS, "erd1a", "i", (b"t", None, b"u")))
    index.add("d", Subscription(TOPICS, "erd1a", "i", (b"t",)))
    assert index.remove_connection("c") == 2
    assert index.match(Event("erd1a", "i", (b"t", b"x", b"u"))) == {"d"}
    assert index.remove_connection("d") == 1
    assert index.remove_connection("d") == 0
    assert index.stats() == {"connections": 0, "subscriptions": 0, "all": 0, "addresses": 0, "identifiers": 0,
                             "pairs": 0, "topic_pairs": 0}


def test_removing_one_pattern_keeps_a_longer_one_that_shares_its_prefix():
    index = MxMatchIndex()
    index.add("short", Subscription(TOPICS, "erd1a", "i", (b"t",)))
    index.add("long", Subscription(TOPICS, "erd1a", "i", (b"t", b"u")))
    index.remove_connection("short")
    assert index.match(Event("erd1a", "i", (b"t", b"u"))) == {"long"}
    index.add("short", Subscription(TOPICS, "erd1a", "i", (b"t",)))
    index.remove_connection("long")
    assert index.match(Event("erd1a", "i", (b"t", b"u"))) == {"short"}


def test_connections_are_every_subscribed_key():
    index = MxMatchIndex()
    index.add(("gw-1", 1), Subscription(ALL))
    index.add(("gw-2", 7), Subscription(IDENTIFIER, None, "SCDeploy"))
    assert index.connections() == {("gw-1", 1), ("gw-2", 7)}


@pytest.mark.parametrize(
    "subscription",
    [
        Subscription("all"),
        Subscription(ADDRESS),
        Subscription(IDENTIFIER, "erd1a"),
        Subscription(ADDRESS_IDENTIFIER, "erd1a"),
        Subscription(TOPICS, "erd1a", "i"),
    ],
)
def test_incomplete_filters_are_refused_without_a_trace(subscription):
    index = MxMatchIndex()
    with pytest.raises(ValueError):
        index.add("c", subscription)
    assert index.connections() == set()


def test_subscriptions_survive_pickling():
    """They travel to the shard actors through Ray."""
    subscription = Subscription(TOPICS, "erd1a", "i", (b"t", None))
    assert pickle.loads(pickle.dumps(subscription)) == subscription


# -- property: the index equals a per-subscription check -------------------------------------------

ADDRESSES = ["erd1a", "erd1b", "erd1c"]
IDENTIFIERS = ["ESDTTransfer", "writeLog", "SCDeploy"]
TOPIC_VALUES = [b"", b"t", b"u"]

subscriptions_strategy = st.one_of(
    st.just(Subscription(ALL)),
    st.builds(Subscription, st.just(ADDRESS), st.sampled_from(ADDRESSES)),
    st.builds(Subscription, st.just(IDENTIFIER), st.none(), st.sampled_from(IDENTIFIERS)),
    st.builds(Subscription, st.just(ADDRESS_IDENTIFIER), st.sampled_from(ADDRESSES), st.sampled_from(IDENTIFIERS)),
    st.builds(
        Subscription, st.just(TOPICS), st.sampled_from(ADDRESSES), st.sampled_from(IDENTIFIERS),
        st.lists(st.one_of(st.none(), st.sampled_from(TOPIC_VALUES)), min_size=1, max_size=4).map(tuple),
    ),
)
events_strategy = st.builds(
    Event, st.sampled_from(ADDRESSES), st.sampled_from(IDENTIFIERS),
    st.lists(st.sampled_from(TOPIC_VALUES), max_size=4).map(tuple),
)


@settings(max_examples=300)
@given(
    st.dictionaries(st.integers(0, 12), st.lists(subscriptions_strategy, min_size=1, max_size=4), max_size=10),
    st.lists(events_strategy, min_size=1, max_size=12),
    st.sets(st.integers(0, 12)),
)
def test_index_matches_like_a_check_of_every_subscription(by_key, events, removed):
    index = MxMatchIndex()
    subscriptions = {}
    for key, held in by_key.items():
        for subscription in held:
            index.add(key, subscription)
        subscriptions[key] = set(held)
    for event in events:
        assert index.match(event) == brute_force(subscriptions, event)
    for key in removed:
        index.remove_connection(key)
        subscriptions.pop(key, None)
    for event in events:
        assert index.match(event) == brute_force(subscriptions, event)
