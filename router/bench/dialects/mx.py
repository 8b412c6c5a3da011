"""mx-notifier hub in ``router bench``: a MultiversX node's blocks in, filtered event streams out.

Own scenario ``ingest``: ``mx.consumers`` hub consumers on ``/hub/ws`` (a quarter each with an
``All``, ``Identifier``, ``Address`` and ``Topics`` filter) while a node role, in a process of its
own, pushes ``mx.blocks`` generated SaveBlocks of ``mx.transactions`` transactions to the node
ingest, stop-and-wait as a node's outport driver does (the next block goes once the previous one
is acknowledged; no ACK within ``mx.ack_timeout`` seconds: the block is sent again, under a new
counter, at most ``mx.attempts`` times), then a FinalizedBlock as the end marker. The figure is
log events ingested per second: the events of the acknowledged blocks over the time from the
first push to the last consumer seeing the end marker. Each consumer's frame count is set against
what its filter selects from the generated blocks, computed here without the router's index.

Consumers count frames by their headers and recognise the end marker by the topic bytes at the
start of the frame (the hub writes the topic before the payload), so the load generator decodes
nothing on the hot path. A case that stalls says what stalled: the node's wait for an ACK, a
consumer the router closed (with its close code and reason), frames missing, or consumers that
saw no frame for ``mx.stall`` seconds.

Own scenario ``latency``: the same consumers while the node pushes ``mx.rate`` blocks/s for
``mx.latency_seconds``, every event's data stamped with its block's intended send time; the
consumers record push → frame for every event frame (p50, p99, p99.9; the figure is p99).

Shared scenarios: ``connections`` (each idle consumer holds one ``Address`` filter of its own)
and ``churn`` (connect, subscribe, close).

Parameters (``--param mx.KEY=VALUE``): ``consumers`` (100), ``blocks`` (600, ingest),
``transactions`` (50 per block, about 157 log events), ``seed`` (1), ``rate`` (20 blocks/s,
latency), ``latency_seconds`` (10), ``ack_timeout`` (5 s), ``attempts`` (3), ``stall`` (20 s).
"""

from __future__ import annotations

import asyncio
import hashlib
import struct
import time
from dataclasses import dataclass
from typing import Any

from gateways.mx import codec
from router.bench import loadgen
from router.bench.dialects import Profile, register
from router.bench.scenarios import Case, Options, latency_row
from router.bench.wire import Tally, WsClient, client_frame, open_ws

CONSUMERS = 100
BLOCKS = 600
TRANSACTIONS = 50
SEED = 1
ACK_TIMEOUT_S = 5.0
ATTEMPTS = 3
STALL_S = 20.0
RATE = 20.0  # the latency case: blocks/s
LATENCY_S = 10.0
KINDS = ("All", "Identifier", "Address", "Topics")
COUNTING = "mx-count"  # a consumer's mode after set-up: frames counted by header, end marker spotted
NODE_ROLE = "mx-node"
CONSUMER_ROLE = "mx-consumers"


# -- the profile -------------------------------------------------------------------------------

class MxProfile(Profile):
    name = "mx"
    shared = ("connections", "churn")

    def settings(self) -> dict[str, Any]:
        # The hub only: a deployment in front of a node serves nothing else. The node role pushes
        # (server mode: the node dials us). A consumer's queue and the gateway's total hold a whole
        # run's frames: the node's ACK does not wait for consumers, so while they catch up frames
        # wait in the gateway; a shed consumer would measure these limits, not the hub.
        return {
            "mx": {"max_queue_depth": 10_000_000, "max_queued_total": 100_000_000, "ingest": {"mode": "server"}},
            **{name: {"enabled": False} for name in ("signal", "nolag", "cashu", "baqend")},
        }

    def prepare(self, settings: Any) -> dict[str, Any]:
        """The node's credential when the router wants one (``mx.node_token``, from the config file
        or the environment), and where the ingest is when the gateways' endpoints do not say."""
        token = settings.mx.node_token
        return {
            "node_token": None if token is None else token.get_secret_value(),
            "ingest_path": settings.mx.ingest.path,
            "ingest_port": settings.mx.ingest.port,
        }

    def plans(self) -> dict[str, Any]:
        return {"ingest": ingest_cases, "latency": latency_cases}


