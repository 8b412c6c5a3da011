"""The ratio targets of ``router bench`` measured in alternating rounds (``router bench targets``,
and after ``router bench all``'s table with ``--target-rounds``).

In the full table each system runs all its cases in one block (raw's first, then one router per
dialect), so the two sides of a ratio (Signal Hub's S=1 and raw's, NoLag's QoS 1 and Signal
Hub's S=100) are measured minutes apart, and a slow spell of the machine in one block moves the
ratio by a third (docs/performance.md §7). Here each round measures both sides of every ratio
close together: raw's cases, then a fresh router serving Signal Hub and NoLag at once (one router,
so NoLag's cases and Signal Hub's share its processes and event log), its cases, the router
stopped; the next round in the opposite order (router first, its cases reversed, then raw's), so
a drift over the round weighs on both sides alike (with the default three rounds the first order
runs twice and the reversed one once; an even count balances them). A baseline still never shares
the machine with Ray: each router is stopped, and its processes gone, before raw runs. Each
target's figure is the median of its rounds' ratios, each round's ratio shown; it is met when
every round has a ratio and the median reaches the goal.

Pure parts (the plan of a round, the ratios and medians) are unit-tested; :func:`run` drives real
systems.
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass
from typing import Any, Callable

from router.bench.report import ratio_cell
from router.bench.scenarios import Case, Options, fanout_cases, p2p_cases, run_system
from router.bench.systems import RawSystem, RouterSystem

DIALECTS = ("signal", "nolag")  # the router of a round serves both
ROUNDS = 3


@dataclass(frozen=True)
class Target:
    """``numerator / denominator >= goal``; each side a row's (scenario, case, side): ``side``
    the router's dialect, or ``raw``."""

    name: str
    goal: float
    numerator: tuple[str, str, str]
    denominator: tuple[str, str, str]


def targets(options: Options) -> list[Target]:
    p2p = p2p_cases(options)[0].case
    return [
        Target("Signal Hub fanout S=1 ≥ 1.0 × raw", 1.0, ("fanout", "S=1", "signal"), ("fanout", "S=1", "raw")),
        Target("Signal Hub p2p ≥ 1.0 × raw", 1.0, ("p2p", p2p, "signal"), ("p2p", p2p, "raw")),
        Target("NoLag QoS 0 fanout S=100 ≥ 0.7 × Signal Hub", 0.7,
               ("fanout", "S=100", "nolag"), ("fanout", "S=100", "signal")),
        Target("NoLag QoS 1 fanout S=100 ≥ 0.5 × Signal Hub", 0.5,
               ("fanout", "S=100 QoS 1", "nolag"), ("fanout", "S=100", "signal")),
    ]


def plan(options: Options) -> tuple[list[Case], list[Case]]:
    """raw's cases and the router's (each with its dialect), at the run's sizes, in the order of an
    odd round: every case a target names, once."""
    from router.bench.dialects.nolag import qos1_cases

    one = dataclasses.replace(options, subscribers=[1])
    hundred = dataclasses.replace(options, subscribers=[100])
    raw = [*fanout_cases(one), *p2p_cases(options)]
    router: list[Case] = []
    for dialect, cases in (("signal", fanout_cases(one)), ("signal", p2p_cases(options)),
                           ("signal", fanout_cases(hundred)), ("nolag", fanout_cases(hundred)),
                           ("nolag", [case for case in qos1_cases(options) if case.case == "S=100 QoS 1"])):
        for case in cases:
            case.dialect = dialect
            router.append(case)
    return raw, router


def round_order(round_number: int, raw: list, router: list) -> list[tuple[str, list]]:
    """The phases of round ``round_number`` (from 1): odd, raw's cases then the router's; even, the
    router's reversed then raw's reversed."""
    if round_number % 2:
        return [("raw", list(raw)), ("router", list(router))]
    return [("router", list(reversed(router))), ("raw", list(reversed(raw)))]


def side(row: dict[str, Any]) -> str:
    """A row's side of a ratio: the router's dialect, or the baseline's name."""
    return row["dialect"] if row["system"] == "router" else row["system"]


