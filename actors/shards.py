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

Shards are synchronous, single-threaded actors: Ray runs one caller's batches in submission order.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from typing import Any, Callable

import ray

from actors.registry import Registry
from actors.mxmatch import MxMatchIndex
from actors.mxmatch import Subscription as MxSubscription
from actors.retained import Retained, RetainedStore, RetainedValues, SqliteRetainedStore
from actors.sessions import SessionTable
from actors.topics import TopicTable
from router.config import RouterSettings
from router.errors import CommandError
from router.metrics import ShardMetrics
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

    # -- the gateway-facing entry points --------------------------------------------------

    def handle(self, gateway_id: str, commands: list[tuple]) -> tuple[list[Any], tuple | None]:
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
        self._gateways.pop(gateway_id, None)
        self._seq.pop(gateway_id, None)
        self._outbox.pop(gateway_id, None)
        return self._purge_gateway_state(gateway_id)

    def info(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "epoch": self.epoch, "pid": os.getpid(),
                "batches": self._batches, "commands": self._commands, **self._stats()}

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


class TopicShard(ShardBase):
    """Commands: sub, unsub, pub, purge, stats; and for retained values rsub, rset, rinit.

    A retained value is delivered as a ``DELIVER_EVENT`` whose payload is
    ``(topic, version, payload, meta)``; see :mod:`actors.retained`.
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
            "stats": lambda gateway_id: self._stats(),
        }
        self.mx = MxMatchIndex()

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

    def _after_batch(self) -> None:
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
        return self.table.purge_connection((gateway_id, connection_id))

    def _purge_gateway_state(self, gateway_id: str) -> int:
        for key in [key for key in self.mx.connections() if key[0] == gateway_id]:
            self.mx.remove_connection(key)
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
            "stats": lambda gateway_id: self._stats(),
        }

    def _open(self, gateway_id, session_id, dialect, connection_id, identity, capabilities) -> bool:
        self.table.open(session_id, dialect, (gateway_id, connection_id), identity, capabilities, self._now)
        return True

    def _close(self, gateway_id: str, session_id: str) -> bool:
        return self.table.close(session_id) is not None

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