# -- what the generated blocks hold, and what each filter selects ------------------------------

@dataclass(frozen=True)
class Filter:
    level: str
    address: str = ""
    identifier: str = ""
    topics: tuple[bytes, ...] = ()

    def selects(self, event: Any) -> bool:
        """The hub spec's match levels, written out plainly (the router uses an index)."""
        if self.level == "All":
            return True
        if self.level == "Address":
            return event.address == self.address
        if self.level == "Identifier":
            return event.identifier == self.identifier
        if event.address != self.address or event.identifier != self.identifier:
            return False
        return len(self.topics) <= len(event.topics) and all(
            want == have for want, have in zip(self.topics, event.topics))


@dataclass
class Workload:
    """The run's blocks summed up: events per block, and the frames each filter kind receives."""

    events: list[int]  # log events per block
    filters: dict[str, Filter]
    frames: dict[str, int]  # frames a consumer of each kind receives, the end marker included


_WORKLOADS: dict[tuple[int, int, int], Workload] = {}


def workload(seed: int, blocks: int, transactions: int) -> Workload:
    """Filters taken from the first block (its first event's address; a topic of an event that has
    one); identifiers recur in every block, addresses rarely. Every consumer with a filter gets the
    end marker; only ``All`` gets each block's transactions and SCRs."""
    key = (seed, blocks, transactions)
    if key in _WORKLOADS:
        return _WORKLOADS[key]
    from gateways.mx import generator, node

    filters: dict[str, Filter] = {}
    frames = dict.fromkeys(KINDS, 1)
    events = []
    for index in range(blocks):
        saved = node.normalize_save_block(generator.generate_save_block(seed + index, transactions=transactions))
        if not filters:
            first = saved.events[0]
            with_topics = next(event for event in saved.events if event.topics and event.topics[0])
            filters = {
                "All": Filter("All"),
                "Identifier": Filter("Identifier", identifier="ESDTTransfer"),
                "Address": Filter("Address", address=first.address),
                "Topics": Filter("Topics", with_topics.address, with_topics.identifier,
                                 (bytes(with_topics.topics[0]),)),
            }
        events.append(len(saved.events))
        for kind, selector in filters.items():
            frames[kind] += sum(1 for event in saved.events if selector.selects(event))
        frames["All"] += bool(saved.txs.txs) + bool(saved.scrs.scrs)
    _WORKLOADS[key] = found = Workload(events, filters, frames)
    return found


# -- load-generator side: consumers ------------------------------------------------------------

# A PAYLOAD frame's topic field (field 5: tag, length, text) follows version, with_acknowledge,
# the counter (at most 15 bytes together) and the type (2 bytes): the end marker is found there.
FINAL_MARK = b"\x2a" + bytes([len(codec.FINALIZED_TOPIC)]) + codec.FINALIZED_TOPIC.encode()
MARK_WITHIN = 24 + len(FINAL_MARK)
# The latency case's send-time stamp in each event's data: this prefix, then 19 digits of
# ``time.monotonic_ns`` (shared by every process of the machine). Nothing else a block holds has it.
STAMP = b"@bench-sent:"
STAMP_DIGITS = 19


