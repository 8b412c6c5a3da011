"""A shard that Ray restarted serves only re-announcements until every gateway has sent its own
(``actors/shard.py``): a publish from one gateway must not find the subscribers of another gone."""

from __future__ import annotations

import time

import pytest

from actors.shard import Shard
from gateways.dialects import shard_components
from router import contract
from router.contract import DELIVER_TEXT
from router.errors import CommandError
from router.settings import load_settings


@pytest.fixture
def shard(tmp_path):
    settings = load_settings(data_dir=tmp_path, metrics={"enabled": False})
    built = Shard("topic", 0, settings, shard_components(settings)["topic"])
    built._healing = {"gw-a", "gw-b"}  # as if restarted with these two gateways alive
    built._heal_deadline = time.monotonic() + 60
    return built


def _retried(result) -> bool:
    return isinstance(result, CommandError) and result.code == contract.HEALING


def test_until_every_gateway_re_announced_only_re_announcements_run(shard):
    results, _ = shard.handle("gw-a", [contract.subscribe("t", 1), contract.subscribe("t", 7),
                                       contract.reannounced(), contract.publish("t", "x", DELIVER_TEXT)])
    assert results[:3] == [True, True, True] and _retried(results[3])
    results, _ = shard.handle("gw-a", [contract.publish("t", "x", DELIVER_TEXT)])
    assert _retried(results[0])  # gw-b has not re-announced: its subscribers may be missing
    results, _ = shard.handle("gw-b", [contract.reannounced(), contract.stats()])
    assert results[0] is True and results[1]["topics"] == 1  # the last one is in: the rest of its batch runs
    assert shard.info()["healing"] == [] and shard.healed_in is not None
    results, bundle = shard.handle("gw-a", [contract.publish("t", "z", DELIVER_TEXT)])
    assert results == [2] and bundle[3] == [(DELIVER_TEXT, "z", (1, 7), None)]


def test_after_the_heal_timeout_everything_runs(shard):
    shard._heal_deadline = time.monotonic() - 0.001
    results, _ = shard.handle("gw-a", [contract.publish("t", "x", DELIVER_TEXT)])
    assert results == [0] and shard.info()["healing"] == []


def test_a_shard_started_for_the_first_time_does_not_heal(tmp_path):
    settings = load_settings(data_dir=tmp_path, metrics={"enabled": False})
    fresh = Shard("topic", 0, settings, shard_components(settings)["topic"])
    assert fresh.handle("gw-a", [contract.publish("t", "x", DELIVER_TEXT)])[0] == [0]


def test_a_shard_waits_for_its_store_instead_of_failing_its_start(tmp_path, monkeypatch):
    """Ray never restarts an actor whose constructor raised: a shard whose store was unreachable for
    a moment while it (re)started was gone for good. It now tries again until the store answers."""
    from actors import shard as shard_module
    from actors.shard import Component, Shard
    from router.postgres import StoreUnavailable
    from router.settings import load_settings

    monkeypatch.setattr(shard_module, "STORE_RETRY_FIRST_S", 0.01)
    attempts = {"built": 0, "restored": 0}

    class Stored(Component):
        def __init__(self, shard):
            super().__init__(shard)
            attempts["built"] += 1
            if attempts["built"] == 1:
                raise StoreUnavailable("PostgreSQL at postgresql://db:5432/router is not reachable")

        def restore(self):
            attempts["restored"] += 1
            if attempts["restored"] == 1:
                import psycopg
                raise psycopg.OperationalError("connection refused")

    started = Shard("topic", 0, load_settings(data_dir=tmp_path, metrics={"enabled": False}), (Stored,))
    assert attempts == {"built": 3, "restored": 2}
    assert [type(component) for component in started.components] == [Stored]
