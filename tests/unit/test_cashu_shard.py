"""Cashu's part of a topic shard without Ray: a subscription's keys of one shard travel in one command."""

from __future__ import annotations

import pytest

from actors.cashu import contract as cashu
from actors.cashu.retained import MemoryRetainedStore, RetainedValues
from actors.cashu.shard import CashuRetained
from actors.pubsub import PubSub
from actors.shard import Shard
from router.contract import DELIVER_EVENT
from router.settings import load_settings
from router.shardmap import TOPIC


@pytest.fixture
def shard(tmp_path) -> Shard:
    shard = Shard(TOPIC, 0, load_settings(data_dir=tmp_path, metrics={"enabled": False}), (PubSub, CashuRetained))
    shard.store = MemoryRetainedStore()
    shard.component(CashuRetained)._retained = RetainedValues(shard.store)
    return shard


def test_subscribe_many_answers_each_keys_current_state_in_order(shard):
    shard.handle("g", [cashu.set_state("b", b"vb")])
    results, _ = shard.handle("g", [cashu.subscribe_many(("a", "b", "c"), 7)])
    assert results == [[None, (1, b"vb"), None]]
    _, bundle = shard.handle("g", [cashu.set_state("a", b"va"), cashu.set_state("c", b"vc")])
    assert bundle[3] == [(DELIVER_EVENT, ("a", 1, b"va", None), (7,), None),
                         (DELIVER_EVENT, ("c", 1, b"vc", None), (7,), None)]


def test_unsubscribe_many_stops_deliveries_of_those_keys_only(shard):
    shard.handle("g", [cashu.subscribe_many(("a", "b", "c"), 7)])
    results, _ = shard.handle("g", [cashu.unsubscribe_many(("a", "c", "never"), 7)])
    assert results == [2]
    _, bundle = shard.handle("g", [cashu.set_state(key, b"v") for key in ("a", "b", "c")])
    assert bundle[3] == [(DELIVER_EVENT, ("b", 1, b"v", None), (7,), None)]


def test_init_many_stores_only_what_is_absent(shard):
    shard.handle("g", [cashu.subscribe_many(("q1", "q2"), 7), cashu.set_state("q2", b"pushed")])
    results, bundle = shard.handle("g", [cashu.init_many(("q1", "q2"), (b"fetched1", b"fetched2"))])
    assert results == [[(1, b"fetched1"), (1, b"pushed")]]  # a pushed state wins over the mint's
    assert bundle[3] == [(DELIVER_EVENT, ("q1", 1, b"fetched1", None), (7,), None)]
