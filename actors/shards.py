"""Thin Ray wrappers around the state classes: batching, delivery bundles, timers.

Every shard exposes one method to gateways, ``handle(gateway_id, commands)``: a batch of command
tuples ``(op, *args)`` executed in order. It returns ``(results, bundle)``: one result per command
(a value, or a :class:`CommandError` - a failing command never fails the batch) and the deliveries
addressed to the calling gateway. Deliveries to other gateways are pushed to them with one
``deliver(bundle)`` call per gateway per batch.

A bundle is ``(source, epoch, seq, items)``; ``seq`` counts per (shard, gateway) so the gateway can
restore the order in which the shard emitted them (Ray does not order calls to async actors), and
``epoch`` changes when the shard restarts. An item is ``(kind, payload, connection_ids, meta)``:
the payload is encoded once by the publishing gateway and fanned out as bytes; ``meta`` (opaque
here) tells the receiving gateway where and when the message entered, for the event log.

Shards are synchronous actors: Ray runs one caller's batches in submission order. Gateways send
their batches over the shard's lane (``router/lane.py``), served by a thread of the shard; a lock
keeps one batch at a time in the shard's state, whichever way it came.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
import time
import uuid
from typing import Any, Callable

import ray

from actors.signal.registry import Registry
from actors.nolag.messagelog import LogRecord, MessageLog, SqliteMessageLog
from actors.mx.match import MxMatchIndex
from actors.nolag.state import Lobby, Presence
from actors.nolag.state import Subscriptions as NolagSubscriptions
from actors.mx.match import Subscription as MxSubscription
from actors.cashu.retained import Retained, RetainedStore, RetainedValues, SqliteRetainedStore
from actors.sessions import SessionTable
from actors.topics import TopicTable
from router.config import RouterSettings
from router.errors import CommandError
from router.lane import LaneServer
from router.metrics import ShardMetrics
from router.proc import tune_gc
from actors.nolag.keys import pattern_matches
from router.patterns import PatternError, compile_pattern
from router.shardmap import REGISTRY, SESSION, TOPIC, gateway_name, shard_name

logger = logging.getLogger(__name__)

# Delivery item kinds.
DELIVER_TEXT = 0  # payload is the UTF-8 body of a text frame
DELIVER_BINARY = 1  # payload is the body of a binary frame
DELIVER_EVENT = 2  # payload is handed to the connection's dialect session

# mx-notifier hub item streams (TopicShard.mxpub).
MX_EVENT = 0  # a log event, matched against the filters
MX_BLOCK = 1  # revert / finalized: every connection with a filter
MX_ALL = 2  # block txs / scrs: connections with an "All" filter


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class ShardBase:
    kind = ""

    def __init__(self, index: int, settings: RouterSettings) -> None:
        self.name = shard_name(self.kind, index)
        self.namespace = settings.namespace
        self.settings = settings
        self.epoch = uuid.uuid4().hex[:12]
        self._seq: dict[str, int] = {}
        self._gateways: dict[str, Any] = {}
        self._outbox: dict[str, list[tuple]] = {}
        self._metrics = (ShardMetrics(self.name, self.kind, settings.metrics.interval_s)
                         if settings.metrics.enabled else None)
        self._now = now_ms()
        self._batches = 0
        self._commands = 0
        self._ops: dict[str, Callable[..., Any]] = {}
        self._lock = threading.RLock()
        self._lane: LaneServer | None = None
        tune_gc()

    # -- the gateway-facing entry points --------------------------------------------------

    def open_lane(self, node_id: str | None = None) -> tuple:
        """The address and secret of this shard's lane (started on first use): a Unix socket for a
        gateway on this node, TCP on the node's address for one elsewhere."""
        with self._lock:
            if self._lane is None:
                self._lane = LaneServer(self.name, self.handle)
                gc.freeze()  # the first gateway arrives once the shard is built: keep that out of scans
            lane = self._lane
        if node_id is not None and node_id == ray.get_runtime_context().get_node_id():
            return ("unix", lane.unix_address(), lane.secret)
        host, port = lane.tcp_address(ray.util.get_node_ip_address())
        return ("tcp", host, port, lane.secret)

    def handle(self, gateway_id: str, commands: list[tuple]) -> tuple[list[Any], tuple | None]:
        with self._lock:
            return self._handle(gateway_id, commands)

    def _handle(self, gateway_id: str, commands: list[tuple]) -> tuple[list[Any], tuple | None]:
        self._now = now_ms()
        self._before_batch()
        self._batches += 1
        self._commands += len(commands)
        if self._metrics is not None:
            self._metrics.batch(len(commands))
        results: list[Any] = []
        ops = self._ops
        for command in commands:
            try:
                results.append(ops[command[0]](gateway_id, *command[1:]))
            except CommandError as error:
                results.append(error)
            except Exception as error:  # a bug must not take the batch down with it
                logger.exception("%s: command %r failed", self.name, command[0])
                results.append(CommandError("internal_error", f"{type(error).__name__}: {error}"))
        self._after_batch()
        return results, self._flush(gateway_id)

    def purge_gateway(self, gateway_id: str) -> int:
        """The gateway is gone: forget its connections' state and its delivery channel."""
        with self._lock:
            self._gateways.pop(gateway_id, None)
            self._seq.pop(gateway_id, None)
            self._outbox.pop(gateway_id, None)
            if self._lane is not None:
                self._lane.drop(gateway_id)
            return self._purge_gateway_state(gateway_id)

    def info(self) -> dict[str, Any]:
        with self._lock:
            lanes = None if self._lane is None else sorted(self._lane.connected())
            return {"name": self.name, "kind": self.kind, "epoch": self.epoch, "pid": os.getpid(),
                    "batches": self._batches, "commands": self._commands, "lanes": lanes, **self._stats()}

    # -- for subclasses -------------------------------------------------------------------

    def _before_batch(self) -> None:
        pass

    def _after_batch(self) -> None:
        pass

    def _stats(self) -> dict[str, Any]:
        return {}

    def _purge_gateway_state(self, gateway_id: str) -> int:
        return 0

    def _emit(self, routes: dict[str, tuple[int, ...]], payload: Any, kind: int, meta: tuple | None) -> None:
        outbox = self._outbox
        for gateway_id, connection_ids in routes.items():
            item = (kind, payload, connection_ids, meta)
            items = outbox.get(gateway_id)
            if items is None:
                outbox[gateway_id] = [item]
            else:
                items.append(item)

    def _flush(self, caller: str) -> tuple | None:
        if not self._outbox:
            return None
        outbox, self._outbox = self._outbox, {}
        local = None
        for gateway_id, items in outbox.items():
            seq = self._seq.get(gateway_id, 0)
            self._seq[gateway_id] = seq + 1
            bundle = (self.name, self.epoch, seq, items)
            if gateway_id == caller:
                local = bundle
                continue
            if self._lane is not None and self._lane.push(gateway_id, bundle):
                continue
            handle = self._gateway(gateway_id)
            if handle is not None:
                handle.deliver.remote(bundle)
        return local

    def _gateway(self, gateway_id: str) -> Any:
        handle = self._gateways.get(gateway_id)
        if handle is None:
            try:
                handle = ray.get_actor(gateway_name(gateway_id), namespace=self.namespace)
            except ValueError:
                logger.warning("%s: gateway %s is gone; dropping its state", self.name, gateway_id)
                self.purge_gateway(gateway_id)
                return None
            self._gateways[gateway_id] = handle
        return handle