class MxClient(WsClient):
    """A hub consumer (or the node: ``headers`` carry its token). Set-up in CONTROL mode; then a
    consumer (``COUNTING``) counts frames by their headers and finds the end marker, the only
    ``finalized_events`` frame of a run, by its topic bytes near the frame's start. A close frame
    from the router is kept (code, reason): it says why a consumer was shed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.frames = 0
        self.ended = 0.0  # when the end marker came
        self.latencies: list[int] | None = None  # the latency case: push → frame, microseconds
        self.close_code: int | None = None
        self.close_reason = ""

    def data_received(self, data: bytes) -> None:
        if self.mode != COUNTING:
            super().data_received(data)
            return
        buffer = self.buffer
        buffer += data
        size, position, frames = len(buffer), 0, 0
        latencies = self.latencies
        now_ns = time.monotonic_ns() if latencies is not None else 0
        while size - position >= 2:
            length = buffer[position + 1] & 0x7F
            start = position + 2
            if length == 126:
                if size - position < 4:
                    break
                length = (buffer[position + 2] << 8) | buffer[position + 3]
                start = position + 4
            elif length == 127:
                if size - position < 10:
                    break
                length = int.from_bytes(buffer[position + 2:position + 10], "big")
                start = position + 10
            end = start + length
            if end > size:
                break
            opcode = buffer[position] & 0x0F
            if opcode == 0x2 or opcode == 0x1:
                frames += 1
                if buffer.find(FINAL_MARK, start, min(end, start + MARK_WITHIN)) >= 0:
                    self.ended = time.monotonic()
                elif latencies is not None:
                    at = buffer.find(STAMP, start, end)
                    if at >= 0:
                        at += len(STAMP)
                        latencies.append((now_ns - int(buffer[at:at + STAMP_DIGITS])) // 1000)
            elif opcode == 0x9:
                self.transport.write(client_frame(bytes(buffer[start:end]), 0xA))
            elif opcode == 0x8:
                self._closed_by_server(bytes(buffer[start:end]))
            position = end
        if position:
            del buffer[:position]
        if frames:
            self.frames += frames
            self.tally.add(frames, time.monotonic())

    def _closed_by_server(self, payload: bytes) -> None:
        self.close_code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else 1005
        self.close_reason = payload[2:].decode(errors="replace")
        self.transport.close()

    @property
    def done(self) -> bool:
        return bool(self.ended) or self.closed.done()


async def open_client(url: str, tally: Tally | None = None, headers: str = "") -> MxClient:
    """The hub and the ingest are binary-only: the client sends binary frames."""
    return await open_ws(url, tally, opcode=0x2, headers=headers, client_class=MxClient)


async def subscribe(client: MxClient, filters: list[Filter]) -> None:
    """Each filter in a ``subscribe`` frame that asks for an ACK; the ACKs say they are in place."""
    from gateways.mx.pb import mx_hub_pb2

    for counter, selector in enumerate(filters, start=1):
        payload = codec.subscribe_payload(selector.level, selector.address, selector.identifier, selector.topics)
        client.send(codec.payload_frame(counter, codec.SUBSCRIBE_TOPIC, payload, True))
    for counter, reply in enumerate(await client.messages(len(filters)), start=1):
        ack = mx_hub_pb2.WsMessage.FromString(reply)
        if ack.type != codec.ACK or ack.counter != counter:
            raise RuntimeError(f"subscribe {counter} not acknowledged: {ack}")


def _address(name: str) -> str:
    from gateways.mx.bech32 import encode_address

    return encode_address(hashlib.sha256(name.encode()).digest())


class MxDialect(loadgen.Dialect):
    """Consumers only (blocks come from a node, not from clients): an idle consumer holds an
    ``Address`` filter of its own; a subscription to shared topics is an ``Identifier`` filter each."""

    name = "mx"

    async def open(self, url: str, tally: Tally | None = None) -> MxClient:
        return await open_client(url, tally)

    async def hello(self, client: MxClient, name: str) -> None:
        await subscribe(client, [Filter("Address", address=_address(name))])

    async def subscribe(self, client: MxClient, name: str, topics: list[str]) -> None:
        await subscribe(client, [Filter("Identifier", identifier=topic) for topic in topics])


class MxConsumers(loadgen.Subscribers):
    """Consumers of the ingest and latency cases: each subscribes (one filter), then counts until
    every one has the end marker or was closed, nothing arrived for ``stall_s``, or the time bound."""

    @staticmethod
    async def setup(dialect: loadgen.Dialect, spec: dict[str, Any]) -> dict[str, Any]:
        tally = loadgen.new_tally(spec)
        histogram = tally.histogram

        async def one(entry: dict[str, Any]) -> MxClient:
            client = await open_client(entry["url"], tally)
            await subscribe(client, [Filter(*entry["filter"])])
            if histogram is not None:
                client.latencies = tally.latencies
            client.mode = COUNTING
            return client

        clients = await loadgen.gather_bounded([lambda e=e: one(e) for e in spec["connections"]])
        return {"clients": clients, "tally": tally}

    @staticmethod
    async def run(dialect: loadgen.Dialect, spec: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
        clients: list[MxClient] = state["clients"]
        tally: Tally = state["tally"]
        started = time.monotonic()
        deadline = started + spec["timeout"] - 2
        stalled = False
        while not all(client.done for client in clients) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
            if time.monotonic() - (tally.last or started) > spec["stall_s"]:
                stalled = True
                break
        ended = [client.ended for client in clients]
        result = {
            "received": tally.count, "expected": sum(entry["expected"] for entry in spec["connections"]),
            "first": tally.first or started, "last": max(ended) if all(ended) else (tally.last or started),
            "consumers": [{"index": entry["index"], "kind": entry["kind"], "received": client.frames,
                           "expected": entry["expected"], "ended": client.ended,
                           "close": None if client.close_code is None and not client.closed.done()
                           else [client.close_code, client.close_reason]}
                          for entry, client in zip(spec["connections"], clients)],
            "stalled": round(time.monotonic() - (tally.last or started), 1) if stalled else None,
        }
        if tally.histogram is not None:
            result["histogram"] = tally.histogram_now().encode()
        return result


# -- load-generator side: the node -------------------------------------------------------------

def ingest_url(config: dict[str, Any]) -> str:
    """The node ingest's URL: the ``mx-node`` route of the first gateway that serves it, or the
    configured path on the ingest's own port, else on the first hub listener's port."""
    for gateway in config.get("endpoints", []):
        for listener in gateway["listeners"]:
            path = listener["websocket"].get("mx-node")
            if path is not None:
                return f"ws://127.0.0.1:{listener['port']}{path}"
    port = config.get("ingest_port")
    if port is None:
        hub = [listener for gateway in config.get("endpoints", []) for listener in gateway["listeners"]
               if "mx" in listener["websocket"]]
        if not hub:
            raise RuntimeError("no gateway serves the mx hub: the node has nowhere to push")
        port = hub[0]["port"]
    return f"ws://127.0.0.1:{port}{config['ingest_path']}"


class MxNode:
    """A node's outport driver: SaveBlocks then a FinalizedBlock, each sent once the previous one is
    acknowledged; no ACK within ``ack_timeout_s``: sent again under a new counter, at most
    ``attempts`` times, then the node gives up (and says so). With ``rate``: a block every
    ``1 / rate`` s (later if its predecessor's ACK is late), each of its events' data the block's
    intended send time (:data:`STAMP`), so consumers measure push → frame without coordinated
    omission."""

    @staticmethod
    async def setup(dialect: loadgen.Dialect, spec: dict[str, Any]) -> dict[str, Any]:
        from gateways.mx import generator

        seed, blocks, transactions = spec["seed"], spec["blocks"], spec["transactions"]
        saved = [generator.generate_save_block(seed + index, transactions=transactions) for index in range(blocks)]
        payloads = None if spec.get("rate") else [generator.save_block_payload(block) for block in saved]
        token = dialect.config.get("node_token")
        headers = f"Authorization: Bearer {token}\r\n" if token else ""
        client = await open_client(ingest_url(dialect.config), headers=headers)
        return {"client": client, "blocks": saved, "payloads": payloads}

    @staticmethod
    async def run(dialect: loadgen.Dialect, spec: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
        from gateways.mx import generator, node

        client: MxClient = state["client"]
        blocks: list[Any] = state["blocks"]
        payloads: list[bytes] | None = state["payloads"]
        ack_timeout, attempts = spec["ack_timeout_s"], spec["attempts"]
        interval_ns = int(1e9 / spec["rate"]) if spec.get("rate") else 0
        deadline = time.monotonic() + spec["timeout"] - 2
        waits: list[float] = []  # seconds from a block's first send to its ACK
        counter = resends = stray = 0
        stall = None
        slowest = (0.0, "")
        started_ns = time.monotonic_ns() + (10_000_000 if interval_ns else 0)
        for index in range(len(blocks) + 1):
            what = f"block {index + 1}" if index < len(blocks) else "the FinalizedBlock (end marker)"
            if interval_ns:
                due_ns = started_ns + index * interval_ns
                delay = due_ns - time.monotonic_ns()
                if delay > 0:
                    await asyncio.sleep(delay / 1e9)
            if index == len(blocks):
                topic, payload = node.FINALIZED_BLOCK, generator.finalized_payload(blocks[-1])
            elif payloads is not None:
                topic, payload = node.SAVE_BLOCK, payloads[index]
            else:
                topic, payload = node.SAVE_BLOCK, generator.save_block_payload(stamped(blocks[index], due_ns))
            sent_first = time.monotonic()
            mine: set[int] = set()
            acknowledged = False
            for attempt in range(attempts):
                if client.closed.done():
                    break
                counter += 1
                mine.add(counter)
                resends += attempt > 0
                client.send(node.encode_node_frame(topic, payload, counter))
                due = min(time.monotonic() + ack_timeout, deadline)
                try:
                    while not acknowledged:
                        reply = (await client.messages(1, max(0.01, due - time.monotonic())))[0]
                        ack = node.decode_node_frame(reply)
                        if ack.type == node.ACK and ack.counter in mine:
                            acknowledged = True
                        else:
                            stray += 1
                except asyncio.TimeoutError:
                    if time.monotonic() >= deadline:
                        break
                except ConnectionError:
                    break
                if acknowledged:
                    break
            waited = time.monotonic() - sent_first
            if not acknowledged:
                stall = (f"node connection closed while waiting {waited:.1f} s for the ACK of {what}"
                         if client.closed.done() else
                         f"node waited {waited:.1f} s for the ACK of {what} (sent {len(mine)}x), then gave up")
                break
            waits.append(waited)
            if waited > slowest[0]:
                slowest = (waited, what)
        ended = time.monotonic()
        finalized = len(waits) == len(blocks) + 1
        ordered = sorted(waits)

        def percentile(point: float) -> float | None:
            return round(ordered[min(len(ordered) - 1, int(point / 100 * len(ordered)))] * 1000, 2) if ordered else None

        return {"start": started_ns / 1e9, "end": ended, "blocks_acked": len(waits) - finalized,
                "finalized": finalized, "frames_sent": counter, "resends": resends, "stray_replies": stray,
                "stall": stall, "slowest_ack": f"{slowest[0]:.1f} s for the ACK of {slowest[1]}" if slowest[1] else "",
                "ack_wait_ms": {"p50": percentile(50), "p99": percentile(99),
                                "max": round(ordered[-1] * 1000, 2) if ordered else None}}

    @staticmethod
    def close(state: dict[str, Any]) -> None:
        state["client"].close()


def stamped(block: Any, due_ns: int) -> Any:
    """``block`` with every event's data set to the send-time stamp (the block is the node's own copy)."""
    stamp = STAMP + b"%019d" % due_ns
    for log_data in block.TransactionPool.Logs:
        for event in log_data.Log.Events:
            event.Data = stamp
    return block


loadgen.DIALECTS["mx"] = MxDialect
loadgen.ROLES[CONSUMER_ROLE] = MxConsumers
loadgen.ROLES[NODE_ROLE] = MxNode


# -- the ingest case ---------------------------------------------------------------------------

def _deal(entries: list[dict[str, Any]], parts: int) -> list[list[dict[str, Any]]]:
    """Consumers into ``parts`` processes a group of every kind at a time, so each process holds
    busy (All) consumers and its silence means a stall, not a quiet filter."""
    parts = max(1, min(parts, len(entries)))
    groups: list[list[dict[str, Any]]] = [[] for _ in range(parts)]
    for entry in entries:
        groups[(entry["index"] // len(KINDS)) % parts].append(entry)
    return [group for group in groups if group]


@dataclass(frozen=True)
class Run:
    """What a case pushes and who consumes it (``--param mx.*``)."""

    consumers: int
    blocks: int
    transactions: int
    seed: int
    ack_timeout: float
    attempts: int
    stall: float
    rate: float | None = None  # blocks/s (the latency case); None: as fast as the ACKs come

    @classmethod
    def from_options(cls, options: Options, blocks: int, rate: float | None = None) -> "Run":
        return cls(options.param("mx.consumers", CONSUMERS), blocks, options.param("mx.transactions", TRANSACTIONS),
                   options.param("mx.seed", SEED), options.param("mx.ack_timeout", ACK_TIMEOUT_S, float),
                   options.param("mx.attempts", ATTEMPTS), options.param("mx.stall", STALL_S, float), rate)

    @property
    def work(self) -> Workload:
        return workload(self.seed, self.blocks, self.transactions)

    def jobs(self, system: Any, procs: int) -> list[tuple[str, dict[str, Any]]]:
        work = self.work
        urls = system.urls()
        entries = []
        for index in range(self.consumers):
            kind = KINDS[index % len(KINDS)]
            selector = work.filters[kind]
            entries.append({"url": urls[index % len(urls)], "index": index, "kind": kind, "expected": work.frames[kind],
                            "filter": (selector.level, selector.address, selector.identifier, selector.topics)})
        out = [(CONSUMER_ROLE, {"connections": group, "stall_s": self.stall, "latency": self.rate is not None})
               for group in _deal(entries, procs)]
        out.append((NODE_ROLE, {"seed": self.seed, "blocks": self.blocks, "transactions": self.transactions,
                                "ack_timeout_s": self.ack_timeout, "attempts": self.attempts, "rate": self.rate}))
        return out


def ingest_cases(options: Options) -> list[Case]:
    """As fast as the node's ACKs come: log events ingested per second."""
    run = Run.from_options(options, options.param("mx.blocks", BLOCKS))

    def summarise(system: Any, results: list[dict[str, Any]], measured: dict[str, Any]) -> dict[str, Any]:
        return ingest_row(run.work, run.consumers, results)

    case = f"{run.consumers} consumers, {run.blocks} blocks x {run.transactions} txs"
    return [Case("ingest", case, "events/s", lambda system: run.jobs(system, options.procs), summarise)]


