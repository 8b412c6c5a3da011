"""``router bench``: the benchmark harness.

Load generators in separate processes drive real clients of each system over 127.0.0.1: the
router (embedded), measured through one or more of its dialects (``--dialect``), the ``raw``
websockets server (``benchmarks/raw_server.py``, the ceiling of the ``websockets`` library on this
machine) and Redis pub/sub, all in one run, so the figures are ratios on one machine. Every run is
bounded in count and time. Output: a table, a JSON file, optionally a PNG.

    router bench fanout                       # S = 1, 100, 1000; router (Signal Hub) vs raw vs redis
    router bench fanout --dialect signal,nolag  # the same cases through NoLag too
    router bench all --dialect all            # every scenario of every dialect: one table
    router bench all --plot bench.png         # every scenario
    router bench fanout --systems router --scale 1,2   # gateways = shards = 1, then 2
    router bench p2p --systems router --nodes 1,2,3    # a Ray cluster of 1, 2, 3 nodes on this machine
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import time
from pathlib import Path
from typing import Any

from router.bench import dialects as bench_dialects
from router.bench import targets
from router.bench.report import (add_ratios, document, format_summaries, format_table, markdown_summaries,
                                 markdown_table, plot, write_json)
from router.bench.scenarios import PLANS, SCENARIOS, Case, Options, run_system, scalar
from router.bench.systems import ClusterRouterSystem, RawSystem, RedisSystem, RouterSystem, System, Unavailable

SYSTEMS = ("raw", "redis", "router")


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def _own_scenarios() -> dict[str, list[str]]:
    """Each dialect's own scenarios (beyond the shared ``SCENARIOS``)."""
    return {name: list(bench_dialects.profile(name).plans()) for name in bench_dialects.NAMES}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    own = sorted({scenario for names in _own_scenarios().values() for scenario in names} - set(SCENARIOS))
    parser.add_argument("scenario", choices=(*SCENARIOS, *own, "all", "lanes", "matching", "targets"),
                        help="a scenario, all of them, lanes (what the gateway–shard transport costs), "
                             "matching (what Baqend's query shards pay per write as queries grow, in-process) or "
                             "targets (the ratio targets in alternating rounds of raw and one router)")
    parser.add_argument("--dialect", default="signal",
                        help=f"comma-separated router dialects to measure: {', '.join(bench_dialects.NAMES)}, "
                             "or all (default signal)")
    parser.add_argument("--systems", default=None,
                        help="comma-separated: raw, redis, router, and a dialect's own peers (cashu: nutshell); "
                             "default: all of them")
    parser.add_argument("--subscribers", type=_ints, default=[1, 100, 1000], help="fanout: S values (default 1,100,1000)")
    parser.add_argument("--deliveries", type=int, default=Options.deliveries,
                        help="fanout S>1 on raw, Redis and a cluster (--nodes), topics, NoLag groups and Cashu notify: "
                             "deliveries per case")
    parser.add_argument("--router-deliveries", type=int, default=Options.router_deliveries,
                        help="fanout S>1 on the embedded router (Signal Hub, NoLag at QoS 0 and qos1): deliveries per case")
    parser.add_argument("--messages-s1", type=int, default=Options.messages_s1, help="fanout S=1: messages")
    parser.add_argument("--p2p-messages", type=int, default=Options.p2p_messages)
    parser.add_argument("--pairs", type=int, default=20, help="p2p: sender/receiver pairs")
    parser.add_argument("--window", type=int, default=1000, help="unacknowledged publishes per publisher")
    parser.add_argument("--rate", type=float, default=1000.0, help="latency: offered messages/s")
    parser.add_argument("--latency-seconds", type=float, default=10.0)
    parser.add_argument("--latency-subscribers", type=int, default=100)
    parser.add_argument("--connections", type=int, default=10_000, help="connections: idle connections to open")
    parser.add_argument("--churn-seconds", type=float, default=5.0)
    parser.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                        help="a dialect scenario's own parameter, e.g. baqend.queries=1000,10000 "
                             "(each dialect's module in router/bench/dialects/ lists its own)")
    parser.add_argument("--procs", type=int, default=2, help="load-generator processes per role")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds a case may take")
    parser.add_argument("--idle", type=float, default=5.0, help="a receiver stops after this long without a frame")
    parser.add_argument("--gateways", type=int, default=1, help="router gateways (default 1)")
    parser.add_argument("--shards", type=int, default=None, help="router shards of each kind (default: config, 2)")
    parser.add_argument("--scale", type=_ints, default=None,
                        help="run the router once per N with gateways = shards = N (e.g. 1,2)")
    parser.add_argument("--nodes", type=_ints, default=None,
                        help="the router on a local Ray cluster of N nodes, a router per node, e.g. 1,2,3 "
                             "(router/localcluster.py; clients spread over every node's gateway)")
    parser.add_argument("--eventlog", choices=("on", "off", "compare"), default="on",
                        help="the router's event log (default on); compare: each router once with it, once "
                             "without (what the log costs)")
    parser.add_argument("--pin", type=int, default=0,
                        help="CPU the raw and redis servers (and a dialect's peer, e.g. Nutshell) are pinned to, "
                             "every thread; the load generators get the other CPUs (-1: nothing pinned)")
    parser.add_argument("--pin-gateway", action="store_true",
                        help="also pin a router of one gateway: the gateway on --pin's CPU, its other processes "
                             "(shards, event-log writer, Ray's) with the load generators on the others")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run every case N times on the same system (rows 'CASE, run k'): how steady a figure is")
    parser.add_argument("--target-rounds", type=int, default=targets.ROUNDS,
                        help="targets, and all with raw, the router, Signal Hub and NoLag: rounds in which the "
                             "ratio targets' cases run alternately on raw and on one router (default "
                             f"{targets.ROUNDS}; 0: all without them)")
    parser.add_argument("--lanes", default="unix,tcp", help="lanes: the kinds measured (unix, tcp)")
    parser.add_argument("--lane-seconds", type=float, default=3.0, help="lanes: length of the throughput run")
    parser.add_argument("--out", help="JSON file (default benchmarks/results/bench-<scenario>.json)")
    parser.add_argument("--markdown", help="also write the table as Markdown to this file")
    parser.add_argument("--plot", help="PNG file: every value over raw's")


