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