def latency_cases(options: Options) -> list[Case]:
    """Blocks at a fixed rate (``mx.rate`` blocks/s for ``mx.latency_seconds``): push → frame
    percentiles over every event frame every consumer receives."""
    rate = options.param("mx.rate", RATE, float)
    seconds = options.param("mx.latency_seconds", LATENCY_S, float)
    run = Run.from_options(options, max(1, round(rate * seconds)), rate)

    def summarise(system: Any, results: list[dict[str, Any]], measured: dict[str, Any]) -> dict[str, Any]:
        row = ingest_row(run.work, run.consumers, results)
        latency = latency_row([r for r in results if r["role"] == MxConsumers.__name__], shortfall=False)
        figures = {key: value for key, value in latency.items() if key.endswith("_ms") or key == "samples"}
        row.update(value=latency["value"] if row["complete"] else None, events_per_s=row["value"], **figures)
        row["notes"] = f"{latency['notes']}, {latency['samples']:,} samples; " + row["notes"]
        return row

    case = f"{rate:g} blocks/s x {run.transactions} txs, {run.consumers} consumers"
    return [Case("latency", case, "p99_ms", lambda system: run.jobs(system, options.procs), summarise)]


def ingest_row(work: Workload, consumers: int, results: list[dict[str, Any]]) -> dict[str, Any]:
    """The row: events ingested/s, blocks/s, frames/s, per-kind frames against the expected, the
    node's ACK waits, and what stalled if anything did.

    The figure stands when the node had every block acknowledged and every consumer has the end
    marker or was closed by the router (the notes say which); otherwise it is None and the notes
    say what stalled."""
    pushed = next(r for r in results if r["role"] == MxNode.__name__)
    receivers = [r for r in results if r["role"] == MxConsumers.__name__]
    each = sorted((c for r in receivers for c in r["consumers"]), key=lambda c: c["index"])
    received = sum(r["received"] for r in receivers)
    expected = sum(r["expected"] for r in receivers)
    ended = [c["ended"] for c in each if c["ended"]]
    closed = [c for c in each if c["close"] is not None and not c["ended"]]
    waiting = [c for c in each if not c["ended"] and c["close"] is None]
    complete = pushed["finalized"] and not waiting and bool(ended)
    finish = max(ended) if complete else max(r["last"] for r in receivers)
    seconds = max(1e-9, finish - pushed["start"])
    blocks = pushed["blocks_acked"]
    events = sum(work.events[:blocks])
    kinds = {}
    for kind in KINDS:
        mine = [c["received"] for c in each if c["kind"] == kind]
        if mine:
            kinds[kind] = {"consumers": len(mine), "expected_each": work.frames[kind],
                           "received_min": min(mine), "received_max": max(mine)}
    waits = pushed["ack_wait_ms"]
    row: dict[str, Any] = {
        "value": round(events / seconds) if complete else None, "blocks_per_s": round(blocks / seconds, 1),
        "frames_per_s": round(received / seconds), "received": received, "expected": expected,
        "events": events, "blocks": blocks, "consumers": consumers, "by_filter": kinds,
        "ack_wait_ms": waits, "node_resends": pushed["resends"], "node_gave_up": pushed["stall"] is not None,
        "consumers_closed": len(closed), "node_push_seconds": round(pushed["end"] - pushed["start"], 2),
        "end_seconds": round(seconds, 2), "complete": complete,
    }
    notes = [f"{events:,} events in {blocks} blocks, {received:,} frames",
             f"ack p50 {waits['p50']} ms, p99 {waits['p99']} ms, max {waits['max']} ms"]
    if pushed["resends"]:
        notes.append(f"node resent {pushed['resends']} frame(s); it waited {pushed['slowest_ack']}")
    if pushed["stall"]:
        notes.append(pushed["stall"])
    for consumer in closed[:3]:
        code, reason = consumer["close"]
        how = f"closed by the router: {code} {reason}".rstrip() if code is not None else "lost its connection"
        notes.append(f"consumer {consumer['index']} ({consumer['kind']}) {how}")
    if len(closed) > 3:
        notes.append(f"{len(closed) - 3} more consumers closed")
    if waiting:
        silent = [r["stalled"] for r in receivers if r["stalled"] is not None]
        stuck = ", ".join(f"{c['index']} ({c['kind']}) at {c['received']:,} of {c['expected']:,}" for c in waiting[:3])
        notes.append(f"{len(waiting)} consumers without the end marker"
                     + (f" after {max(silent)} s without a frame" if silent else " at the time bound")
                     + f": {stuck}" + (", ..." if len(waiting) > 3 else ""))
    short = [c for c in each if c["received"] != c["expected"]]
    if short:
        missing = sum(c["expected"] - c["received"] for c in short)
        notes.append(f"{missing:,} frames missing over {len(short)} consumers" if missing > 0
                     else f"{-missing:,} frames more than expected over {len(short)} consumers")
    row["notes"] = "; ".join(notes)
    return row


register(MxProfile())
