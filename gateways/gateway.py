"""The gateway: listeners, connections, the shard client and delivery fan-out.

:class:`Gateway` is plain asyncio code; :class:`GatewayActor` runs it inside an async Ray actor
(Ray runs async actors on uvloop when it is installed). A gateway holds no routing state: if it
dies, its clients reconnect elsewhere and the supervisor tells the shards to forget it.
"""

from __future__ import annotations

import asyncio
import gc
import ipaddress
import logging
import os
import time
from typing import Any

import orjson
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from websockets.protocol import OPEN

from actors.eventwriter import EventLogWriterActor
from gateways.addresses import address_key
from gateways.dialect import HttpRequest, HttpResponse, HttpRoute
from gateways.dialects import build_dialects, shard_kinds
from gateways.server import Connection, Listener, frame_header, joined_frames
from gateways.shardclient import DeliverySequencer, ShardClient
from router.settings import RouterSettings
from router import contract
from router.contract import DELIVER_EVENT, DELIVER_EVENTS, DELIVER_TEXT
from router.eventlog import EventLog
from router.metrics import GatewayMetrics
from router.proc import raise_open_file_limit, tune_gc, tune_malloc
from router.shardmap import shard_name

logger = logging.getLogger(__name__)

_TEXT_OPCODE = 0x1
_BINARY_OPCODE = 0x2


def _run_end(items: list, index: int) -> int:
    """Where the run that ``items[index]`` starts ends: the deliveries after it of the same kind to
    the same group object (a topic shard keeps a topic's routes as one tuple, and a bundle's pickle
    keeps one object as one)."""
    kind, _, group, _ = items[index]
    end = index + 1
    while end < len(items) and items[end][2] is group and items[end][0] == kind:
        end += 1
    return end


def _flush_each(connections: list[Connection]) -> None:
    """Write what each of ``connections`` holds; one that fails is logged, the others still go."""
    for connection in connections:
        try:
            connection.flush()
        except Exception:
            logger.exception("connection %s: write failed", connection.id)