def _systems(args: argparse.Namespace) -> list[System]:
    pin = None if args.pin < 0 else args.pin
    peers = {system.name: system for name in _dialects(args) for system in bench_dialects.profile(name).peers(pin)}
    known = (*SYSTEMS[:-1], *peers, SYSTEMS[-1])
    wanted = [name.strip() for name in (args.systems or ",".join(known)).split(",") if name.strip()]
    unknown = set(wanted) - set(known)
    if unknown:
        raise SystemExit(f"router bench: unknown system(s) {sorted(unknown)}; choose from {known}")
    systems: list[System] = []
    for name in known:  # baselines first: they never share the machine with Ray
        if name not in wanted:
            continue
        if name == "raw":
            systems.append(RawSystem(pin))
        elif name == "redis":
            systems.append(RedisSystem(pin))
        elif name in peers:
            systems.append(peers[name])
        elif args.nodes:
            systems += [ClusterRouterSystem(n, args.shards, log, f"router {n} node{'s' if n > 1 else ''}{suffix}")
                        for n in args.nodes for log, suffix in _logs(args)]
        else:
            for dialect in _dialects(args):
                for log, suffix in _logs(args):
                    if args.scale:
                        systems += [RouterSystem(n, n, log, f"router g{n}/s{n}{suffix}", dialect) for n in args.scale]
                    else:
                        systems.append(RouterSystem(args.gateways, args.shards, log, f"router{suffix}", dialect,
                                                    pin if args.pin_gateway else None))
    return systems


def _logs(args: argparse.Namespace) -> list[tuple[bool, str]]:
    """(event log on, name suffix) of each router to run."""
    if args.eventlog == "compare":
        return [(True, ""), (False, " no log")]
    return [(args.eventlog == "on", "")]


