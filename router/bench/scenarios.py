"""The scenarios of ``router bench`` and the orchestration of their load-generator processes.

A scenario is a list of :class:`Case`; each case builds worker jobs for a system's URLs and turns
the workers' results (and the server processes' CPU and memory) into one row. Systems run one at a
time (start, every case, stop) so a baseline never shares the machine with Ray.

The shared scenarios (``SCENARIOS``) are planned once per dialect that runs them and once for the
baselines (``dialect`` None); a dialect's own scenarios come from its profile
(``router/bench/dialects/``).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import psutil

from router.bench import loadgen
from router.bench.report import cpu_percent, delivery_rate, merged_histogram, percentiles_ms, span_rate
from router.bench.systems import System, rss_bytes

SCENARIOS = ("fanout", "topics", "p2p", "latency", "connections", "churn")


@dataclass
class Options:
    subscribers: list[int] = field(default_factory=lambda: [1, 100, 1000])
    # Cases long enough for the router's steady state (several seconds): the event-log writer
    # converts what the gateways hand it every couple of seconds, in a process of its own that
    # competes for the same two cores; a case of one or two seconds ended before most of it ran.
    deliveries: int = 4_000_000  # per fanout / topics case
    # The embedded router's fan-out S>1 (``System.fast_fanout``): about 5 s of Signal Hub's S=100,
    # 10 s of NoLag QoS 1 (at 4,000,000 Signal Hub's lasted half a second, 8 % above its steady rate).
    router_deliveries: int = 32_000_000
    messages_s1: int = 1_000_000  # fanout S=1 publishes (a single subscriber needs more to last)
    window: int = 1000
    procs: int = 2  # processes per role
    topics: int = 100
    topics_per_subscriber: int = 10
    topic_subscribers: int = 100
    topic_publishers: int = 10
    pairs: int = 20
    p2p_messages: int = 1_000_000
    rate: float = 1000.0
    latency_seconds: float = 10.0
    latency_subscribers: int = 100
    connections: int = 10_000
    churn_seconds: float = 5.0
    churn_concurrency: int = 25
    timeout: float = 120.0
    idle_s: float = 5.0  # a receiver gives up after this long without a frame
    params: dict[str, str] = field(default_factory=dict)  # dialect scenarios' own (``--param dialect.key=value``)

    def param(self, key: str, default: Any, kind: Callable[[str], Any] = int) -> Any:
        """``--param key=value`` as ``kind`` (a comma-separated value gives a list), else ``default``."""
        if key not in self.params:
            return default
        parts = [kind(part) for part in self.params[key].split(",") if part.strip()]
        return parts if "," in self.params[key] else parts[0]


def scalar(options: Options, key: str, default: int | None) -> int | None:
    """``--param key=value`` as one number of at least 1, else ``default`` (None: not given)."""
    value = options.param(key, default)
    if value is None:
        return None
    if isinstance(value, list):
        raise SystemExit(f"router bench: --param {key}: one value, not a list")
    if value < 1:
        raise SystemExit(f"router bench: --param {key}: must be at least 1")
    return value


@dataclass
class Case:
    scenario: str
    case: str
    metric: str
    jobs: Callable[[System], list[tuple[str, dict[str, Any]]]]
    summarise: Callable[[System, list[dict[str, Any]], dict[str, Any]], dict[str, Any]]
    memory: bool = False  # measure the servers' RSS before the workers start and once they are ready
    dialect: str | None = None  # the router dialect it measures; None: a shared case, baselines run it too
    compare: str | None = None  # the Signal Hub case its figure is set against (default: the same case)


def split(items: list, parts: int) -> list[list]:
    parts = max(1, min(parts, len(items)))
    return [items[index::parts] for index in range(parts)]


def url_of(system: System, index: int) -> str:
    urls = system.urls()
    return urls[index % len(urls)]


# -- rate scenarios ----------------------------------------------------------------------------

def _rate_row(metric: str) -> Callable:
    def summarise(system: System, results: list[dict[str, Any]], measured: dict[str, Any]) -> dict[str, Any]:
        receivers = [r for r in results if r["role"] == "Subscribers"]
        received, rate = delivery_rate(receivers)
        expected = sum(r.get("expected", 0) for r in receivers)
        row = {"value": round(rate), "received": received, "expected": expected}
        if received < expected:
            row["notes"] = f"{expected - received:,} of {expected:,} not received"
        return row

    return summarise


def fanout_publishes(options: Options, system: System, subscribers: int) -> int:
    """Publishes of a fan-out case to ``subscribers`` on ``system``: ``messages_s1`` to one; to
    more, ``router_deliveries`` in all on the embedded router, ``deliveries`` on the others."""
    if subscribers == 1:
        return options.messages_s1
    return max(1, (options.router_deliveries if system.fast_fanout else options.deliveries) // subscribers)


def fanout_cases(options: Options) -> list[Case]:
    cases = []
    for subscribers in options.subscribers:
        topic = f"fanout/{subscribers}"

        def jobs(system: System, subscribers=subscribers, topic=topic):
            publishes = fanout_publishes(options, system, subscribers)
            connections = [{"url": url_of(system, i), "name": f"bench/s{i}", "topics": [topic]} for i in range(subscribers)]
            out = [("subscribers", {"connections": group, "expected": len(group) * publishes})
                   for group in split(connections, options.procs)]
            out.append(("publishers", {"connections": [{"url": url_of(system, 0), "name": "bench/p", "topics": [topic]}],
                                       "messages": publishes, "window": options.window}))
            return out

        cases.append(Case("fanout", f"S={subscribers}", "deliveries/s", jobs, _rate_row("deliveries/s")))
    return cases


def topics_cases(options: Options) -> list[Case]:
    topics = [f"topics/{i}" for i in range(options.topics)]
    per_topic = options.topic_subscribers * options.topics_per_subscriber // options.topics
    rounds = max(1, options.deliveries // (per_topic * options.topics * options.topic_publishers))
    per_publisher = rounds * options.topics  # each publisher cycles over every topic ``rounds`` times

    def jobs(system: System):
        subscribers = [{"url": url_of(system, i), "name": f"bench/s{i}",
                        "topics": [topics[(i + k * (options.topics // options.topics_per_subscriber)) % options.topics]
                                   for k in range(options.topics_per_subscriber)]}
                       for i in range(options.topic_subscribers)]
        expected_per_topic = per_publisher // options.topics * options.topic_publishers
        out = [("subscribers", {"connections": group, "expected": sum(len(c["topics"]) for c in group) * expected_per_topic})
               for group in split(subscribers, options.procs)]
        publishers = [{"url": url_of(system, i), "name": f"bench/p{i}", "topics": topics[i:] + topics[:i]}
                      for i in range(options.topic_publishers)]
        out += [("publishers", {"connections": group, "messages": per_publisher, "window": options.window})
                for group in split(publishers, options.procs)]
        return out

    case = f"{options.topics} topics x {per_topic} subs, {options.topic_publishers} pubs"
    return [Case("topics", case, "deliveries/s", jobs, _rate_row("deliveries/s"))]


def p2p_cases(options: Options) -> list[Case]:
    per_sender = max(1, options.p2p_messages // options.pairs)

    def jobs(system: System):
        receivers = [{"url": url_of(system, i), "name": f"bench/r{i}", "register": True} for i in range(options.pairs)]
        senders = [{"url": url_of(system, i + 1), "name": f"bench/q{i}", "target": f"bench/r{i}"}
                   for i in range(options.pairs)]
        out = [("subscribers", {"connections": group, "expected": len(group) * per_sender})
               for group in split(receivers, options.procs)]
        out += [("publishers", {"connections": group, "messages": per_sender, "window": options.window})
                for group in split(senders, options.procs)]
        return out

    return [Case("p2p", f"{options.pairs} pairs", "messages/s", jobs, _rate_row("messages/s"))]


# -- latency -----------------------------------------------------------------------------------

def latency_cases(options: Options) -> list[Case]:
    messages = int(options.rate * options.latency_seconds)

    def jobs(system: System):
        connections = [{"url": url_of(system, i), "name": f"bench/l{i}", "topics": ["latency"]}
                       for i in range(options.latency_subscribers)]
        out = [("subscribers", {"connections": group, "expected": len(group) * messages, "latency": True})
               for group in split(connections, options.procs)]
        out.append(("publishers", {"connections": [{"url": url_of(system, 0), "name": "bench/lp", "topics": ["latency"]}],
                                   "messages": messages, "rate": options.rate, "window": options.window}))
        return out

    def summarise(system: System, results: list[dict[str, Any]], measured: dict[str, Any]) -> dict[str, Any]:
        return latency_row([r for r in results if r["role"] == "Subscribers"])

    case = f"{options.rate:,.0f} msg/s x {options.latency_subscribers} subs"
    return [Case("latency", case, "p99_ms", jobs, summarise)]


def latency_row(receivers: list[dict[str, Any]], shortfall: bool = True) -> dict[str, Any]:
    """A latency case's row from its receivers' results: p99 as the value (none without samples),
    the percentiles, received against expected, and notes (p50, p99.9, and with ``shortfall`` how
    many did not arrive). A dialect's case adds its own fields and notes."""
    figures = percentiles_ms(merged_histogram(r["histogram"] for r in receivers if r.get("histogram")))
    received = sum(r["received"] for r in receivers)
    expected = sum(r["expected"] for r in receivers)
    row = {"value": figures["p99_ms"] if figures["samples"] else None, **figures,
           "received": received, "expected": expected,
           "notes": f"p50 {figures['p50_ms']:.2f} ms, p99.9 {figures['p99.9_ms']:.2f} ms"}
    if shortfall and received < expected:
        row["notes"] += f"; {expected - received:,} not received"
    return row


