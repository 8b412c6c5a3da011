"""Baqend real-time queries in ``router bench``: writes matched against live queries.

A Baqend client holds real-time queries over a WebSocket (``/v1/events``) and writes through the
REST API; every write is matched against every live query of its bucket and reaches each query it
changes as a ``match`` event. So the figure that matters is how many writes per second the router
matches and delivers with many queries live, and whether that holds as queries are added.

Own scenarios:

- ``queries`` (flooded): Q live queries (one case per Q and round) over ``connections`` connections on one
  bucket; query *i* is ``{"g": i % groups}`` with ``groups`` = Q / ``matches``, so every write matches
  ``matches`` queries; the first query of each group (one in ``matches``) is sorted by ``n`` with a
  limit of 10. Then a writer process (its own keep-alive HTTP/1.1 connections) inserts ``writes``
  documents, ``inflight`` at a time; write *w* has ``g`` = w % groups and ``n`` = w, so it lands on
  top of its sorted window: ``add/insert``, and once the window is full also ``remove/none`` for the
  document pushed out. Every frame is counted (exactly: those removes are known in advance).
  value = matched writes/s: writes / (first write → last expected event); also events/s, and the
  CPU each write cost the gateway and each kind of shard (µs per matched write).
- ``latency`` (paced): ``rate`` writes/s for ``seconds`` with ``latency_queries`` queries, each
  document carrying its intended send time (``@<19 digits>``); the receivers record write → event for
  every ``add/insert``. value = p99 ms.

Beside them, ``router bench matching`` runs the query shards' matching alone, in this process,
as the queries grow (below, "the matching alone").

Shared: ``connections`` (no hello) and ``churn`` (a subscribe = a real-time query answered by its
``result``).

``--param`` keys (defaults): ``baqend.queries`` (1000,2000,5000,10000: the curve), ``baqend.connections`` (10),
``baqend.matches`` (10), ``baqend.writes`` (20000), ``baqend.inflight`` (128: REST requests in
flight), ``baqend.rest_connections`` (128: the writer's connections; ``inflight`` is pipelined over
them), ``baqend.rate`` (1000), ``baqend.seconds`` (10), ``baqend.latency_queries`` (1000),
``baqend.rounds`` (3: the curve's rounds, forward and backward in turn).

The curve's target (:func:`curve`, after the table): each point the median of its runs (its
rounds, and any ``--repeat``); the matching is flat when the query shards' µs a write at the most
queries is within +10 % of that at the fewest. One run of a point moves by about a tenth from one
to the next on a 2-CPU VM, as much as the target's margin: hence three rounds by default (with
``baqend.rounds=1`` the figure says it was judged on one run each).
Shards: 2 document and 2 query shards (the default count; ``ROUTER_SHARDS__DOCUMENT`` and
``ROUTER_SHARDS__QUERY`` change them), 1 session and 1 topic shard; the other dialects are off.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import json
import statistics
import time
from typing import Any

import psutil

from actors.baqend.contract import Write
from actors.baqend.documents import reader
from actors.baqend.livequeries import QuerySpec, QueryTable
from router.bench import loadgen
from router.bench.dialects import Profile, register
from router.bench.scenarios import Case, Options, latency_row, scalar, split, url_of
from router.bench.wire import COUNT, HANDLE, WsClient, stamp

SORTED_LIMIT = 10  # the window of the sorted queries
CHURN_BUCKET = "Churn"
INSERT = b'"operation":"insert"'
RESULT = b'"type":"result"'


class BaqendProfile(Profile):
    name = "baqend"
    shared = ("connections", "churn")

    def settings(self) -> dict[str, Any]:
        unlimited = 10**9
        return {
            # document and query shards: the default count (2), so ROUTER_SHARDS__* may change them
            "shards": {"session": 1, "topic": 1},
            "signal": {"enabled": False}, "cashu": {"enabled": False}, "mx": {"enabled": False},
            "nolag": {"enabled": False},
            # Every client is 127.0.0.1: one client to the per-client limits, which a benchmark
            # would meet long before the router's capacity.
            "baqend": {"max_subscriptions": unlimited, "max_client_subscriptions": unlimited,
                       "subscribe_rate_limit_per_minute": 1e12, "subscribe_rate_limit_burst": unlimited,
                       "rest_rate_limit_per_minute": 1e12, "rest_rate_limit_burst": unlimited,
                       "ping_interval_s": 1800, "idle_timeout_s": 3600},
        }

    def prepare(self, settings: Any) -> dict[str, Any]:
        return {"rest_path": settings.baqend.rest_path}

    def plans(self) -> dict[str, Any]:
        return {"queries": queries_cases, "latency": latency_cases}

    def summaries(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return curve(rows)


register(BaqendProfile())


# -- plans -------------------------------------------------------------------------------------

class Layout:
    """Who holds which query, and what each write causes: query *i* is ``{"g": i % groups}`` on
    connection ``i * connections // queries``; the first of each group is sorted (``n``
    descending, limit 10); write *w* has ``g`` = w % groups and ``n`` = w."""

    def __init__(self, bucket: str, queries: int, connections: int, matches: int) -> None:
        if queries % matches:
            raise SystemExit(f"router bench: baqend.queries {queries} is not a multiple of baqend.matches {matches}")
        self.bucket, self.queries, self.matches = bucket, queries, matches
        self.connections = max(1, min(connections, queries))
        self.groups = queries // matches

    def group(self, query: int) -> int:
        return query % self.groups

    def is_sorted(self, query: int) -> bool:
        return query < self.groups

    def held_by(self, connection: int) -> range:
        return range(connection * self.queries // self.connections, (connection + 1) * self.queries // self.connections)

    def writes_to(self, group: int, writes: int) -> int:
        return writes // self.groups + (1 if group < writes % self.groups else 0)

    def frames(self, query: int, writes: int) -> int:
        """Match frames ``writes`` inserts send to ``query`` (a full sorted window adds a remove)."""
        hits = self.writes_to(self.group(query), writes)
        return hits + max(0, hits - SORTED_LIMIT) if self.is_sorted(query) else hits

    def receivers(self, system: Any, bucket: str, writes: int, procs: int, latency: bool,
                  pids: dict[str, list[int]]) -> list[tuple[str, dict[str, Any]]]:
        connections = [{"url": url_of(system, index),
                        "queries": [[query, self.group(query), self.is_sorted(query)] for query in self.held_by(index)]}
                       for index in range(self.connections)]
        out = []
        for group in split(connections, procs):
            held = [query for entry in group for query, _, _ in entry["queries"]]
            if latency:  # only add/insert counts: each write once per query it matches
                expected = sum(self.writes_to(self.group(query), writes) for query in held)
            else:
                expected = sum(self.frames(query, writes) for query in held)
            out.append(("baqend_receivers", {"connections": group, "bucket": bucket, "expected": expected,
                                             "latency": latency, "pids": pids}))
        return out


def _params(options: Options) -> dict[str, Any]:
    queries = options.param("baqend.queries", [1000, 2000, 5000, 10_000])
    return {
        "queries": queries if isinstance(queries, list) else [queries],
        "connections": options.param("baqend.connections", 10),
        "matches": options.param("baqend.matches", 10),
        "writes": options.param("baqend.writes", 20_000),
        # A flood from many writers, each with one request out, as many app clients write (the
        # gateway answers a connection's pipelined requests one after another, like any HTTP/1.1
        # server, so requests pipelined over fewer connections are fewer in flight).
        "inflight": options.param("baqend.inflight", 128),
        "rest_connections": options.param("baqend.rest_connections", 128),
        "rate": options.param("baqend.rate", 1000.0, float),
        "seconds": options.param("baqend.seconds", 10.0, float),
        "latency_queries": options.param("baqend.latency_queries", 1000),
        "rounds": scalar(options, "baqend.rounds", 3),
    }


def _server_pids(system: Any) -> dict[str, list[int]]:
    """The router's processes by role: its gateways, and its shards by kind (``query``: the matching)."""
    router = getattr(system, "router", None)
    if router is None:
        return {}
    import ray

    pids = {"gateway": list(system.gateway_pids)}
    for kind, shards in router.shards.items():
        pids[kind] = [info["pid"] for info in ray.get([shard.info.remote() for shard in shards], timeout=30)]
    return pids


