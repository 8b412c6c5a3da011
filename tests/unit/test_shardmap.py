"""router/shardmap.py: stable key placement and actor names."""

from __future__ import annotations

import pytest

from actors.signal.contract import REGISTRY
from gateways.dialects import shard_kinds
from router.settings import load_settings
from router.shardmap import GATEWAY_PREFIX, SESSION, TOPIC, gateway_name, shard_index, shard_name

# Computed once from xxhash.xxh64 (seed 0) of the UTF-8 key: these must never change, or keys
# would move between shards across versions of the router.
KNOWN = [
    ("alpha", {2: 0, 3: 2, 7: 1, 16: 8, 1024: 72}),
    ("topic:chat", {2: 0, 3: 0, 7: 3, 16: 4, 1024: 164}),
    ("runtime/actor-1", {2: 1, 3: 1, 7: 1, 16: 11, 1024: 747}),
    ("", {2: 1, 3: 0, 7: 6, 16: 9, 1024: 409}),
    ("ü-ключ", {2: 0, 3: 0, 7: 4, 16: 10, 1024: 746}),
]


@pytest.mark.parametrize(("key", "indices"), KNOWN, ids=[k or "<empty>" for k, _ in KNOWN])
def test_shard_index_is_stable(key, indices):
    assert {count: shard_index(key, count) for count in indices} == indices


def test_shard_index_in_range():
    for count in (2, 3, 5, 8, 1024):
        seen = {shard_index(f"key-{i}", count) for i in range(2_000)}
        assert seen <= set(range(count))
        # 2,000 keys reach every shard of a small map and most of a large one.
        if count <= 8:
            assert seen == set(range(count))
        else:
            assert len(seen) > count // 2


def test_single_shard_is_always_zero():
    for key in ("alpha", "", "ü-ключ", "x" * 10_000):
        assert shard_index(key, 1) == 0


def test_lone_surrogates_do_not_raise():
    index = shard_index("bad\ud800key", 4)
    assert index in range(4)
    assert shard_index("bad\ud800key", 4) == index


def test_names():
    assert shard_name(TOPIC, 3) == "topic-shard-3"
    assert shard_name(SESSION, 0) == "session-shard-0"
    assert shard_name(REGISTRY, 12) == "registry-shard-12"
    assert gateway_name("g1") == "gateway-g1"
    assert GATEWAY_PREFIX == "gateway-"
    assert shard_kinds(load_settings(baqend={"enabled": False})) == ("session", "topic", "registry")