# -- connections and churn ---------------------------------------------------------------------

def connections_cases(options: Options) -> list[Case]:
    count = options.connections

    def jobs(system: System):
        connections = [{"url": url_of(system, i), "name": f"bench/i{i}"} for i in range(count)]
        return [("idle", {"connections": group, "concurrency": 50}) for group in split(connections, options.procs)]

    def summarise(system: System, results: list[dict[str, Any]], measured: dict[str, Any]) -> dict[str, Any]:
        opened = sum(r.get("open", 0) for r in results)
        before, after = measured["rss_before"], measured["rss_after"]
        per = {role: round((after[role] - before[role]) / max(1, opened)) for role in before}
        row = {"value": per["server"], "open": opened, "rss_before": before, "rss_after": after,
               "bytes_per_connection": per}
        notes = [f"{opened:,} open", f"server RSS {before['server'] / 2**20:,.0f}→{after['server'] / 2**20:,.0f} MiB"]
        if "shards" in per:
            notes.append(f"shards {per['shards']:,} B/conn")
        row["notes"] = ", ".join(notes)
        return row

    return [Case("connections", f"{count:,} idle", "bytes_per_connection", jobs, summarise, memory=True)]


def churn_cases(options: Options) -> list[Case]:
    def jobs(system: System):
        return [("churn", {"urls": system.urls(), "seconds": options.churn_seconds, "cycles": 10**9,
                           "concurrency": options.churn_concurrency}) for _ in range(options.procs)]

    def summarise(system: System, results: list[dict[str, Any]], measured: dict[str, Any]) -> dict[str, Any]:
        cycles, rate = span_rate(results, "cycles")
        errors = sum(r.get("errors", 0) for r in results)
        return {"value": round(rate), "cycles": cycles, "errors": errors,
                "notes": f"{cycles:,} cycles" + (f", {errors:,} errors" if errors else "")}

    case = f"{options.procs * options.churn_concurrency} concurrent"
    return [Case("churn", case, "cycles/s", jobs, summarise)]