def _params(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise SystemExit(f"router bench: --param {pair!r}: expected KEY=VALUE")
        out[key.strip()] = value.strip()
    return out


def _dialects(args: argparse.Namespace) -> list[str]:
    wanted = [name.strip() for name in args.dialect.split(",") if name.strip()]
    return list(bench_dialects.NAMES) if "all" in wanted else wanted


def missing_extras(cases: list[Case]) -> list[str]:
    """What this run's cases need and cannot import, said as what to install (never a
    ``ModuleNotFoundError`` in a table cell). The redis baseline's client is checked as it starts
    (it is skipped with the same kind of message, like a missing ``redis-server``)."""
    if any(case.metric == "p99_ms" for case in cases) and importlib.util.find_spec("hdrh") is None:
        return ["the latency cases' HDR histograms need hdrhistogram: pip install -e '.[bench]'"]
    return []


def repeated(cases: list[Case], times: int) -> list[Case]:
    """Each case ``times`` times in a row, named ``<case>, run <k>`` (unchanged when once)."""
    if times <= 1:
        return cases
    out = []
    for case in cases:
        for run in range(1, times + 1):
            out.append(dataclasses.replace(case, case=f"{case.case}, run {run}",
                                           compare=f"{case.compare or case.case}, run {run}"))
    return out


def _lanes(args: argparse.Namespace) -> int:
    from router.bench import lanes
    from router.bench.report import machine

    kinds = [kind.strip() for kind in args.lanes.split(",") if kind.strip()]
    if not kinds or not set(kinds) <= {"unix", "tcp"}:
        raise SystemExit("router bench lanes: --lanes takes unix and/or tcp")
    rows = lanes.run(kinds, args.lane_seconds)
    out = Path(args.out or "benchmarks/results/bench-lanes.json")
    write_json(out, {"scenario": "lanes", "machine": machine(), "results": rows})
    print(f"results written to {out}")
    return 0


def _matching(args: argparse.Namespace) -> int:
    from router.bench.dialects import baqend
    from router.bench.report import machine

    params = Options(params=_params(args.param))
    queries = params.param("baqend.queries", [1000, 2000, 5000, 10_000, 20_000])
    per_group, matches = params.param("baqend.per_group", 200), params.param("baqend.matches", 10)
    writes = scalar(params, "baqend.writes", None)  # in all, the same at every Q (else per_group a group)
    orders = params.param("baqend.order", "round", str)
    runs = scalar(params, "baqend.runs", baqend.MATCHING_RUNS)
    rows = baqend.matching_run(queries if isinstance(queries, list) else [queries], per_group, matches, runs=runs,
                               orders=tuple(orders) if isinstance(orders, list) else (orders,), writes=writes)
    out = Path(args.out or "benchmarks/results/bench-matching.json")
    write_json(out, {"scenario": "matching", "machine": machine(), "per_group": None if writes else per_group,
                     "writes": writes, "matches": matches, "results": rows})
    print(f"results written to {out}")
    return 0


def plan_cases(scenario: str, dialects: list[str], options: Options) -> list[Case]:
    """The cases of ``scenario`` (or ``all``) for each dialect that runs it, then the shared cases
    once more for the baselines (``dialect`` None)."""
    cases: list[Case] = []
    shared: list[str] = []
    for name in dialects:
        profile = bench_dialects.profile(name)
        own = profile.plans()
        wanted = list(dict.fromkeys([*SCENARIOS, *own])) if scenario == "all" else [scenario]
        for each in wanted:
            if each in profile.shared:
                shared.append(each)
                planned = PLANS[each](options)
            elif each in own:
                planned = own[each](options)
            else:
                continue
            for case in planned:
                case.dialect = name
            cases += planned
    for each in dict.fromkeys(shared):
        cases += PLANS[each](options)
    if not cases:
        raise SystemExit(f"router bench: no dialect of {', '.join(dialects)} runs {scenario!r}")
    return cases


def run(args: argparse.Namespace) -> int:
    if args.scenario == "lanes":
        return _lanes(args)
    if args.scenario == "matching":
        return _matching(args)
    options = Options(
        subscribers=args.subscribers, deliveries=args.deliveries, router_deliveries=args.router_deliveries,
        messages_s1=args.messages_s1, window=args.window,
        procs=args.procs, pairs=args.pairs, p2p_messages=args.p2p_messages, rate=args.rate,
        latency_seconds=args.latency_seconds, latency_subscribers=args.latency_subscribers,
        connections=args.connections, churn_seconds=args.churn_seconds, timeout=args.timeout, idle_s=args.idle,
        params=_params(args.param))
    if args.scenario == "targets":
        return _targets_only(args, options)
    if args.nodes and _dialects(args) != ["signal"]:
        raise SystemExit("router bench: --nodes measures Signal Hub only")
    cases = repeated(plan_cases(args.scenario, _dialects(args), options), args.repeat)
    systems = _systems(args)
    missing = missing_extras(cases)
    if missing:
        raise SystemExit("router bench: " + "; ".join(missing))

    def progress(message: str) -> None:
        print(f"bench: {message}", flush=True)

    rows: list[dict[str, Any]] = []
    described, skipped = [], {}
    started = time.monotonic()
    for system in systems:
        try:
            rows += run_system(system, cases, options, progress)
            described.append(system.describe())
        except Unavailable as reason:
            skipped[system.name] = str(reason)
            progress(f"skipping {system.name}: {reason}")
    order: dict[tuple[str, str], int] = {}
    for index, case in enumerate(cases):  # every system's row of a case together, baselines first
        order.setdefault((case.scenario, case.case), index)
    rank = {"-": -1, **{name: index for index, name in enumerate(bench_dialects.NAMES)}}
    rows.sort(key=lambda row: (order[(row["scenario"], row["case"])], rank[row["dialect"]]))
    add_ratios(rows)
    print()
    print(format_table(rows))
    summaries = [each for name in _dialects(args) for each in bench_dialects.profile(name).summaries(rows)]
    if summaries:
        print()
        print(format_summaries(summaries))
    for name, reason in skipped.items():
        print(f"\n{name}: skipped: {reason}")
    suffix = "" if _dialects(args) == ["signal"] else "-" + "-".join(_dialects(args))
    out = Path(args.out or f"benchmarks/results/bench-{args.scenario}{suffix}.json")
    content = document(args.scenario, {**vars(options), "argv": {k: v for k, v in vars(args).items() if k != "func"}},
                       described, rows, skipped)
    if summaries:
        content["summaries"] = summaries
    write_json(out, content)  # the table is kept whatever happens in the rounds after it
    round_rows: list[dict[str, Any]] = []
    summary: list[dict[str, Any]] = []
    if _with_targets(args, skipped):
        round_rows, summary = targets.run(options, args.target_rounds, None if args.pin < 0 else args.pin,
                                          progress, args.eventlog != "off", args.pin_gateway)
        _print_rounds(round_rows, summary)
        content.update(target_rounds=round_rows, targets=summary)
        write_json(out, content)
    print(f"\nresults written to {out} ({time.monotonic() - started:.0f} s)")
    if args.markdown:
        text = markdown_table(rows) + "\n"
        if summaries:
            text += "\n" + markdown_summaries(summaries) + "\n"
        if summary:
            text += ("\nThe ratio targets in alternating rounds (`router bench targets`):\n\n"
                     + targets.markdown_targets(summary) + "\n")
        Path(args.markdown).write_text(text)
    if args.plot:
        plot(rows, Path(args.plot))
        print(f"plot written to {args.plot}")
    return 0 if all(row.get("value") is not None for row in [*rows, *round_rows]) else 1


def _with_targets(args: argparse.Namespace, skipped: dict[str, str]) -> bool:
    """``all`` ends with the target rounds when it measures raw and the embedded router, through
    Signal Hub and NoLag, with one gateway and the default shards (the rounds' router)."""
    wanted = {name.strip() for name in (args.systems or "raw,router").split(",")}
    return (args.scenario == "all" and args.target_rounds > 0 and {"raw", "router"} <= wanted
            and "raw" not in skipped and set(targets.DIALECTS) <= set(_dialects(args))
            and not args.nodes and not args.scale and args.gateways == 1 and args.shards is None
            and args.eventlog != "compare")


def _print_rounds(rows: list[dict[str, Any]], summary: list[dict[str, Any]]) -> None:
    print()
    print(format_table(rows))
    print()
    print(targets.format_targets(summary))


def _targets_only(args: argparse.Namespace, options: Options) -> int:
    if args.target_rounds < 1:
        raise SystemExit("router bench targets: --target-rounds must be at least 1")
    started = time.monotonic()
    rows, summary = targets.run(options, args.target_rounds, None if args.pin < 0 else args.pin,
                                lambda message: print(f"bench: {message}", flush=True), args.eventlog != "off",
                                args.pin_gateway)
    _print_rounds(rows, summary)
    out = Path(args.out or "benchmarks/results/bench-targets.json")
    content = document("targets", {**vars(options), "argv": {k: v for k, v in vars(args).items() if k != "func"}},
                       [], [], {})
    content.update(target_rounds=rows, targets=summary)
    write_json(out, content)
    print(f"\nresults written to {out} ({time.monotonic() - started:.0f} s)")
    if args.markdown:
        Path(args.markdown).write_text(targets.markdown_targets(summary) + "\n")
    return 0 if all(row.get("value") is not None for row in rows) else 1