def summarise(rows: list[dict[str, Any]], wanted: list[Target], rounds: int) -> list[dict[str, Any]]:
    """Each target's ratio in every round (None where a side has no figure: its case failed; a
    round that delivered nothing is a ratio of 0), their median over the rounds that have one, and
    whether it is met: every round has a ratio and the median meets the goal."""
    values = {(row["scenario"], row["base_case"], side(row), row["round"]): row.get("value") for row in rows}
    out = []
    for target in wanted:
        ratios: list[float | None] = []
        for number in range(1, rounds + 1):
            top, bottom = values.get((*target.numerator, number)), values.get((*target.denominator, number))
            ratios.append(round(top / bottom, 6) if top is not None and bottom else None)
        known = [ratio for ratio in ratios if ratio is not None]
        median = round(statistics.median(known), 6) if known else None
        out.append({"target": target.name, "goal": target.goal, "ratios": ratios, "median": median,
                    "rounds_met": sum(ratio >= target.goal for ratio in known),
                    "met": len(known) == rounds and median is not None and median >= target.goal})
    return out


def run(options: Options, rounds: int, pin: int | None, progress: Callable[[str], None],
        eventlog: bool = True, pin_gateway: bool = False) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``rounds`` rounds on this machine: the rows (``round``, ``base_case``; ``case`` says the
    round; a router's rows its ``gateway_pids``) and :func:`summarise`'s targets. Raw's server on
    ``pin`` as in the table; the router's gateway there too with ``pin_gateway``."""
    raw_cases, router_cases = plan(options)
    rows: list[dict[str, Any]] = []
    for number in range(1, rounds + 1):
        for phase, cases in round_order(number, raw_cases, router_cases):
            progress(f"targets round {number}/{rounds}: {phase}")
            if phase == "raw":
                done = run_system(RawSystem(pin), cases, options, progress)
            else:  # a fresh router of Signal Hub and NoLag, stopped (its processes gone) after its cases
                router = RouterSystem(eventlog=eventlog, dialect=DIALECTS[0], cpu=pin if pin_gateway else None,
                                      also=DIALECTS[1:])
                done = run_system(router, cases, options, progress)
                for row in done:
                    row["gateway_pids"] = list(router.gateway_pids)
            for row in done:
                row["base_case"], row["round"] = row["case"], number
                row["case"] = f"{row['case']}, round {number}"
            rows += done
    return rows, summarise(rows, targets(options), rounds)


def format_targets(summary: list[dict[str, Any]]) -> str:
    """The terminal table of the targets: goal, each round's ratio, the median, met or not."""
    rounds = max((len(item["ratios"]) for item in summary), default=0)
    header = ("target", "goal", *(f"round {n}" for n in range(1, rounds + 1)), "median", "met")
    lines = [header] + [(item["target"], f"{item['goal']:.2f}", *(ratio_cell(r) for r in item["ratios"]),
                         ratio_cell(item["median"]), _met(item)) for item in summary]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    out = ["  ".join(cell.ljust(width) if i == 0 else cell.rjust(width)
                     for i, (cell, width) in enumerate(zip(line, widths))).rstrip() for line in lines]
    out.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(out)


def markdown_targets(summary: list[dict[str, Any]]) -> str:
    rounds = max((len(item["ratios"]) for item in summary), default=0)
    out = ["| target | goal | " + " | ".join(f"round {n}" for n in range(1, rounds + 1)) + " | median | met |",
           "|---|---:|" + "---:|" * rounds + "---:|---|"]
    for item in summary:
        out.append(f"| {item['target']} | {item['goal']:.2f} | "
                   + " | ".join(ratio_cell(r) for r in item["ratios"])
                   + f" | {ratio_cell(item['median'])} | {_met(item)} |")
    return "\n".join(out)


def _met(item: dict[str, Any]) -> str:
    rounds = len(item["ratios"])
    missing = sum(ratio is None for ratio in item["ratios"])
    return (f"{'yes' if item['met'] else 'no'} ({item['rounds_met']} of {rounds} rounds"
            + (f", {missing} without a figure)" if missing else ")"))