PLANS: dict[str, Callable[[Options], list[Case]]] = {
    "fanout": fanout_cases, "topics": topics_cases, "p2p": p2p_cases, "latency": latency_cases,
    "connections": connections_cases, "churn": churn_cases,
}


# -- orchestration -----------------------------------------------------------------------------

class CpuSampler(threading.Thread):
    """Cumulative CPU seconds of groups of processes, sampled every ``interval`` seconds, so CPU%
    is taken over the receivers' busy window only (not over set-up or the final idle wait). A
    process that exits keeps its last value."""

    def __init__(self, groups: dict[str, list[psutil.Process]], interval: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.groups, self.interval = groups, interval
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._last: dict[int, float] = {}
        self._stop_event = threading.Event()

    def _sample(self) -> None:
        totals = {}
        for role, processes in self.groups.items():
            total = 0.0
            for process in processes:
                try:
                    times = process.cpu_times()
                    self._last[process.pid] = times.user + times.system
                except psutil.Error:
                    pass
                total += self._last.get(process.pid, 0.0)
            totals[role] = total
        self.samples.append((time.monotonic(), totals))

    def run(self) -> None:
        while not self._stop_event.is_set():
            self._sample()
            self._stop_event.wait(self.interval)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(5)
        self._sample()

    def percent(self, start: float, end: float) -> dict[str, float]:
        """CPU% per group between the samples closest inside [start, end] (the whole run if too short)."""
        inside = [sample for sample in self.samples if start <= sample[0] <= end]
        if len(inside) < 2 or inside[-1][0] - inside[0][0] < 0.2:
            inside = [self.samples[0], self.samples[-1]]
        (t0, first), (t1, last) = inside[0], inside[-1]
        return {role: cpu_percent(last[role] - first[role], t1 - t0) for role in first}


def _busy_window(results: list[dict[str, Any]], started: float, ended: float) -> tuple[float, float]:
    """When the work happened: receivers' first→last frame, else workers' start→end, else the run."""
    received = [r for r in results if r.get("received")]
    if received:
        return min(r["first"] for r in received), max(r["last"] for r in received)
    spans = [r for r in results if "start" in r and "end" in r]
    if spans:
        return min(r["start"] for r in spans), max(r["end"] for r in spans)
    return started, ended


def _identity(system: System, case: Case) -> dict[str, Any]:
    return {"scenario": case.scenario, "case": case.case, "dialect": case.dialect or "-", "system": system.name,
            "metric": case.metric, **({"compare": case.compare} if case.compare else {})}


def cpus_of(groups: dict[str, list[psutil.Process]]) -> dict[str, list[int]]:
    """The CPUs each role's processes may run on (every thread's), as the case starts."""
    found: dict[str, list[int]] = {}
    for role, processes in groups.items():
        cpus: set[int] = set()
        for process in processes:
            try:
                for thread in process.threads():
                    try:
                        cpus.update(os.sched_getaffinity(thread.id))
                    except OSError:  # the thread ended
                        pass
            except psutil.Error:
                pass
        found[role] = sorted(cpus)
    return found


def run_case(system: System, case: Case, options: Options, loadgen_cpus: set[int] | None) -> dict[str, Any]:
    """Start the case's workers, wait until all are set up, measure while they run, summarise."""
    ctx = mp.get_context("spawn")
    ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    processes = system.server_processes()
    workers = []
    rss_before = {role: rss_bytes(group) for role, group in processes.items()} if case.memory else None
    for index, (role, spec) in enumerate(case.jobs(system)):
        spec = {**spec, "worker": index, "dialect": system.dialect, "config": system.client_config(),
                "ready_timeout": options.timeout,
                "timeout": options.timeout, "idle_s": options.idle_s, "cpus": loadgen_cpus}
        process = ctx.Process(target=loadgen.worker, args=(role, spec, ready, go, results), daemon=True)
        process.start()
        workers.append(process)
    collected: list[dict[str, Any]] = []
    try:
        deadline = time.monotonic() + options.timeout
        try:
            for _ in workers:
                ready.get(timeout=max(1, deadline - time.monotonic()))
        except queue.Empty:
            return {**_identity(system, case), "value": None,
                    "notes": f"load generators not set up in {options.timeout:.0f} s"}
        measured: dict[str, Any] = {}
        if case.memory:
            time.sleep(1.0)  # let the servers finish the last set-ups
            measured["rss_before"] = rss_before
            measured["rss_after"] = {role: rss_bytes(group) for role, group in processes.items()}
        delivered_before = system.delivered() if hasattr(system, "delivered") else None
        logged_before = None
        if getattr(system, "eventlog", False) and hasattr(system, "event_log"):
            # What set-up logged (and what an earlier case that ended early left) is written before
            # the count and the case start; the case's own records once it ends, below.
            system.settle()
            logged_before = system.event_log()
        groups = {**processes, "loadgen": [psutil.Process(worker.pid) for worker in workers]}
        measured["cpus"] = cpus_of(groups)
        sampler = CpuSampler(groups)
        sampler.start()
        started = time.monotonic()
        go.set()
        deadline = started + options.timeout + 30
        while len(collected) < len(workers):
            try:
                collected.append(results.get(timeout=max(0.1, deadline - time.monotonic())))
            except queue.Empty:
                break
        wall = time.monotonic() - started
        sampler.stop()
    finally:
        for process in workers:
            process.join(10)
            if process.is_alive():
                process.kill()
                process.join(5)
    errors = [r["error"] for r in collected if "error" in r]
    row: dict[str, Any] = _identity(system, case)
    if len(collected) < len(workers) or errors:
        row.update(value=None, notes="; ".join(errors[:2]) or f"{len(workers) - len(collected)} workers timed out")
        return row
    row.update(case.summarise(system, collected, measured))
    if delivered_before is not None:  # the gateways' own count of frames written (replies included)
        row["gateway_frames_written"] = system.delivered() - delivered_before
    if logged_before is not None:  # the event log's events of the case, once written, and the records it dropped
        system.settle()
        rows, dropped = system.event_log()
        row["eventlog_rows"], row["eventlog_dropped"] = rows - logged_before[0], dropped - logged_before[1]
        if row["eventlog_dropped"]:
            row["notes"] = "; ".join(filter(None, [row.get("notes"), f"event log dropped {row['eventlog_dropped']:,}"]))
    row["loadgen_processes"] = len(workers)
    if "cpus" in measured:
        row["cpus"] = measured["cpus"]
    if case.memory:  # nothing runs after set-up: CPU would mean nothing
        return row
    busy = _busy_window(collected, started, started + wall)
    cpu = sampler.percent(*busy)
    row["seconds"] = round(busy[1] - busy[0], 2)
    row["server_cpu_pct"] = cpu["server"]
    if "shards" in cpu:
        row["shards_cpu_pct"] = cpu["shards"]
    row["loadgen_cpu_pct"] = cpu["loadgen"]
    return row


def run_system(system: System, cases: list[Case], options: Options, progress: Callable[[str], None]) -> list[dict]:
    """Start ``system``, run every case it accepts against it, stop it."""
    cases = [case for case in cases if system.accepts(case)]
    if not cases:
        return []
    system.start()
    # A pinned single-process server gets one core; the load generators get the others.
    pinned = getattr(system, "cpu", None)
    loadgen_cpus = None
    if pinned is not None:
        loadgen_cpus = set(range(psutil.cpu_count())) - {pinned} or None
    rows = []
    try:
        for index, case in enumerate(cases):
            if case.memory and index > 0:  # memory per connection: on a fresh server, not one grown by earlier cases
                system.stop()
                system.start()
            label = f"{case.scenario} {case.case}: {system.name}" + (f" ({case.dialect})" if case.dialect else "")
            progress(f"{label} ...")
            row = run_case(system.for_case(case), case, options, loadgen_cpus)
            progress(f"{label}: {row.get('value')} {case.metric}"
                     f"{'  (' + row['notes'] + ')' if row.get('notes') else ''}")
            rows.append(row)
    finally:
        system.stop()
    return rows