class Gateway:
    def __init__(
        self,
        gateway_id: str,
        index: int,
        settings: RouterSettings,
        shard_handles: dict[str, list[tuple[str, Any]]],
        loop: asyncio.AbstractEventLoop,
        event_writer: Any = None,
        node_id: str | None = None,
    ) -> None:
        self.id = gateway_id
        self.node_id = node_id
        self.index = index
        self.settings = settings
        self.loop = loop
        self.connections: dict[int, Connection] = {}
        self._per_ip: dict[str, int] = {}
        self._exempt = [ipaddress.ip_network(net, strict=False) for net in settings.gateway.connection_limit_exempt]
        self.refused_connections = {"max_connections": 0, "max_connections_per_ip": 0}
        self._corked: list[Connection] = []
        self._next_connection_id = 0
        tuning = settings.gateway
        self.shards = ShardClient(
            gateway_id,
            shard_handles,
            loop,
            self.deliver,
            batch_max=tuning.batch_max,
            max_inflight=tuning.max_inflight_batches,
            timeout_s=tuning.request_timeout_s,
            on_backlog=self._backlog,
            max_pending=tuning.max_pending_commands,
        )
        self.shards.on_restart = self._shard_restarted
        self.shards.writes = self
        self.sequencer = DeliverySequencer(self._apply, tuning.reorder_timeout_s, loop,
                                           tuning.max_deliveries_per_turn, self.shards.pause_lanes)
        analytics = settings.analytics
        self.events = (
            EventLog(settings.events_dir, gateway_id, analytics.sample_rate, analytics.retention_hours, event_writer,
                     analytics.max_rejected_per_flush, analytics.max_unwritten_records)
            if analytics.enabled else None
        )
        self.metrics = GatewayMetrics(gateway_id) if settings.metrics.enabled else None
        if self.metrics is not None:
            self.shards.on_batch = self.metrics.batch
        self._seq = 0
        self.dialects = build_dialects(self, settings)
        self.listeners: list[Listener] = []
        self.started_at = time.time()
        self.delivered = 0
        # Deliveries of one message that a dialect wrote one connection at a time (its own frames),
        # accounted as one fan-out group at the end of the loop turn: (meta, bytes, connection ids).
        self._group: tuple[tuple, int, list[int]] | None = None
        self.undeliverable = 0
        self._sweeper: asyncio.Task | None = None
        self._reading_paused = False

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self, previous_ports: list[int] | None = None) -> dict[str, Any]:
        """Open the main port (port + index) and each dialect's own port; returns what listens where.

        ``previous_ports``: the ports of the gateway this one replaces, in the same order. Where the
        configured port is 0 (any), the replacement takes the port its predecessor had, so that its
        clients reconnect where they were; a fresh one if that port is taken meanwhile."""
        if self.settings.gateway.lanes and self.node_id is not None:
            await self.shards.open_lanes(self.node_id)
        else:
            await self.shards.learn_epochs()
        host = self.settings.host
        routes = [HttpRoute("GET", "/health", self._health)]
        for dialect in self.dialects:
            routes.extend(dialect.http_routes())
        shared = [d for d in self.dialects if d.port is None]
        plan = [(self._port(self.settings.port), shared, routes)]
        for dialect in self.dialects:
            if dialect.port is not None:
                plan.append((self._port(dialect.port), [dialect], [HttpRoute("GET", "/health", self._health)]))
        previous = previous_ports or ()
        for number, (port, dialects, http_routes) in enumerate(plan):
            listener = Listener(host, port, dialects, http_routes)
            if port == 0 and number < len(previous) and previous[number]:
                try:
                    listener.server = await self._listen(listener, host, previous[number])
                except OSError as error:
                    logger.warning("port %d of the gateway this one replaces is taken (%s): listening on a new one",
                                   previous[number], error.strerror or error)
            if listener.server is None:
                listener.server = await self._listen(listener, host, port)
            listener.port = listener.server.sockets[0].getsockname()[1]
            self.listeners.append(listener)
        if self.events is not None:
            await asyncio.wrap_future(self.events.warm_up())
        for dialect in self.dialects:
            await dialect.start()
        self._sweeper = self.loop.create_task(self._sweep())
        return self.describe()

    async def _listen(self, listener: Listener, host: str, port: int) -> asyncio.Server:
        return await self.loop.create_server(
            lambda: Connection(self, listener), host, port, reuse_address=True, backlog=4096
        )

    def _shard_restarted(self, link: Any) -> None:
        """A shard came back empty: each dialect's sessions re-announce what they held there."""
        for dialect in self.dialects:
            try:
                dialect.shard_restarted(link)
            except Exception:
                logger.exception("%s: re-announcing to %s failed", dialect.name, link.name)

    def _port(self, base: int) -> int:
        return 0 if base == 0 else base + self.index

    def describe(self) -> dict[str, Any]:
        return {
            "gateway": self.id,
            "host": self.settings.host,
            "listeners": [
                {"port": listener.port, "websocket": {d.name: path for path, d in listener.ws_routes.items()}}
                for listener in self.listeners
            ],
        }

    async def flush_events(self) -> int:
        """Write the buffered event-log records now, and wait for the writes already under way (a
        periodic flush's); returns the events written so far."""
        if self.events is None:
            return 0
        pending = self.events.flush_all()
        if pending is not None:
            await asyncio.wrap_future(pending)
        return self.events.events_written

    async def stop(self, timeout: float = 3.0) -> None:
        """Stop accepting, close every WebSocket with 1001, and wait for them to go."""
        for listener in self.listeners:
            if listener.server is not None:
                listener.server.close()
        for connection in list(self.connections.values()):
            if connection.ws is not None:
                connection.close(1001, "router shutting down")
            else:
                connection.abort()
        deadline = time.monotonic() + timeout
        while self.connections and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        for connection in list(self.connections.values()):
            connection.abort()
        if self._sweeper is not None:
            self._sweeper.cancel()
        for dialect in self.dialects:
            try:
                await dialect.close()
            except Exception:
                logger.exception("dialect %s: closing failed", dialect.name)
        self.sequencer.close()
        self.shards.close()
        if self.events is not None:
            await self.loop.run_in_executor(None, self.events.close)

    # -- connections ----------------------------------------------------------------------

    def close_connections(self, dialect: str | None, code: int, reason: str) -> int:
        closing = [c for c in self.connections.values()
                   if c.ws is not None and (dialect is None or (c.dialect is not None and c.dialect.name == dialect))]
        for connection in closing:
            connection.close(code, reason)
        return len(closing)

    def admit(self, host: str) -> tuple[int, bytes] | None:
        """Refuse a new socket over ``max_connections`` or ``max_connections_per_ip``: (status, body)."""
        limits = self.settings.gateway
        if len(self.connections) >= limits.max_connections:
            self.refused_connections["max_connections"] += 1
            return 503, b'{"error":"too_many_connections","message":"this gateway is at max_connections"}'
        key = self.address_key(host)
        if key is not None and self._per_ip.get(key, 0) >= limits.max_connections_per_ip:
            self.refused_connections["max_connections_per_ip"] += 1
            return 429, b'{"error":"too_many_connections","message":"too many connections from this address"}'
        return None

    def address_key(self, host: str) -> str | None:
        """The client ``host`` counts as for per-address limits; None when exempt (``gateways/addresses.py``)."""
        return address_key(host, self._exempt)

    def add_connection(self, connection: Connection, host: str = "") -> int:
        self._next_connection_id += 1
        self.connections[self._next_connection_id] = connection
        connection.host = key = self.address_key(host)
        if key is not None:
            self._per_ip[key] = self._per_ip.get(key, 0) + 1
        if self._reading_paused:
            connection.transport.pause_reading()
        return self._next_connection_id

    def cork(self, connection: Connection) -> None:
        """``connection`` holds frames to write at the end of this loop turn: one callback for all
        the connections of a turn (a fan-out to 100 corks 100), not one each."""
        corked = self._corked
        if not corked:
            self.loop.call_soon(self._uncork_all)
        corked.append(connection)

    def _uncork_all(self) -> None:
        corked, self._corked = self._corked, []
        _flush_each(corked)

    def remove_connection(self, connection: Connection) -> None:
        if self.connections.pop(connection.id, None) is None or connection.host is None:
            return
        count = self._per_ip.get(connection.host, 0) - 1
        if count > 0:
            self._per_ip[connection.host] = count
        else:
            self._per_ip.pop(connection.host, None)

    @property
    def reading_paused(self) -> bool:
        return self._reading_paused

    def _backlog(self, backlogged: bool) -> None:
        """Too many commands wait for shards: stop reading sockets until they drain."""
        self._reading_paused = backlogged
        for connection in self.connections.values():
            connection.update_reading()

    async def _sweep(self) -> None:
        interval = self.settings.gateway.sweep_interval_s
        flush_every = self.settings.analytics.flush_interval_s
        publish_every = self.settings.metrics.interval_s
        last_flush = last_publish = time.monotonic()
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for connection in list(self.connections.values()):
                try:
                    connection.tick(now)
                except Exception:
                    logger.exception("connection %s: timer failed", connection.id)
            if self.events is not None and now - last_flush >= flush_every:
                last_flush = now
                self.events.flush()
            if self.metrics is not None and now - last_publish >= publish_every:
                last_publish = now
                self._publish_metrics()
            self.shards.poll_epochs()

    def _publish_metrics(self) -> None:
        by_dialect = {d.name: 0 for d in self.dialects}
        outbound = 0
        for connection in self.connections.values():
            if connection.dialect is not None:
                by_dialect[connection.dialect.name] += 1
                outbound += connection.outbound_bytes()
        try:
            self.metrics.publish(by_dialect, outbound)
        except Exception:
            logger.exception("publishing metrics failed")

    # -- what dialects report about the messages they receive -----------------------------

    def next_seq(self) -> int:
        """The router's id of a message entering through this gateway (with the gateway id)."""
        self._seq += 1
        return self._seq

    def event_meta(self, dialect: str, kind: str | None = None, topic: str | None = None) -> tuple:
        """The meta of a message entering now (``router.contract.EventMeta``)."""
        return contract.event_meta(self.id, self.next_seq(), time.time_ns(), dialect, kind, topic)

    def accepted(self, meta: tuple, protocol_id: Any, nbytes: int, connection_id: int) -> None:
        _, seq, ingress_ns, dialect, _, _ = meta
        metrics = self.metrics
        if metrics is not None:
            metrics.messages_in[dialect] += 1
            metrics.bytes_in[dialect] += nbytes
        events = self.events
        if events is not None and (events.sample_every == 1 or events.sampled(seq)):
            events.ingress(ingress_ns, meta, None if protocol_id is None else str(protocol_id), nbytes, connection_id)

    def accepted_row(self, dialect: str, kind: str, sizes: list[int], connection_id: int) -> None:
        """Frames of ``sizes`` bytes that entered one after the other on one connection, each
        accepted as :meth:`accepted` would take it (its own ``seq``; kind ``kind``, no topic, no
        protocol id), with one clock read for all of them."""
        metrics = self.metrics
        if metrics is not None:
            metrics.messages_in[dialect] += len(sizes)
            metrics.bytes_in[dialect] += sum(sizes)
        events = self.events
        ingress_ns = time.time_ns()
        origin = self.id
        for nbytes in sizes:
            self._seq += 1
            seq = self._seq
            if events is not None and (events.sample_every == 1 or events.sampled(seq)):
                events.ingress(ingress_ns, (origin, seq, ingress_ns, dialect, kind, None), None, nbytes, connection_id)

    def rejected(self, meta: tuple, protocol_id: Any, nbytes: int, connection_id: int, reason: str) -> None:
        _, seq, ingress_ns, dialect, _, _ = meta
        metrics = self.metrics
        if metrics is not None:
            metrics.rejections[(dialect, reason)] += 1
        events = self.events
        if events is not None and events.sampled(seq):
            events.rejected(ingress_ns, meta, None if protocol_id is None else str(protocol_id), nbytes, connection_id,
                            reason)

    # -- deliveries from shards -----------------------------------------------------------

    def deliver(self, bundle: tuple) -> None:
        self.sequencer.accept(bundle)

    def corked_count(self) -> int:
        """How many connections hold frames for the end of this turn (a mark for :meth:`write_since`)."""
        return len(self._corked)

    def write_since(self, mark: int) -> None:
        """Write now what the connections corked since ``mark`` hold: the answers of a shard reply
        (e.g. a publish's ack), before the reply's deliveries are applied, so their senders can send
        again while the fan-out is written instead of after it (``ShardClient._drain``). The
        connections corked before (deliveries of earlier replies of this turn) keep theirs for the
        turn's one write."""
        corked = self._corked
        _flush_each(corked[mark:])
        del corked[mark:]

    def unroutable(self, meta: tuple, nbytes: int, reason: str) -> None:
        """An accepted message that could not be routed at all (e.g. its target is unknown)."""
        _, seq, _, dialect, _, _ = meta
        if self.metrics is not None:
            self.metrics.drops[(dialect, reason)] += 1
        events = self.events
        if events is not None and events.sampled(seq):
            events.dropped(time.time_ns(), meta, nbytes, -1, reason)

    def _apply(self, items: list) -> None:
        written: list = []  # frames written to every connection of their group: accounted at the end
        try:
            self._apply_items(items, written)
        finally:
            if written:
                self._account_written(written)

    def _apply_items(self, items: list, written: list) -> None:
        connections = self.connections
        after = -1  # the last item of a run applied ahead (see below)
        single_until = -1  # the last item of a run of frames that goes item by item
        last = len(items) - 1
        for index, (kind, payload, connection_ids, meta) in enumerate(items):
            if index <= after:
                continue
            if kind == DELIVER_EVENT or kind == DELIVER_EVENTS:
                if len(connection_ids) > 1:
                    # A run (e.g. a topic shard's reply to a window of publishes to one topic):
                    # the events go to the dialect together.
                    end = _run_end(items, index) if kind == DELIVER_EVENT else index + 1
                    if end - index > 1:
                        self._fan_out_run([item[1] for item in items[index:end]], connection_ids)
                        after = end - 1
                        continue
                    self._fan_out(payload, connection_ids)
                    continue
                for connection_id in connection_ids:
                    connection = connections.get(connection_id)
                    if connection is not None and connection.session is not None:
                        connection.session.on_event(payload)
                    else:
                        self.undeliverable += contract.event_messages(kind, payload)
                continue
            if index > single_until and index < last and items[index + 1][2] is connection_ids:
                # A run of frames of one kind to the same group (of one connection too: a
                # topic's one subscriber at S=1): joined once, one piece each. (Signal Hub's
                # point-to-point routes are a tuple per message: they never form runs.)
                end = _run_end(items, index)
                if end - index > 1:
                    if self._write_run(items[index:end], kind, connection_ids, written):
                        after = end - 1
                        continue
                    single_until = end - 1
            opcode = _TEXT_OPCODE if kind == DELIVER_TEXT else _BINARY_OPCODE
            frame = frame_header(opcode, len(payload)) + payload  # built once for every recipient
            failed = None
            for connection_id in connection_ids:
                connection = connections.get(connection_id)
                if connection is None or not connection.send_frame(frame, opcode, payload):
                    if failed is None:
                        failed = []
                    failed.append(connection_id)
            if failed is None:
                self.delivered += len(connection_ids)
                written.append((kind, payload, connection_ids, meta))
                continue
            delivered = len(connection_ids) - len(failed)
            self.delivered += delivered
            self.undeliverable += len(failed)
            if meta is not None:
                self._account(meta, len(payload), connection_ids, delivered, failed)

    def _write_run(self, run: list, kind: int, connection_ids: tuple, written: list) -> bool:
        """Frames in a row of one kind for the same connections, when each is there and takes every
        frame as it is (``Connection.takes_frames``): joined once, each connection gets them as
        one piece; each frame accounted as one group, as one at a time would be. False (nothing
        done) otherwise, or when a connection is in the group twice (frame by frame it gets each
        frame twice in a row): then they go one by one."""
        if len(set(connection_ids)) != len(connection_ids):
            return False
        connections = self.connections
        targets = []
        for connection_id in connection_ids:
            connection = connections.get(connection_id)
            if connection is None or not connection.takes_frames():
                return False
            targets.append(connection)
        joined = joined_frames(_TEXT_OPCODE if kind == DELIVER_TEXT else _BINARY_OPCODE, [item[1] for item in run])
        for connection in targets:
            connection.cork_frames(joined)
        self.delivered += len(connection_ids) * len(run)
        written.extend(run)
        return True

    def _account_written(self, written: list) -> None:
        """What :meth:`_account` of each of ``written`` (delivery items whose frame went to every
        connection of their group) does, in one pass: one clock reading, one metrics update per
        dialect in a row, the event-log records in one call. The latency metric (sampled at most
        every 10 ms) gets the first of them, as ``_account`` of each would have given it, timed
        at the end of the pass."""
        now_ns = time.time_ns()
        metrics = self.metrics
        if metrics is not None:
            messages_out, bytes_out = metrics.messages_out, metrics.bytes_out
            dialect, messages, nbytes, first = None, 0, 0, None
            for _, payload, connection_ids, meta in written:
                if meta is None or not connection_ids:
                    continue
                if meta[3] != dialect:
                    if messages:
                        messages_out[dialect] += messages
                        bytes_out[dialect] += nbytes
                    dialect, messages, nbytes = meta[3], 0, 0
                count = len(connection_ids)
                messages += count
                nbytes += count * len(payload)
                if first is None:
                    first = meta
            if messages:
                messages_out[dialect] += messages
                bytes_out[dialect] += nbytes
            if first is not None:
                metrics.latency(first[3], (now_ns - first[2]) / 1e9, time.monotonic())
        events = self.events
        if events is not None:
            events.delivered_items(now_ns, written)

    def account_delivery(self, meta: tuple, nbytes: int, connection_id: int, sent: bool) -> None:
        """A dialect wrote (or failed to write) one delivery of its own making to one connection.

        Written ones of the same message and size in a row (a dialect's fan-out, one recipient at a
        time) become one group, accounted at the end of the loop turn: one metrics update and one
        event-log record per message, as for the gateway's own fan-out, not one per recipient."""
        if sent:
            self.delivered += 1
            group = self._group
            if group is not None and group[0] is meta and group[1] == nbytes:
                group[2].append(connection_id)
                return
            if group is None:
                self.loop.call_soon(self._account_group)
            else:
                self._account(group[0], group[1], tuple(group[2]), len(group[2]), None)
            self._group = (meta, nbytes, [connection_id])
        else:
            self.undeliverable += 1
            self._account(meta, nbytes, (connection_id,), 0, [connection_id])

    def _account_group(self) -> None:
        group, self._group = self._group, None
        if group is not None:
            self._account(group[0], group[1], tuple(group[2]), len(group[2]), None)

    def account_deliveries(self, meta: tuple, nbytes: int, count: int, connection_id: int, sent: bool) -> None:
        """``count`` messages of one origin written to one connection, ``nbytes`` in all.

        One metrics update and one event-log group (``count`` records of the mean size).
        """
        if count == 1:
            self.account_delivery(meta, nbytes, connection_id, sent)
            return
        ids = (connection_id,) * count
        if sent:
            self.delivered += count
            self._account(meta, nbytes // count, ids, count, None)
        else:
            self.undeliverable += count
            self._account(meta, nbytes // count, ids, 0, list(ids))

    def _fan_out(self, payload: Any, connection_ids: tuple) -> None:
        """One event for several connections: a dialect whose sessions have ``fan_out(payload,
        connection_ids, gateway)`` takes them all in one call (its frame built once, one loop over
        the ids, counting the connections that are gone as undeliverable); else each session's
        ``on_event``. One delivery group holds connections of one dialect."""
        fan_out = getattr(self._first_session(connection_ids), "fan_out", None)
        if fan_out is not None:
            fan_out(payload, connection_ids, self)
        else:
            self.each_event(payload, connection_ids)

    def _fan_out_run(self, payloads: list, connection_ids: tuple) -> None:
        """Events in a row for the same connections: a dialect whose sessions have
        ``fan_out_run(payloads, connection_ids, gateway)`` takes them in one call (what it writes
        is what ``fan_out`` of each in turn would write); else each as :meth:`_fan_out` does."""
        fan_out_run = getattr(self._first_session(connection_ids), "fan_out_run", None)
        if fan_out_run is not None:
            fan_out_run(payloads, connection_ids, self)
        else:
            for payload in payloads:
                self._fan_out(payload, connection_ids)

    def _first_session(self, connection_ids: tuple) -> Any:
        """The session of the first of ``connection_ids`` that has one (None: none has)."""
        connections = self.connections
        for connection_id in connection_ids:
            connection = connections.get(connection_id)
            if connection is not None and connection.session is not None:
                return connection.session
        return None

    def each_event(self, payload: Any, connection_ids: tuple) -> None:
        """``payload`` to the session of each of ``connection_ids`` by its ``on_event``; a
        connection that is gone counts as undeliverable."""
        connections = self.connections
        for connection_id in connection_ids:
            connection = connections.get(connection_id)
            if connection is not None and connection.session is not None:
                connection.session.on_event(payload)
            else:
                self.undeliverable += 1

    def account_written(self, written: list) -> None:
        """A dialect wrote each of ``written`` (delivery items ``(kind, frame, connection_ids,
        meta)``, meta not None: the frame went to every connection of its group), e.g. a run of
        messages to one topic's subscribers: counted, and accounted in one pass as the gateway's own."""
        for item in written:
            self.delivered += len(item[2])
        self._account_written(written)

    def account_fanout(self, meta: tuple, nbytes: int, connection_ids: list[int]) -> None:
        """A dialect wrote one message to each of ``connection_ids`` (one frame of ``nbytes``)."""
        self.delivered += len(connection_ids)
        self._account(meta, nbytes, tuple(connection_ids), len(connection_ids), None)

    def _account(self, meta: tuple, nbytes: int, connection_ids: tuple, delivered: int, failed: list | None) -> None:
        """Metrics and event-log records for one fan-out group."""
        _, seq, ingress_ns, dialect, _, _ = meta
        now_ns = time.time_ns()
        metrics = self.metrics
        if metrics is not None and delivered:
            metrics.messages_out[dialect] += delivered
            metrics.bytes_out[dialect] += delivered * nbytes
            metrics.latency(dialect, (now_ns - ingress_ns) / 1e9, time.monotonic())
        reasons = None
        if failed is not None:
            reasons = [self._drop_reason(connection_id) for connection_id in failed]
            if metrics is not None:
                for reason in reasons:
                    metrics.drops[(dialect, reason)] += 1
        events = self.events
        if events is not None and events.sampled(seq):
            if failed is None:
                events.delivered(now_ns, meta, nbytes, connection_ids)
            else:
                gone = set(failed)
                events.delivered(now_ns, meta, nbytes, [c for c in connection_ids if c not in gone])
                for connection_id, reason in zip(failed, reasons):
                    events.dropped(now_ns, meta, nbytes, connection_id, reason)

    def _drop_reason(self, connection_id: int) -> str:
        connection = self.connections.get(connection_id)
        if connection is None or connection.ws is None or connection.ws.state is not OPEN:
            return "closed"
        return "slow_consumer"

    # -- HTTP -----------------------------------------------------------------------------

    async def _health(self, request: HttpRequest) -> HttpResponse:
        body = {
            "status": "ok",
            "gateway": self.id,
            "connections": len(self.connections),
            "endpoints": {d.name: d.path for d in self.dialects},
        }
        return HttpResponse(200, orjson.dumps(body))

    def stats(self) -> dict[str, Any]:
        return {
            **self.describe(),
            "connections": len(self.connections),
            "websockets": sum(1 for c in self.connections.values() if c.ws is not None),
            "refused_connections": dict(self.refused_connections),
            "addresses": len(self._per_ip),
            # Connections that stopped reading because they do not read what they asked for, and
            # what waits for them: answers not yet written, and bytes written but not yet taken.
            "reading_held": sum(1 for c in self.connections.values() if c.reading_held),
            "queued_http_requests": sum(c.queued_requests() for c in self.connections.values()),
            "outbound_bytes": sum(c.outbound_bytes() for c in self.connections.values()),
            "delivered": self.delivered,
            "undeliverable": self.undeliverable,
            "reordered_skipped": self.sequencer.skipped,
            # Loop turns that left part of a shard reply's deliveries to the next turn, and how
            # many deliveries wait now (gateway.max_deliveries_per_turn).
            "deliveries_sliced": self.sequencer.sliced,
            "deliveries_waiting": self.sequencer.waiting,
            "shard_client": self.shards.stats(),
            "dialects": {d.name: d.stats() for d in self.dialects},
            "uptime_s": round(time.time() - self.started_at, 1),
            "pid": os.getpid(),
            "gc_collections": [generation["collections"] for generation in gc.get_stats()],
            "event_log": None if self.events is None else {
                "rows_written": self.events.rows_written, "events_written": self.events.events_written,
                "files_written": self.events.files_written,
                "rejected_unlogged": self.events.rejected_unlogged, "records_dropped": self.events.records_dropped,
                "write_cpu_s": round(self.events.write_cpu_s, 3)},
        }


@ray.remote(num_cpus=0, max_restarts=0, max_concurrency=1000)
class GatewayActor:
    """Thin Ray wrapper: runs a :class:`Gateway` on the actor's event loop."""

    def __init__(self, gateway_id: str, index: int, settings: RouterSettings) -> None:
        logging.basicConfig(level=settings.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
        raise_open_file_limit()
        tune_gc()
        tune_malloc()
        self._gateway_id = gateway_id
        self._index = index
        self._settings = settings
        self._gateway: Gateway | None = None
        self._event_writer: Any = None
        self._stopped: asyncio.Event | None = None

    async def start(self, previous_ports: list[int] | None = None) -> dict[str, Any]:
        settings = self._settings
        counts = {kind: getattr(settings.shards, kind) for kind in shard_kinds(settings)}
        handles = {
            kind: [
                (shard_name(kind, i), ray.get_actor(shard_name(kind, i), namespace=settings.namespace))
                for i in range(count)
            ]
            for kind, count in counts.items()
        }
        self._stopped = asyncio.Event()
        analytics = settings.analytics
        if analytics.enabled and analytics.writer == "process":
            here = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)
            self._event_writer = EventLogWriterActor.options(
                name=f"eventlog-{self._gateway_id}", namespace=settings.namespace, scheduling_strategy=here
            ).remote(str(settings.events_dir), self._gateway_id, analytics.retention_hours)
        self._gateway = Gateway(self._gateway_id, self._index, settings, handles, asyncio.get_running_loop(),
                                self._event_writer, ray.get_runtime_context().get_node_id())
        described = await self._gateway.start(previous_ports)
        gc.freeze()  # what start-up loaded (Ray, pyarrow, the dialects) is never scanned again
        return described

    async def deliver(self, bundle: tuple) -> None:
        self._gateway.deliver(bundle)

    async def stats(self) -> dict[str, Any]:
        return self._gateway.stats()

    async def flush_events(self) -> int:
        return await self._gateway.flush_events()

    async def close_connections(self, dialect: str | None = None, code: int = 1001,
                                reason: str = "going away") -> int:
        """Close this gateway's WebSockets (of one dialect): e.g. to move clients off before maintenance."""
        return self._gateway.close_connections(dialect, code, reason)

    async def stop(self) -> None:
        if self._gateway is not None:
            await self._gateway.stop()  # writes what the event log still holds
        if self._event_writer is not None:
            ray.kill(self._event_writer)
            self._event_writer = None
        if self._stopped is not None:
            self._stopped.set()

    async def wait_stopped(self) -> str:
        """Returns when the gateway stops; fails if the actor dies (the supervisor watches this)."""
        await self._stopped.wait()
        return self._gateway_id