def _jobs(system: Any, layout: Layout, params: dict[str, Any], writes: int, rate: float | None,
          procs: int) -> list[tuple[str, dict[str, Any]]]:
    """The receivers (holding the queries) and the writer; each reads the router's CPU (the
    writer as it starts, a receiver as it ends) so a case tells what a write cost. Each run of a
    case has a bucket of its own: a repeat (``--repeat``) starts empty, as the first run did, and
    does not load the documents of the run before it into its queries' initial results."""
    pids = _server_pids(system)
    bucket = f"{layout.bucket}_{next(_RUNS)}"
    writer = {"bucket": bucket, "groups": layout.groups, "writes": writes, "rate": rate,
              "inflight": params["inflight"], "rest_connections": params["rest_connections"], "pids": pids}
    return [*layout.receivers(system, bucket, writes, procs, rate is not None, pids), ("baqend_writer", writer)]


_RUNS = itertools.count(1)


def _role(results: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [r for r in results if r["role"] == name]


def _shortfall(received: int, expected: int, writer: dict[str, Any], idle_s: float) -> list[str]:
    """What stalled, if anything: writes refused or unanswered, events not received."""
    notes = []
    if writer["answered"] < writer["sent"]:
        notes.append(f"{writer['sent'] - writer['answered']:,} of {writer['sent']:,} writes unanswered")
    if writer["refused"]:
        notes.append("writes refused: " + ", ".join(f"{count:,} x {status}"
                                                     for status, count in sorted(writer["refused"].items())))
    if received < expected:
        notes.append(f"{expected - received:,} of {expected:,} events not received "
                     f"(receivers stop {idle_s:g} s after their last event)")
    return notes


def curve_order(queries: list[int], rounds: int) -> list[tuple[int, int, int]]:
    """(round, position in the curve, queries) of every case: the curve forward in odd rounds and
    backward in even ones, so a drift of the machine over the run weighs on both ends alike."""
    order = []
    for round_ in range(1, rounds + 1):
        points = list(enumerate(queries))
        order += [(round_, position, each) for position, each in (points if round_ % 2 else points[::-1])]
    return order


def queries_cases(options: Options) -> list[Case]:
    params = _params(options)
    writes, rounds = params["writes"], params["rounds"]
    cases = []
    for round_, position, queries in curve_order(params["queries"], rounds):
        layout = Layout(f"Queries{queries}_{position}", queries, params["connections"], params["matches"])

        def jobs(system: Any, layout: Layout = layout) -> list[tuple[str, dict[str, Any]]]:
            return _jobs(system, layout, params, writes, None, options.procs)

        def summarise(system: Any, results: list[dict[str, Any]], measured: dict[str, Any],
                      layout: Layout = layout) -> dict[str, Any]:
            writer = _role(results, "RestWriter")[0]
            receivers = _role(results, "QueryReceivers")
            received = sum(r["received"] for r in receivers)
            expected = sum(r["expected"] for r in receivers)
            heard = [r for r in receivers if r["received"]]
            span = max(r["last"] for r in heard) - writer["start"] if heard else 0.0
            matched = writer["answered"] - sum(writer["refused"].values())
            row: dict[str, Any] = {
                "value": round(matched / span) if span > 0 else None,
                "received": received, "expected": expected, "writes": matched, "queries": layout.queries,
                "connections": layout.connections, "matches_per_write": layout.matches,
                "events_per_s": round(received / span) if span > 0 else None,
                "write_seconds": round(span, 3),
            }
            last = max(receivers, key=lambda r: r["finished"])
            cpu = {kind: round((last["cpu"][kind] - writer["cpu"][kind]) / max(1, matched) * 1e6, 1)
                   for kind in writer["cpu"]}
            if cpu:
                row["cpu_us_per_write"] = cpu
                row["shards_cpu_us_per_write"] = round(sum(v for k, v in cpu.items() if k != "gateway"), 1)
            notes = [f"{row['events_per_s'] or 0:,} events/s"]
            if cpu:
                notes.append(f"shards {row['shards_cpu_us_per_write']:,.0f} µs/write "
                             f"(query {cpu.get('query', 0):,.0f}), gateway {cpu['gateway']:,.0f} µs/write")
            row["notes"] = ", ".join(notes + _shortfall(received, expected, writer, options.idle_s))
            return row

        case = f"{queries:,} queries x {layout.connections} conns, {writes:,} writes"
        if rounds > 1:
            case += f", round {round_}"
        cases.append(Case("queries", case, "matched writes/s", jobs, summarise))
    return cases


FLAT_MAX = 1.10  # flat: the matching's µs a write at the most queries within +10 % of that at the fewest


def curve(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``queries`` scenario's curve on each router system of the run (``router``, or e.g.
    ``router g2/s2`` with ``--scale``), each point the median of its runs (its rounds, and any
    ``--repeat``): the query shards' µs a write (the matching), the gateway's, matched writes/s;
    and whether the matching is flat from the fewest queries to the most (:data:`FLAT_MAX`). A
    run that failed (no value, no CPU read) is left out; a system with fewer than two numbers of
    queries measured has no curve."""
    by_system: dict[str, dict[int, list[dict[str, Any]]]] = {}
    for row in rows:
        cpu = row.get("cpu_us_per_write") or {}
        if (row["scenario"] == "queries" and row.get("dialect") == "baqend" and row["system"].startswith("router")
                and row.get("value") and cpu.get("query") and "gateway" in cpu):
            by_system.setdefault(row["system"], {}).setdefault(row["queries"], []).append(row)
    return [_curve(system, by_queries) for system, by_queries in by_system.items() if len(by_queries) >= 2]


def _curve(system: str, by_queries: dict[int, list[dict[str, Any]]]) -> dict[str, Any]:
    points = []
    for queries in sorted(by_queries):
        measured = by_queries[queries]
        points.append({
            "queries": queries, "runs": len(measured),
            "query_us_per_write": statistics.median(row["cpu_us_per_write"]["query"] for row in measured),
            "runs_query_us_per_write": [row["cpu_us_per_write"]["query"] for row in measured],
            "gateway_us_per_write": statistics.median(row["cpu_us_per_write"]["gateway"] for row in measured),
            "matched_writes_per_s": statistics.median(row["value"] for row in measured),
        })
    first, last = points[0], points[-1]
    growth = last["query_us_per_write"] / first["query_us_per_write"]
    throughput = last["matched_writes_per_s"] / first["matched_writes_per_s"]
    counts = " / ".join(f"{point['queries']:,}" for point in points)
    fewest, most = min(point["runs"] for point in points), max(point["runs"] for point in points)
    runs = ("one run each" if most == 1 else f"medians of {most} runs" if fewest == most
            else f"medians of {fewest} to {most} runs")
    figure = (" / ".join(f"{point['query_us_per_write']:g}" for point in points) + f" µs a write at {counts} queries"
              + f" ({(growth - 1) * 100:+.1f} %), matched writes/s at {last['queries']:,} {throughput * 100:.0f} %"
              + f" of those at {first['queries']:,} ({runs})")
    on = "" if system == "router" else f" ({system})"
    return {"name": f"Baqend matching cost flat from {first['queries']:,} to {last['queries']:,} queries{on} "
                    f"(query shards' µs a write within +{(FLAT_MAX - 1) * 100:.0f} %)",
            "system": system, "figure": figure, "met": growth <= FLAT_MAX, "growth": growth,
            "throughput": throughput, "points": points}


def latency_cases(options: Options) -> list[Case]:
    params = _params(options)
    rate, queries = params["rate"], params["latency_queries"]
    writes = max(1, int(rate * params["seconds"]))
    layout = Layout("Latency", queries, params["connections"], params["matches"])

    def jobs(system: Any) -> list[tuple[str, dict[str, Any]]]:
        return _jobs(system, layout, params, writes, rate, options.procs)

    def summarise(system: Any, results: list[dict[str, Any]], measured: dict[str, Any]) -> dict[str, Any]:
        writer = _role(results, "RestWriter")[0]
        receivers = _role(results, "QueryReceivers")
        row = latency_row(receivers, shortfall=False)
        row.update(writes=writer["answered"], queries=queries, offered_writes_per_s=rate)
        row["notes"] = ", ".join([row["notes"], *_shortfall(row["received"], row["expected"], writer, options.idle_s)])
        return row

    case = f"{rate:,.0f} writes/s x {queries:,} queries"
    compare = f"{options.rate:,.0f} msg/s x {options.latency_subscribers} subs"  # Signal Hub's latency case
    return [Case("latency", case, "p99_ms", jobs, summarise, compare=compare)]


# -- load generators ---------------------------------------------------------------------------

def _subscribe_frame(sub_id: str, bucket: str, query: dict[str, Any], ordered: bool = False) -> bytes:
    message: dict[str, Any] = {"id": sub_id, "type": "subscribe", "bucket": bucket, "initial": True,
                               "query": json.dumps(query, separators=(",", ":"))}
    if ordered:
        message.update(sort='{"n":-1}', limit=SORTED_LIMIT)
    return json.dumps(message, separators=(",", ":")).encode()


async def _await_results(client: WsClient, count: int, timeout: float) -> None:
    """Every subscribe is answered by its ``result`` (``initial``), or refused with an error."""
    replies = await client.messages(count, timeout)
    refused = next((reply for reply in replies if RESULT not in reply), None)
    if refused is not None:
        raise RuntimeError(f"subscribe refused: {refused[:300]!r}")


class BaqendDialect(loadgen.Dialect):
    """A real-time query client: no hello; a subscription is a query answered by its result."""

    name = "baqend"

    async def subscribe(self, client: WsClient, name: str, topics: list[str]) -> None:
        for index, topic in enumerate(topics):
            client.send(_subscribe_frame(f"{name}/{index}", CHURN_BUCKET, {"topic": topic}))
        await _await_results(client, len(topics), 30)


def _cpu_seconds(pids: dict[str, list[int]]) -> dict[str, float]:
    """Cumulative CPU seconds of the router's processes, by role (a process gone counts nothing)."""
    out = {}
    for role, group in pids.items():
        total = 0.0
        for pid in group:
            try:
                times = psutil.Process(pid).cpu_times()
                total += times.user + times.system
            except psutil.Error:
                pass
        out[role] = total
    return out


class QueryReceivers(loadgen.Subscribers):
    """Connections holding real-time queries; they count the match frames (``COUNT``), or, for
    latency, each ``add/insert`` and its write's send time (``HANDLE``). They stop at ``expected``,
    an idle gap after the first frame, or the time bound; then they read the router's CPU."""

    @staticmethod
    async def setup(dialect: loadgen.Dialect, spec: dict[str, Any]) -> dict[str, Any]:
        tally = loadgen.new_tally(spec)
        histogram = tally.histogram

        def record(payload: bytes) -> int:
            if INSERT not in payload:
                return 0  # a window's remove: it carries an older document's stamp
            tally.record_stamps(payload, time.monotonic_ns())
            return 1

        async def one(entry: dict[str, Any]) -> WsClient:
            client = await dialect.open(entry["url"], tally)
            for query, group, ordered in entry["queries"]:
                client.send(_subscribe_frame(f"q{query}", spec["bucket"], {"g": group}, ordered))
            await _await_results(client, len(entry["queries"]), spec["ready_timeout"])
            if histogram is not None:
                client.handler = record
            dialect.listen(client, HANDLE if histogram is not None else COUNT)
            return client

        clients = await asyncio.gather(*(one(entry) for entry in spec["connections"]))
        return {"clients": clients, "tally": tally}

    @staticmethod
    async def run(dialect: loadgen.Dialect, spec: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
        result = await loadgen.Subscribers.run(dialect, spec, state)
        result.update(finished=time.monotonic(), cpu=_cpu_seconds(spec["pids"]))
        return result


class RestConnection(asyncio.Protocol):
    """A keep-alive HTTP/1.1 client connection: requests are pipelined, each answer is read by
    its head (status, ``Content-Length``) and handed to ``answered(connection, status)``."""

    def __init__(self, answered: Any) -> None:
        self.answered = answered
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.lost = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(exc)

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer
        buffer += data
        while True:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(buffer[:end]).lower()
            length = 0
            at = head.find(b"\r\ncontent-length:")
            if at >= 0:
                stop = head.find(b"\r\n", at + 2)
                length = int(head[at + 17:stop if stop >= 0 else end])
            if len(buffer) < end + 4 + length:
                return
            del buffer[:end + 4 + length]
            self.answered(self, int(head[9:12]))

    def send(self, request: bytes) -> None:
        self.transport.write(request)

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()


class RestWriter:
    """REST inserts into one bucket: a flood (``inflight`` unanswered at most, pipelined over
    ``rest_connections``), or at ``rate`` writes/s each stamped with its intended send time. Write
    *w* is ``{"id": "/db/<bucket>/w<w>", "g": w % groups, "n": w}`` (+ ``"s"``: the stamp)."""

    @staticmethod
    async def setup(dialect: loadgen.Dialect, spec: dict[str, Any]) -> dict[str, Any]:
        config = spec["config"]
        loop = asyncio.get_running_loop()
        state: dict[str, Any] = {"answered": 0, "refused": {}, "next": 0, "done": loop.create_future()}
        bases = config["http"]
        rest_path = config["rest_path"].rstrip("/")
        count = max(1, min(spec["rest_connections"], spec["inflight"]))
        connections, heads = [], {}

        def answered(connection: RestConnection, status: int) -> None:
            state["answered"] += 1
            if status != 201:
                state["refused"][status] = state["refused"].get(status, 0) + 1
            if spec["rate"] is None and state["next"] < spec["writes"]:
                RestWriter.write(state, connection, state["next"])
                state["next"] += 1
            if state["answered"] >= spec["writes"] and not state["done"].done():
                state["done"].set_result(None)

        for index in range(count):
            host, _, port = bases[index % len(bases)].split("://", 1)[1].rstrip("/").rpartition(":")
            _, connection = await asyncio.wait_for(
                loop.create_connection(lambda: RestConnection(answered), host, port), 30)
            connections.append(connection)
            heads[connection] = (f"POST {rest_path}/db/{spec['bucket']} HTTP/1.1\r\nHost: {host}:{port}\r\n"
                                 "Content-Type: application/json\r\nContent-Length: ").encode()
        state.update(connections=connections, heads=heads, bucket=spec["bucket"].encode(), groups=spec["groups"])
        return state

    @staticmethod
    def write(state: dict[str, Any], connection: RestConnection, w: int, sent_at: str = "") -> None:
        body = b'{"id":"/db/%s/w%d","g":%d,"n":%d%s}' % (
            state["bucket"], w, w % state["groups"], w, f',"s":"{sent_at}"'.encode() if sent_at else b"")
        connection.send(b"%s%d\r\n\r\n%s" % (state["heads"][connection], len(body), body))

    @staticmethod
    async def run(dialect: loadgen.Dialect, spec: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
        writes, connections = spec["writes"], state["connections"]
        cpu = _cpu_seconds(spec["pids"])
        started = time.monotonic()
        if spec["rate"] is None:
            first = min(writes, spec["inflight"])
            for w in range(first):
                RestWriter.write(state, connections[w % len(connections)], w)
            state["next"] = first
        else:
            async for w, due in loadgen.paced(writes, spec["rate"]):
                RestWriter.write(state, connections[w % len(connections)], w, stamp(due))
            state["next"] = writes
        try:  # bounded: what was not answered in time is reported, not waited for
            await asyncio.wait_for(asyncio.shield(state["done"]),
                                   max(1.0, spec["timeout"] - 2 - (time.monotonic() - started)))
        except asyncio.TimeoutError:
            pass
        return {"sent": state["next"], "answered": state["answered"], "refused": state["refused"],
                "start": started, "end": time.monotonic(), "cpu": cpu}

    @staticmethod
    def close(state: dict[str, Any]) -> None:
        for connection in state.get("connections", ()):
            connection.close()


# -- the matching alone: router bench matching ------------------------------------------------
#
# What matching writes against live queries costs the query shards as the queries grow, in this
# process: no sockets, no hops, only ``QueryTable.apply`` (``actors/baqend/livequeries.py``).
#
# The layout is the ``queries`` scenario's (:class:`Layout`): query *i* is
# ``{"g": i % groups}`` with ``groups`` = Q / ``matches``, the first of each group sorted by ``n``
# descending with a limit of 10; write *w* inserts ``g`` = w % groups, ``n`` = w, so it matches
# ``matches`` queries. The queries are spread over ``shards`` tables, as over the router's query
# shards, and every write goes to each. Each group gets ``per_group`` writes whatever Q is, so each
# query's state (its matching documents, its sorted list) is the same size at every Q and only the
# number of queries changes; the documents grow with Q (200 a group: 20,000 at 1,000 queries,
# 200,000 at 10,000). With ``writes``, the writes (so the documents) are the same at every Q, as in
# the ``queries`` scenario (20,000), spread over the groups: each query's state shrinks as Q grows.
#
#     router bench matching [--param baqend.queries=1000,2000,5000,10000,20000]
#                           [--param baqend.per_group=200 | --param baqend.writes=20000]
#                           [--param baqend.matches=10] [--param baqend.order=round,grouped]
#                           [--param baqend.runs=3]
#
# value: µs of one core per write over all the tables, the least of ``MATCHING_RUNS`` runs (or
# ``--param baqend.runs=N``), run in rounds of every case.
#
# ``order``: ``round`` (the default, as the ``queries`` scenario writes) sends consecutive writes to
# consecutive groups, so a write finds its group's state as the other groups' writes left the
# CPU's caches; ``grouped`` sends the same writes with a group's in a row (its state stays in the
# caches). The steps per write are the same in both: what ``grouped`` takes is the matching's own
# cost, what ``round`` adds is the memory of a state not touched for Q / ``matches`` writes.

MATCHING_RUNS = 3
MATCHING_BATCH = 16  # writes per batch, about what a document shard forwards under a flood
MATCHING_SHARDS = 2


def _matching_tables(layout: Layout, shards: int) -> list[QueryTable]:
    tables = [QueryTable() for _ in range(shards)]
    for query in range(layout.queries):
        group = layout.group(query)
        if layout.is_sorted(query):
            spec = QuerySpec("Bench", {"g": group}, sort={"n": -1}, limit=SORTED_LIMIT)
        else:
            spec = QuerySpec("Bench", {"g": group})
        table, key = tables[query % shards], f"q{query}"
        # As the query shard adds a subscription: with its reader (the queries scenario's
        # subscribers are anonymous).
        table.add(key, ("bench", query % 10), key, spec, reader(frozenset()))
        table.load(key)
    return tables


MATCHING_ORDERS = ("round", "grouped")


def matching_measure(queries: int, per_group: int, matches: int, shards: int = MATCHING_SHARDS,
                     order: str = "round", writes: int | None = None) -> dict[str, Any]:
    """One run: the tables built, then every write applied; µs per write and events per write.
    ``per_group`` writes to each group, or ``writes`` in all (spread over the groups) when given."""
    if order not in MATCHING_ORDERS:
        raise SystemExit(f"router bench: baqend.order {order!r} is not one of {', '.join(MATCHING_ORDERS)}")
    layout = Layout("Bench", queries, 10, matches)
    tables = _matching_tables(layout, shards)
    count = per_group * layout.groups if writes is None else writes
    numbers = range(count)  # write n goes to group n % groups, its k-th write is n = k * groups + group
    if order == "grouped":  # the same writes, a group's in a row
        numbers = sorted(numbers, key=lambda n: (n % layout.groups, n))
    inserts = [Write("Bench", None, {"id": f"/db/Bench/{n:09d}", "version": 1, "acl": None, "g": layout.group(n),
                                     "n": n}, "insert", seq, None)
               for seq, n in enumerate(numbers, 1)]
    gc.collect()
    started = time.perf_counter()
    for start in range(0, count, MATCHING_BATCH):
        batch = inserts[start:start + MATCHING_BATCH]
        for table in tables:
            table.apply(0, "bench", batch)
    elapsed = time.perf_counter() - started
    events = sum(table.events for table in tables)
    return {"queries": queries, "order": order, "writes": count, "us_per_write": elapsed / count * 1e6,
            "events_per_write": events / count}


def matching_run(queries: list[int], per_group: int, matches: int, runs: int = MATCHING_RUNS,
                 orders: tuple[str, ...] = ("round",), writes: int | None = None) -> list[dict[str, Any]]:
    """The least of ``runs`` runs of each (order, Q). The runs go in rounds, each round every
    case once: the caches of this machine's cores are shared with whatever else runs on its host,
    so a busy spell slows one round of every case instead of every run of one case."""
    cases = [(order, each) for order in orders for each in queries]
    results: dict[tuple[str, int], list[dict[str, Any]]] = {case: [] for case in cases}
    for round_ in range(runs):
        for order, each in cases:
            result = matching_measure(each, per_group, matches, order=order, writes=writes)
            results[(order, each)].append(result)
            print(f"  round {round_ + 1}/{runs}: {each:>7,} queries ({order}) {result['us_per_write']:6.1f} µs a write",
                  flush=True)
    rows = []
    for order, each in cases:
        runs_of = results[(order, each)]
        best = min(runs_of, key=lambda result: result["us_per_write"])
        row = {**best, "us_per_write": round(best["us_per_write"], 2),
               "runs_us_per_write": [round(result["us_per_write"], 2) for result in runs_of],
               "events_per_write": round(best["events_per_write"], 3)}
        print(f"{each:>7,} queries ({order}): {row['us_per_write']:6.1f} µs a write "
              f"(runs {', '.join(f'{value:.1f}' for value in row['runs_us_per_write'])}), "
              f"{row['writes']:,} writes, {row['events_per_write']:.2f} events a write", flush=True)
        rows.append(row)
    return rows


loadgen.DIALECTS["baqend"] = BaqendDialect
loadgen.ROLES["baqend_receivers"] = QueryReceivers
loadgen.ROLES["baqend_writer"] = RestWriter
