"""A registry shard's Signal Hub component without Ray: what discovery costs a shard and sends back."""

from __future__ import annotations

import pickle

import pytest

from actors.shard import Shard
from actors.signal import contract as signal
from actors.signal.contract import REGISTRY
from actors.signal.shard import SignalRegistry
from router.settings import load_settings

METADATA = {"blob": "x" * 16_000}


@pytest.fixture
def shard(tmp_path) -> Shard:
    settings = load_settings(data_dir=tmp_path, metrics={"enabled": False}, shards={"registry": 1})
    return Shard(REGISTRY, 0, settings, (SignalRegistry,))


def register_many(shard: Shard, count: int) -> list[str]:
    addresses = [f"rt/a{i:05d}" for i in range(count)]
    commands = [signal.register(address, 1, "sess", ["x"], METADATA, 60_000) for address in reversed(addresses)]
    results, _ = shard.handle("g", commands)
    assert all(result.address for result in results)
    return addresses


def test_discover_answers_addresses_of_the_window_only(shard):
    """The issue: a shard answered offset + limit whole registrations (16 KiB of metadata each here),
    after matching and sorting all of them. Now: at most offset + limit addresses, no metadata."""
    addresses = register_many(shard, 2_000)
    results, _ = shard.handle("g", [signal.discover("^rt/", [], None, 110)])
    count, page = results[0]
    assert (count, page) == (111, addresses[:110])
    assert len(pickle.dumps(results)) < 2_000  # 110 addresses; one registration alone is 16 KB
    results, _ = shard.handle("g", [signal.discover(None, [], None, 5_000)])
    assert results[0] == (2_000, addresses)


def test_describe_answers_the_public_view_in_the_given_order(shard):
    addresses = register_many(shard, 3)
    shard.handle("g", [signal.unregister(addresses[1], 1)])
    results, _ = shard.handle("g", [signal.describe([addresses[2], addresses[1], "rt/never", addresses[0]])])
    described = results[0]
    assert [entry["actorAddress"] for entry in described] == [addresses[2], addresses[0]]
    assert set(described[0]) == {"actorAddress", "capabilities", "metadata", "registeredAt"}
    assert described[0]["capabilities"] == ["x"] and described[0]["metadata"] == METADATA