def _group(locations: list[tuple[str, int]]) -> dict[str, tuple[int, ...]]:
    """(gateway, connection) pairs as fan-out routes: gateway -> connection ids."""
    routes: dict[str, list[int]] = {}
    for gateway_id, connection_id in locations:
        routes.setdefault(gateway_id, []).append(connection_id)
    return {gateway_id: tuple(ids) for gateway_id, ids in routes.items()}


class TopicShard(ShardBase):
    """Commands: sub, unsub, pub, purge, stats; and for retained values rsub, rset, rinit.

    A retained value is delivered as a ``DELIVER_EVENT`` whose payload is
    ``(topic, version, payload, meta)``; see :mod:`actors.cashu.retained`.
    """

    kind = TOPIC

    def __init__(self, index: int, settings: RouterSettings, store: RetainedStore | None = None) -> None:
        super().__init__(index, settings)
        self.table = TopicTable()
        self._store = store
        self._retained: RetainedValues | None = None
        self._ops = {
            "sub": self._subscribe,
            "unsub": self._unsubscribe,
            "pub": self._publish,
            "purge": self._purge,
            "rsub": self._subscribe_retained,
            "rset": self._set_retained,
            "rinit": self._init_retained,
            "mxsub": self._mx_subscribe,
            "mxpub": self._mx_publish,
            "nsub": self._nolag_subscribe,
            "nunsub": self._nolag_unsubscribe,
            "nfilters": self._nolag_filters,
            "npub": self._nolag_publish,
            "nlog": self._nolag_log,
            "npres": self._nolag_presence,
            "nplist": lambda gateway_id, room: self.presence.list(room),
            "nroom": self._nolag_room,
            "nlsub": self._nolag_lobby,
            "nlunsub": self._nolag_lobby_leave,
            "stats": lambda gateway_id: self._stats(),
        }
        self.mx = MxMatchIndex()
        self.nolag = NolagSubscriptions()
        self.presence = Presence()
        self.room_members: dict[str, set[tuple[str, int]]] = {}
        self.lobby_listeners: dict[tuple[str, str], tuple[Lobby, set[tuple[str, int]]]] = {}
        self._log: MessageLog | None = None
        self._log_pending: list[LogRecord] = []
        self._topic_ts: dict[str, int] = {}
        self._next_prune = 0

    @property
    def retained(self) -> RetainedValues:
        """Opened on first use, so routers that never retain anything create no database."""
        if self._retained is None:
            store = self._store or SqliteRetainedStore(self.settings.data_dir / "retained.sqlite3")
            self._retained = RetainedValues(store)
        return self._retained

    def _subscribe_retained(self, gateway_id: str, topic: str, connection_id: int) -> Retained | None:
        """Subscribe and read the current value in one step: later values are delivered after it."""
        self.table.subscribe(topic, (gateway_id, connection_id))
        return self.retained.get(topic)

    def _set_retained(self, gateway_id: str, topic: str, payload: bytes, meta: tuple | None = None) -> tuple[int, int]:
        """Store a new value and deliver it to the topic's subscribers: (version, recipients)."""
        version = self.retained.put(topic, payload)
        count, routes = self.table.routes(topic)
        if count:
            self._emit(routes, (topic, version, payload, meta), DELIVER_EVENT, None)
        return version, count

    def _init_retained(self, gateway_id: str, topic: str, payload: bytes, meta: tuple | None = None) -> Retained:
        """Store a value fetched from elsewhere unless one arrived meanwhile; returns the value now."""
        value, stored = self.retained.put_if_absent(topic, payload)
        if stored:
            count, routes = self.table.routes(topic)
            if count:
                self._emit(routes, (topic, value[0], payload, meta), DELIVER_EVENT, None)
        return value

    # -- mx-notifier hub: filters held here, each event matched once for all of them ----------

    def _mx_subscribe(self, gateway_id: str, connection_id: int, subscription: MxSubscription) -> bool:
        return self.mx.add((gateway_id, connection_id), subscription)

    def _mx_publish(self, gateway_id: str, items: list[tuple], meta: tuple | None = None) -> int:
        """Deliver a block's items to the connections they select; returns the deliveries.

        An item is ``(stream, fields, topic, tail)``: ``stream`` is MX_EVENT (``fields`` =
        (address, identifier, topics) are matched), MX_BLOCK (every connection with a filter) or
        MX_ALL (connections with an ``All`` filter); ``tail`` is the frame's shared part, encoded
        once by the ingesting gateway. The payload delivered is ``(topic, tail, meta)``.
        """
        index = self.mx
        if index.empty:
            return 0
        delivered = 0
        everyone = None
        for stream, fields, topic, tail in items:
            if stream == MX_EVENT:
                keys = index.match_fields(*fields)
            elif stream == MX_BLOCK:
                keys = everyone if everyone is not None else index.connections()
                everyone = keys
            else:
                keys = index.all_connections()
            if not keys:
                continue
            routes: dict[str, list[int]] = {}
            for gateway, connection_id in keys:
                routes.setdefault(gateway, []).append(connection_id)
            self._emit({g: tuple(ids) for g, ids in routes.items()}, (topic, tail, meta), DELIVER_EVENT, None)
            delivered += len(keys)
        return delivered

    # -- NoLag: topics with filters, QoS and groups; rooms and lobbies; the message log ----------

    @property
    def message_log(self) -> MessageLog:
        if self._log is None:
            self._log = SqliteMessageLog(self.settings.data_dir / "nolag-log.sqlite3", self._retention_ms)
        return self._log

    def _retention_ms(self, key: str) -> int:
        """How long a topic's messages are kept: the first matching `nolag.log_retention` pattern, else the default."""
        config = self.settings.nolag
        topic = key.split("/", 2)[2]
        for pattern, seconds in config.log_retention.items():
            if pattern_matches(pattern, topic):
                return int(seconds * 1000)
        return int(config.log_retention_s * 1000)

    def _nolag_subscribe(self, gateway_id, key, connection_id, actor, filters, qos, group) -> int:
        """Subscribe; returns the topic's position (the timestamp of its last message, or now)."""
        self.nolag.subscribe(key, (gateway_id, connection_id), filters, qos, group)
        return self._topic_ts.get(key, self._now)

    def _nolag_unsubscribe(self, gateway_id, key, connection_id) -> bool:
        return self.nolag.unsubscribe(key, (gateway_id, connection_id))

    def _nolag_filters(self, gateway_id, key, connection_id, filters) -> bool:
        return self.nolag.set_filters(key, (gateway_id, connection_id), filters)

    def _nolag_publish(self, gateway_id, key, topic, packed, qos, filter_, exclude, msg_id, ts_ms, sender,
                       meta=None) -> int:
        """Route one message (filters, echo, one member per load-balance group) and log it if it has an id."""
        # The shard stamps the time: strictly increasing per topic, so a position in a topic is exact.
        ts_ms = max(self._now, self._topic_ts.get(key, 0) + 1)
        self._topic_ts[key] = ts_ms
        if msg_id is not None:
            self._log_pending.append(LogRecord(key, msg_id, ts_ms, packed, qos, filter_))
        chosen = self.nolag.route(key, filter_, None if exclude is None else (gateway_id, exclude))
        if chosen:
            self._emit(_group(chosen), ("m", topic, packed, msg_id, qos, filter_, ts_ms, sender, meta),
                       DELIVER_EVENT, None)
        return len(chosen)

    def _nolag_log(self, gateway_id, key, after_ms, limit) -> list[tuple]:
        """Logged messages of a topic after ``after_ms`` (for a reconnect's replay)."""
        topic = key.split("/", 2)[2]
        return [(topic, r.msg_id, r.ts_ms, r.data_packed, r.qos, r.filter)
                for r in self.message_log.since([key], after_ms, limit)]

    def _nolag_room(self, gateway_id, room, connection_id, join) -> bool:
        members = self.room_members.setdefault(room, set())
        (members.add if join else members.discard)((gateway_id, connection_id))
        if not members:
            del self.room_members[room]
        return True

    def _nolag_presence(self, gateway_id, room, connection_id, actor, data, now) -> int:
        location = (gateway_id, connection_id)
        events = self.presence.set(room, actor, location, data, now)
        self._presence_out(room, events, extra=location)
        return len(events)

    def _presence_out(self, room: str, events: list, extra: tuple | None = None) -> None:
        """Presence events to the room's members (and the actor itself), lobby events to listeners."""
        if not events:
            return
        _, project, plain = room.split("/", 2)
        members = set(self.room_members.get(room, ()))
        if extra is not None:
            members.add(extra)
        routes = _group(list(members))
        listeners = [(lobby_id, located) for (p, lobby_id), (lobby, located) in self.lobby_listeners.items()
                     if p == project and lobby.contains(plain) and located]
        for event in events:
            if routes:
                self._emit(routes, ("p", plain or None, event.event, event.actor_id, event.data, event.joined_at),
                           DELIVER_EVENT, None)
            for lobby_id, located in listeners:
                self._emit(_group(list(located)), ("l", lobby_id, plain, event.event, event.actor_id, event.data),
                           DELIVER_EVENT, None)

    def _nolag_lobby(self, gateway_id, lobby_id, spec, connection_id, listen) -> dict[str, dict[str, Any]]:
        """This shard's part of a lobby's presence; with ``listen``, later changes go to the connection."""
        project, rooms, prefix = spec
        lobby = Lobby(lobby_id, None if rooms is None else frozenset(rooms), prefix)
        if listen:
            entry = self.lobby_listeners.setdefault((project, lobby_id), (lobby, set()))
            entry[1].add((gateway_id, connection_id))
        snapshot: dict[str, dict[str, Any]] = {}
        for room in self.presence.rooms():
            _, room_project, plain = room.split("/", 2)
            if room_project == project and lobby.contains(plain):
                snapshot[plain] = {entry["actorTokenId"]: entry["presence"] for entry in self.presence.list(room)}
        return snapshot

    def _nolag_lobby_leave(self, gateway_id, lobby_id, connection_id) -> bool:
        for (project, listened), (lobby, located) in list(self.lobby_listeners.items()):
            if listened == lobby_id:
                located.discard((gateway_id, connection_id))
                if not located:
                    del self.lobby_listeners[(project, listened)]
        return True

    def _nolag_purge(self, location: tuple[str, int]) -> None:
        self.nolag.purge_connection(location)
        for room, event in self.presence.purge_connection(location):
            self._presence_out(room, [event])
        for room in [room for room, members in self.room_members.items() if location in members]:
            self._nolag_room(location[0], room, location[1], False)
        for key, (lobby, located) in list(self.lobby_listeners.items()):
            located.discard(location)
            if not located:
                del self.lobby_listeners[key]

    def _after_batch(self) -> None:
        if self._log_pending:
            pending, self._log_pending = self._log_pending, []
            self.message_log.append_many(pending)
        if self._log is not None and self._now >= self._next_prune:
            self._next_prune = self._now + 60_000
            self._log.prune(self._now)
        retained = self._retained
        if retained is not None and retained.dirty:
            retained.commit()  # before the results leave: an acknowledged value is stored

    def _subscribe(self, gateway_id: str, topic: str, connection_id: int, info: Any = None) -> bool:
        return self.table.subscribe(topic, (gateway_id, connection_id), info)

    def _unsubscribe(self, gateway_id: str, topic: str, connection_id: int) -> bool:
        return self.table.unsubscribe(topic, (gateway_id, connection_id))

    def _publish(self, gateway_id: str, topic: str, payload: Any, kind: int, exclude: int | None = None,
                 meta: tuple | None = None) -> int:
        count, routes = self.table.routes(topic, None if exclude is None else (gateway_id, exclude))
        if count:
            self._emit(routes, payload, kind, meta)
        return count

    def _purge(self, gateway_id: str, connection_id: int) -> list[str]:
        self.mx.remove_connection((gateway_id, connection_id))
        self._nolag_purge((gateway_id, connection_id))
        return self.table.purge_connection((gateway_id, connection_id))

    def _purge_gateway_state(self, gateway_id: str) -> int:
        for key in [key for key in self.mx.connections() if key[0] == gateway_id]:
            self.mx.remove_connection(key)
        gone = {location for members in self.room_members.values() for location in members if location[0] == gateway_id}
        for location in gone:
            self._nolag_purge(location)
        return self.table.purge_gateway(gateway_id)

    def _stats(self) -> dict[str, Any]:
        stats = self.table.stats()
        if not self.mx.empty:
            stats["mx"] = self.mx.stats()
        if self._retained is not None:
            stats["retained"] = self._retained.stats()
        return stats


