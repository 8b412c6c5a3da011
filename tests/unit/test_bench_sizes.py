"""router/bench: how many publishes a fan-out case carries on each system. The embedded router's
fan-out S>1 (Signal Hub's, NoLag's at QoS 0 and ``qos1``) carries ``--router-deliveries``: at
``--deliveries`` (4,000,000) its case lasted half a second and ended before its event-log writer
ran. A single subscriber's case carries ``--messages-s1`` on every system, NoLag ``qos1`` too."""

from __future__ import annotations

import pytest

from router.bench.dialects.nolag import qos1_cases
from router.bench.scenarios import Options, fanout_cases, fanout_publishes
from router.bench.systems import ClusterRouterSystem, RawSystem, RouterSystem

OPTIONS = Options(subscribers=[1, 100], deliveries=40_000, router_deliveries=320_000, messages_s1=5_000,
                  params={"nolag.qos1_subscribers": "1,100"})


def systems() -> dict[str, object]:
    made = {"raw": RawSystem(None), "router": RouterSystem(dialect="nolag"), "cluster": ClusterRouterSystem(2)}
    for system in made.values():  # not started: one URL each, for the jobs to name
        system.urls = lambda: ["ws://127.0.0.1:9/ws"]
    return made


@pytest.mark.parametrize("name, to_one, to_hundred", [
    ("raw", 5_000, 400), ("router", 5_000, 3_200), ("cluster", 5_000, 400)])
def test_a_fan_out_case_carries_the_deliveries_of_its_system(name, to_one, to_hundred):
    system = systems()[name]
    assert fanout_publishes(OPTIONS, system, 1) == to_one
    assert fanout_publishes(OPTIONS, system, 100) == to_hundred
    jobs = [case.jobs(system) for case in fanout_cases(OPTIONS)]
    for publishes, out in zip((to_one, to_hundred), jobs):
        (publisher,) = [spec for role, spec in out if role == "publishers"]
        assert publisher["messages"] == publishes
        assert sum(spec["expected"] for role, spec in out if role == "subscribers") == publishes * (
            1 if publishes == to_one else 100)


def test_nolag_qos1_carries_what_signal_hubs_case_of_as_many_subscribers_does():
    """Before, ``qos1`` to one subscriber carried every delivery of ``router_deliveries`` (32 M by
    default: it could not end in the case's time bound), not ``messages_s1`` as fan-out S=1."""
    router = systems()["router"]
    cases = qos1_cases(OPTIONS)
    assert [case.case for case in cases] == ["S=1 QoS 1", "S=100 QoS 1"]
    for case, publishes in zip(cases, (5_000, 3_200)):
        out = case.jobs(router)
        (publisher,) = [spec for role, spec in out if role == "publishers"]
        assert publisher["messages"] == publishes and publisher["qos"] == 1
        assert sum(spec["expected"] for role, spec in out if role == "nolag-acking") == publishes * int(
            case.case.split("=")[1].split()[0])