class RegistryShard(ShardBase):
    """Commands: register, unregister, renew, send, discover, broadcast, purge, stats."""

    kind = REGISTRY

    def __init__(self, index: int, settings: RouterSettings) -> None:
        super().__init__(index, settings)
        signal = settings.signal
        # The actor limit is global; each shard holds an equal share of it (keys hash uniformly).
        share = -(-signal.max_actors // settings.shards.registry)
        self.registry = Registry(max_entries=share)
        self._max_pattern_length = signal.max_pattern_length
        self._next_sweep = 0
        self._ops = {
            "register": self._register,
            "unregister": self._unregister,
            "renew": self._renew,
            "send": self._send,
            "discover": self._discover,
            "broadcast": self._broadcast,
            "purge": self._purge,
            "stats": lambda gateway_id: self._stats(),
        }

    def _before_batch(self) -> None:
        if self._now >= self._next_sweep:
            self.registry.sweep(self._now)
            self._next_sweep = self._now + 1000

    def _register(self, gateway_id, address, connection_id, session_id, capabilities, metadata, ttl_ms):
        return self.registry.register(
            address, (gateway_id, connection_id), session_id, capabilities, metadata, ttl_ms, self._now
        )

    def _unregister(self, gateway_id, address, connection_id):
        self.registry.unregister(address, (gateway_id, connection_id), self._now)
        return self._now

    def _renew(self, gateway_id, address, connection_id, token, ttl_ms):
        return self.registry.renew(address, (gateway_id, connection_id), token, ttl_ms, self._now)

    def _send(self, gateway_id: str, address: str, payload: Any, kind: int, meta: tuple | None = None) -> bool:
        registration = self.registry.lookup(address, self._now)
        if registration is None:
            return False
        target_gateway, target_connection = registration.location
        self._emit({target_gateway: (target_connection,)}, payload, kind, meta)
        return True

    def _discover(self, gateway_id, pattern, capabilities, metadata, window):
        try:
            matcher = None if pattern is None else compile_pattern(pattern, self._max_pattern_length)
        except PatternError as error:
            raise CommandError("invalid_pattern", str(error)) from None
        return self.registry.discover(self._now, matcher, capabilities, metadata, window)

    def _broadcast(self, gateway_id: str, payload: Any, kind: int, exclude: int | None = None,
                   meta: tuple | None = None) -> int:
        count, routes = self.registry.broadcast_routes(
            self._now, None if exclude is None else (gateway_id, exclude)
        )
        if count:
            self._emit(routes, payload, kind, meta)
        return count

    def _purge(self, gateway_id: str, connection_id: int) -> list[str]:
        return self.registry.purge_connection((gateway_id, connection_id))

    def _purge_gateway_state(self, gateway_id: str) -> int:
        return self.registry.purge_gateway(gateway_id)

    def _stats(self) -> dict[str, Any]:
        return self.registry.stats(now_ms())


class SessionShard(ShardBase):
    """Commands: open, close, record, stats."""

    kind = SESSION

    def __init__(self, index: int, settings: RouterSettings) -> None:
        super().__init__(index, settings)
        self.table = SessionTable()
        self._ops = {
            "open": self._open,
            "close": self._close,
            "record": self._record,
            "nreset": self._nolag_reset,
            "nget": self._nolag_get,
            "nsave": self._nolag_save,
            "ncheck": self._nolag_check,
            "nleave": self._nolag_leave,
            "stats": lambda gateway_id: self._stats(),
        }
        # NoLag actors: subscriptions (topic -> (qos, filters, load_balance, group)), where to replay
        # from, and the QoS 2 message ids they have had; kept while they are away.
        self.nolag: dict[str, dict[str, Any]] = {}

    def _open(self, gateway_id, session_id, dialect, connection_id, identity, capabilities) -> bool:
        self.table.open(session_id, dialect, (gateway_id, connection_id), identity, capabilities, self._now)
        return True

    def _close(self, gateway_id: str, session_id: str) -> bool:
        return self.table.close(session_id) is not None

    def _nolag_reset(self, gateway_id: str, actor: str) -> bool:
        self.nolag[actor] = {"subs": {}, "resume": {}, "seen": []}
        return True

    def _nolag_get(self, gateway_id: str, actor: str) -> tuple | None:
        state = self.nolag.get(actor)
        if state is None:
            return None
        return dict(state["subs"]), dict(state["resume"]), list(state["seen"])

    def _nolag_save(self, gateway_id: str, actor: str, topic: str, record: tuple | None,
                    position: int | None) -> bool:
        state = self.nolag.setdefault(actor, {"subs": {}, "resume": {}, "seen": []})
        if record is None:
            state["subs"].pop(topic, None)
            state["resume"].pop(topic, None)
        else:
            state["subs"][topic] = record
            if position is not None:
                state["resume"].setdefault(topic, position)
        return True

    def _nolag_check(self, gateway_id: str, actor: str, resume: dict[str, int]) -> bool:
        """Where to replay from per topic (checkpointed while connected, final when it leaves)."""
        state = self.nolag.get(actor)
        if state is not None:
            state["resume"].update({topic: ts for topic, ts in resume.items() if topic in state["subs"]})
        return True

    def _nolag_leave(self, gateway_id: str, actor: str, resume: dict[str, int], seen: list[str]) -> bool:
        self._nolag_check(gateway_id, actor, resume)
        state = self.nolag.get(actor)
        if state is not None:
            state["seen"] = (state["seen"] + seen)[-1000:]
        return True

    def _record(self, gateway_id: str, session_id: str, kind: str, value: str, present: bool) -> bool:
        return self.table.record(session_id, kind, value, present)

    def _purge_gateway_state(self, gateway_id: str) -> int:
        return len(self.table.purge_gateway(gateway_id))

    def _stats(self) -> dict[str, Any]:
        return self.table.stats()


_ACTOR_OPTIONS = {"num_cpus": 0, "max_restarts": -1, "max_task_retries": 0}

TopicShardActor = ray.remote(**_ACTOR_OPTIONS)(TopicShard)
RegistryShardActor = ray.remote(**_ACTOR_OPTIONS)(RegistryShard)
SessionShardActor = ray.remote(**_ACTOR_OPTIONS)(SessionShard)

SHARD_ACTORS = {TOPIC: TopicShardActor, REGISTRY: RegistryShardActor, SESSION: SessionShardActor}


# -- Baqend real-time queries: documents by id, queries by subscription (docs/baqend.md) -------------

from actors.baqend.documents import NOT_FOUND, DocumentTable, SqliteDocumentStore, iso_now, object_id, readable, reader  # noqa: E402,I001
from actors.baqend.livequeries import QueryTable  # noqa: E402
from actors.baqend.mongoquery import QueryError, compile_query  # noqa: E402
from router.shardmap import DOCUMENT, QUERY, shard_index  # noqa: E402


class DocumentShard(ShardBase):
    """Commands: insert, replace, update, delete, get, scan, stats.

    Owns the documents whose id hashes here. Each write is checked (version, acl), buffered, and
    committed to SQLite at the end of the batch; then the batch's (before, after) images are sent
    to every query shard in one call each, stamped ``(index, epoch, seq)`` (see
    :mod:`actors.baqend.livequeries` for why that keeps initial results and events consistent).
    """

    kind = DOCUMENT

    def __init__(self, index: int, settings: RouterSettings, store: Any = None) -> None:
        super().__init__(index, settings)
        self.index = index
        count = settings.shards.document
        self.table = DocumentTable(
            store or SqliteDocumentStore(settings.data_dir / "documents.sqlite3"),
            owns=lambda oid: shard_index(oid, count) == index,
        )
        self._seq_counter = 0
        self._forward: list[tuple] = []
        self._forward_timeout_s = settings.baqend.request_timeout_s / 2
        self._query_shards: list[Any] | None = None
        self._ops = {
            "insert": self._insert,
            "replace": self._replace,
            "update": self._update,
            "delete": self._delete,
            "get": self._get,
            "scan": self._scan,
            "stats": lambda gateway_id: self._stats(),
        }

    def _written(self, bucket: str, before: Any, after: Any, operation: str, meta: tuple | None) -> None:
        self._seq_counter += 1
        self._forward.append((bucket, before, after, operation, self._seq_counter, meta))

    def _iso(self) -> str:
        return iso_now(self._now)

    def _insert(self, gateway_id, bucket, key, fields, principals=frozenset(), meta=None):
        before, after = self.table.insert(bucket, key, fields, self._iso(), principals)
        self._written(bucket, before, after, "insert", meta)
        return after

    def _replace(self, gateway_id, bucket, key, fields, if_match, principals=frozenset(), meta=None):
        before, after = self.table.replace(bucket, key, fields, if_match, self._iso(), principals)
        self._written(bucket, before, after, "update" if before is not None else "insert", meta)
        return after, before is None

    def _update(self, gateway_id, bucket, key, operations, if_match, principals=frozenset(), meta=None):
        before, after = self.table.update(bucket, key, operations, if_match, self._iso(), principals)
        self._written(bucket, before, after, "update", meta)
        return after

    def _delete(self, gateway_id, bucket, key, if_match, principals=frozenset(), meta=None):
        before, after = self.table.delete(bucket, key, if_match, principals)
        self._written(bucket, before, after, "delete", meta)
        return before

    def _get(self, gateway_id, bucket, key, principals=frozenset()):
        oid = object_id(bucket, key)
        document = self.table.get(oid)
        if document is None or not readable(document, principals):
            # An object the caller may not read is reported as missing: its existence is not revealed.
            raise CommandError(NOT_FOUND, f"the object {oid} does not exist")
        return document

    def _scan(self, gateway_id: str, bucket: str, query: Any = None) -> tuple[int, str, int, list]:
        """The bucket's matching documents, and the stamp of the last write they include."""
        try:
            keep = compile_query(query or {})
        except QueryError as error:
            raise CommandError("bad_request", str(error)) from None
        return self.index, self.epoch, self._seq_counter, self.table.scan(bucket, keep)

    def _after_batch(self) -> None:
        if self.table.dirty:
            self.table.commit()  # before the answers leave and before any query hears of it
        if self._forward:
            items, self._forward = self._forward, []
            calls = [shard.handle.remote(self.name, [("writes", self.index, self.epoch, items)])
                     for shard in self._queries()]
            # Wait until every query shard has applied the batch before the writes are answered:
            # a client that writes B after A's answer then gets A's events before B's, even when
            # A and B are documents of different shards (whose calls Ray would not order).
            ready, pending = ray.wait(calls, num_returns=len(calls), timeout=self._forward_timeout_s)
            if pending:
                logger.warning("%s: %d query shard(s) did not apply writes within %gs", self.name, len(pending),
                               self._forward_timeout_s)

    def _queries(self) -> list[Any]:
        if self._query_shards is None:
            self._query_shards = [ray.get_actor(shard_name(QUERY, i), namespace=self.namespace)
                                  for i in range(self.settings.shards.query)]
        return self._query_shards

    def _stats(self) -> dict[str, Any]:
        return {"writes": self.table.writes, "seq": self._seq_counter}


class QueryShard(ShardBase):
    """Commands: sub, load, unsub, purge, stats from gateways; writes from document shards.

    Holds the real-time queries whose subscription key hashes here (:class:`QueryTable`) and
    emits their ``result`` and ``match`` payloads as ``DELIVER_EVENT`` to the subscribers.
    """

    kind = QUERY

    def __init__(self, index: int, settings: RouterSettings) -> None:
        super().__init__(index, settings)
        self.table = QueryTable()
        self._ops = {
            "sub": self._subscribe,
            "load": self._load,
            "unsub": self._unsubscribe,
            "purge": self._purge,
            "writes": self._writes,
            "stats": lambda gateway_id: self._stats(),
        }

    def _subscribe(self, gateway_id, key, connection_id, sub_id, spec, principals=frozenset()) -> bool:
        return self.table.add(key, (gateway_id, connection_id), sub_id, spec, reader(frozenset(principals)))

    def _load(self, gateway_id: str, key: str, scans: list) -> bool:
        outputs = self.table.load(key, scans)
        if outputs is None:
            return False
        self._deliver(outputs)
        return True

    def _unsubscribe(self, gateway_id: str, key: str) -> bool:
        return self.table.remove(key)

    def _purge(self, gateway_id: str, connection_id: int) -> int:
        return self.table.purge_connection((gateway_id, connection_id))

    def _writes(self, source_name: str, source: int, epoch: str, items: list) -> int:
        outputs = self.table.apply(source, epoch, items)
        self._deliver(outputs)
        return len(outputs)

    def _deliver(self, outputs: list) -> None:
        for (gateway_id, connection_id), payload in outputs:
            self._emit({gateway_id: (connection_id,)}, payload, DELIVER_EVENT, None)

    def _purge_gateway_state(self, gateway_id: str) -> int:
        return self.table.purge_gateway(gateway_id)

    def _stats(self) -> dict[str, Any]:
        return self.table.stats()


DocumentShardActor = ray.remote(**_ACTOR_OPTIONS)(DocumentShard)
QueryShardActor = ray.remote(**_ACTOR_OPTIONS)(QueryShard)
SHARD_ACTORS.update({DOCUMENT: DocumentShardActor, QUERY: QueryShardActor})
