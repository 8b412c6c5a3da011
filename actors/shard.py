"""A shard: one Ray actor process holding many logical actors, built from dialect components.

The base (:class:`Shard`) owns what every shard kind shares: the batch loop, delivery bundles
(emit, flush, per-gateway sequence numbers and the epoch), the lane and the Ray handles of
gateways. Everything a dialect keeps in a shard is a :class:`Component`: it declares the
operations it answers and implements the hooks the base calls on *every* component, so a
component cannot be left out of a purge, a commit or a restore:

- ``purge_connection(location)``: a connection closed (the core ``purge`` operation);
- ``purge_gateway(gateway_id)``: a gateway died; forget every connection it held;
- ``before_batch()`` / ``after_batch()``: timers, and committing what the batch stored before its
  results leave the shard (an acknowledged write is durable);
- ``abort_batch()``: its ``after_batch`` failed: drop what the batch left pending, so the next
  batch starts clean; the base answers that component's commands of the batch with an error;
- ``stats()``: counters for ``router status``;
- ``restore()``: the shard (re)started; rebuild what a previous incarnation held.

A shard that Ray restarted *heals*: soft state (subscriptions, registrations, live queries) is
re-announced by the gateways whose connections hold it, and until every gateway listed at the
restart has ended its re-announcements with ``core.reannounced`` (or ``shards.heal_timeout_s``
passed) every other command is answered with a ``healing`` error that its gateway retries. So a
publish from one gateway cannot reach the shard before the subscribers of another are back.

A command is ``(op, *fields)`` (see :mod:`router.contract`); a batch returns one result per
command (a value, or a :class:`CommandError`: a failing command never fails the batch) and the
bundle of deliveries for the calling gateway. Bundles for other gateways go over their lanes, or
by a ``deliver`` Ray call when a gateway has none.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
import time
import uuid
import warnings
from typing import Any, Callable, Iterable

import ray

from router import contract
from router.contract import Location, Op, Routes
from router.errors import CommandError
from router.lane import LaneServer
from router.metrics import ShardMetrics
from router.postgres import STORE_ERRORS
from router.proc import tune_gc, tune_malloc
from router.shardmap import GATEWAY_PREFIX, SHARD_SUFFIX, gateway_name, shard_name

logger = logging.getLogger(__name__)

Handler = Callable[..., Any]


class Component:
    """What one dialect (or the core) keeps in one kind of shard.

    Subclasses set ``name`` and return their handlers from :meth:`operations`; each handler is
    called as ``handler(gateway_id, *fields)``. The hooks default to doing nothing.
    """

    name = ""

    def __init__(self, shard: "Shard") -> None:
        self.shard = shard
        self.settings = shard.settings

    def operations(self) -> dict[str, Handler]:
        return {}

    def purge_connection(self, location: Location) -> None:
        """A connection closed: forget everything it held here."""

    def purge_gateway(self, gateway_id: str) -> int:
        """A gateway died: forget every connection it held here; returns how many connections."""
        return 0

    def before_batch(self) -> None:
        """A batch starts (``shard.now`` is set): run timers."""

    def after_batch(self) -> None:
        """A batch ran: commit what it stored, before its results leave the shard."""

    def abort_batch(self) -> None:
        """``after_batch`` raised: forget what this batch left pending (it was not stored)."""

    def stats(self) -> dict[str, Any]:
        return {}

    def restore(self) -> None:
        """The shard started (first time, or restarted by Ray with a new epoch): rebuild what a
        previous incarnation held from where it was persisted. Soft state that only clients hold
        is re-announced by their gateways instead."""

    # -- helpers for components -----------------------------------------------------------

    def emit(self, routes: Routes, payload: Any, kind: int, meta: tuple | None = None) -> None:
        self.shard.emit(routes, payload, kind, meta)

    @property
    def now(self) -> int:
        """Epoch ms at the start of the current batch."""
        return self.shard.now


class Shard:
    """One shard of ``kind``: the base plus one instance of each of ``components``."""

    def __init__(self, kind: str, index: int, settings: Any, components: Iterable[type[Component]]) -> None:
        self.kind = kind
        self.index = index
        self.name = shard_name(kind, index)
        self.namespace = settings.namespace
        self.settings = settings
        self.epoch = uuid.uuid4().hex[:12]
        self.now = contract.now_ms()
        self._seq: dict[str, int] = {}
        self._gateways: dict[str, Any] = {}
        self._outbox: dict[str, list[tuple]] = {}
        self._metrics = (ShardMetrics(self.name, kind, settings.metrics.interval_s)
                         if settings.metrics.enabled else None)
        self._batches = 0
        self._commands = 0
        self._lock = threading.RLock()
        self._lane: LaneServer | None = None
        self._watched: set[str] = set()  # gateways whose lane closed, being checked
        wait = STORE_RETRY_FIRST_S
        while True:
            try:
                self._build(components)
                break
            except STORE_ERRORS as error:
                # Ray never restarts an actor whose constructor raised: a shard that gave up here
                # while the store was briefly unreachable (a failover, a node restarting) would be
                # gone for good. It waits instead; its callers time out meanwhile.
                logger.warning("%s: the store is unavailable (%s); trying again in %.1f s", self.name, error, wait)
                time.sleep(wait)
                wait = min(wait * 2, STORE_RETRY_MAX_S)
        tune_gc()
        tune_malloc()
        self._healing: set[str] = set()  # gateways that have not re-announced yet
        self._heal_deadline = 0.0
        self.healed_in: float | None = None  # seconds from start to the last re-announcement
        self._started = time.monotonic()
        if _restarted():
            self._healing = self._live_gateways()
            self._heal_deadline = self._started + settings.shards.heal_timeout_s
            logger.warning("%s restarted as %s: waiting for %d gateway(s) to re-announce", self.name, self.epoch,
                           len(self._healing))

    def _build(self, components: list[type["Component"]]) -> None:
        """The components (in order: one may use those before it, ``component()``), their
        operations, and what each restores from its store."""
        self.components: list[Component] = []
        for component in components:
            self.components.append(component(self))
        self._ops: dict[str, Handler] = {Op.PURGE: self._purge_connection, Op.STATS: self._stats_op,
                                         Op.REANNOUNCED: self._reannounced}
        self._owners: dict[str, Component] = {}  # op -> the component that answers it
        for component in self.components:
            for op, handler in component.operations().items():
                if op in self._ops:
                    raise ValueError(f"{self.name}: operation {op!r} is declared twice")
                self._ops[op] = handler
                self._owners[op] = component
        for component in self.components:
            component.restore()

    def _live_gateways(self) -> set[str]:
        try:
            entries = ray.util.list_named_actors(all_namespaces=True)
        except Exception:  # no GCS answer: heal by the deadline alone
            logger.exception("%s: could not list the gateways", self.name)
            return {""}
        return {entry["name"][len(GATEWAY_PREFIX):] for entry in entries
                if entry.get("namespace") == self.namespace and entry["name"].startswith(GATEWAY_PREFIX)}

    def component(self, component_type: type[Component]) -> Any:
        """This shard's instance of ``component_type`` (for a component built on another)."""
        for component in self.components:
            if isinstance(component, component_type):
                return component
        raise LookupError(f"{self.name} has no {component_type.__name__}")

    # -- the gateway-facing entry points --------------------------------------------------

    def open_lane(self, node_id: str | None = None) -> tuple:
        """The address and secret of this shard's lane (started on first use): a Unix socket for a
        gateway on this node, TLS on the node's address for one elsewhere (with the certificate
        the gateway pins)."""
        with self._lock:
            if self._lane is None:
                self._lane = LaneServer(self.name, self.handle)
                self._lane.on_detach = self._lane_closed
                gc.freeze()  # the first gateway arrives once the shard is built: keep that out of scans
            lane = self._lane
        if node_id is not None and node_id == ray.get_runtime_context().get_node_id():
            return ("unix", lane.unix_address(), lane.secret)
        host, port = lane.tcp_address(ray.util.get_node_ip_address())
        return ("tcp", host, port, lane.secret, lane.certificate)

    def open_lane_with_epoch(self, node_id: str | None = None) -> tuple[tuple, str]:
        """:meth:`open_lane` and this process's epoch. The address and secret are this process's
        own, so the epoch is that of the very process the lane reaches: a gateway that learned the
        epoch by another call could miss a restart between that call and this one, and send over
        the lane without re-announcing its state."""
        return self.open_lane(node_id), self.epoch

    def handle(self, gateway_id: str, commands: list[tuple]) -> tuple[list[Any], tuple | None]:
        with self._lock:
            return self._handle(gateway_id, commands)

    def call(self, gateway_id: str, commands: list[tuple]) -> tuple[list[Any], tuple | None, str]:
        """:meth:`handle` as a Ray call, with the epoch that ran it: a gateway without a lane learns
        this way that the shard restarted (a lane never outlives its shard's process)."""
        with self._lock:
            results, bundle = self._handle(gateway_id, commands)
            return results, bundle, self.epoch

    def current_epoch(self) -> str:
        """This incarnation's epoch (a gateway asks after it lost its lane or a call)."""
        return self.epoch

    def _handle(self, gateway_id: str, commands: list[tuple]) -> tuple[list[Any], tuple | None]:
        self.now = contract.now_ms()
        components = self.components
        for component in components:
            component.before_batch()
        self._batches += 1
        self._commands += len(commands)
        if self._metrics is not None:
            self._metrics.batch(len(commands))
        results: list[Any] = []
        ops = self._ops
        retry_from = self._retry_from(commands) if self._healing else None
        for index, command in enumerate(commands):
            if retry_from is not None and index >= retry_from:
                if self._healing:
                    results.append(_RETRY)
                    continue
                retry_from = None  # the last gateway re-announced in this batch
            try:
                results.append(ops[command[0]](gateway_id, *command[1:]))
            except CommandError as error:
                results.append(error)
            except Exception as error:  # a bug must not take the batch down with it
                logger.exception("%s: command %r failed", self.name, command[0])
                results.append(CommandError("internal_error", f"{type(error).__name__}: {error}"))
        for component in components:
            try:
                component.after_batch()
            except Exception:
                self._abort(component, commands, results)
        return results, self._flush(gateway_id)

    def _retry_from(self, commands: list[tuple]) -> int | None:
        """While healing, the first command of this batch to retry: the one after its
        ``core.reannounced`` (those before it are the gateway's re-announcements), else the first.
        None once the deadline passed."""
        if time.monotonic() >= self._heal_deadline:
            logger.warning("%s: %d gateway(s) did not re-announce in time: %s", self.name, len(self._healing),
                           sorted(self._healing))
            self._healing = set()
            return None
        for index, command in enumerate(commands):
            if command[0] == Op.REANNOUNCED:
                return index + 1
        return 0

    def _reannounced(self, gateway_id: str) -> bool:
        if self._healing:
            self._healing.discard(gateway_id)
            if not self._healing:
                self.healed_in = round(time.monotonic() - self._started, 3)
                logger.warning("%s healed: every gateway re-announced in %.3fs", self.name, self.healed_in)
        return True

    def _abort(self, component: Component, commands: list[tuple], results: list[Any]) -> None:
        """``component`` could not commit: its commands of this batch fail (their writes were
        not stored), the others keep their results, and the component starts the next batch clean."""
        logger.exception("%s: %s could not commit a batch", self.name, type(component).__name__)
        try:
            component.abort_batch()
        except Exception:
            logger.exception("%s: %s could not drop the failed batch", self.name, type(component).__name__)
        owners = self._owners
        failed = CommandError("internal_error", "the write could not be stored")
        for index, command in enumerate(commands):
            if owners.get(command[0]) is component and not isinstance(results[index], CommandError):
                results[index] = failed

    def purge_gateway(self, gateway_id: str) -> int:
        """The gateway is gone: every component forgets its connections; its channel goes too."""
        with self._lock:
            self._gateways.pop(gateway_id, None)
            self._seq.pop(gateway_id, None)
            self._outbox.pop(gateway_id, None)
            if self._lane is not None:
                self._lane.drop(gateway_id)
            purged = 0
            for component in self.components:
                purged = max(purged, component.purge_gateway(gateway_id) or 0)
            self._flush(gateway_id)  # e.g. presence leaves of its actors, to the other gateways
            return purged

    def _lane_closed(self, gateway_id: str) -> None:
        """A gateway's lane closed: if the gateway is gone (its process died, and maybe the router
        that supervised it too), forget its connections now rather than when their TTLs end. A
        shard's lane (Baqend's document shards call query shards over lanes) holds no connection:
        nothing to watch or forget."""
        if gateway_id in self._watched or _is_shard(gateway_id):
            return
        self._watched.add(gateway_id)
        threading.Thread(target=self._watch_gateway, args=(gateway_id,), name=f"watch-{gateway_id}",
                         daemon=True).start()

    def _watch_gateway(self, gateway_id: str) -> None:
        try:
            for delay in GATEWAY_CHECKS_S:
                time.sleep(delay)
                lane = self._lane
                if lane is not None and gateway_id in lane.connected():
                    return  # it reconnected
                try:
                    ray.get_actor(gateway_name(gateway_id), namespace=self.namespace)
                except ValueError:
                    logger.warning("%s: gateway %s is gone; forgetting its connections", self.name, gateway_id)
                    self.purge_gateway(gateway_id)
                    return
        except Exception:
            logger.exception("%s: watching gateway %s failed", self.name, gateway_id)
        finally:
            self._watched.discard(gateway_id)

    def info(self) -> dict[str, Any]:
        """What ``router status`` shows: the Ray node it runs on, its gateways' lanes (and the kind
        of each: ``unix`` from a gateway on its node, ``tcp`` from another), the shards that call it
        over lanes, its counters and its components'."""
        with self._lock:
            callers = {} if self._lane is None else self._lane.kinds()
            kinds = {caller: kind for caller, kind in callers.items() if not _is_shard(caller)}
            lanes = None if self._lane is None else sorted(kinds)
            peers = sorted(caller for caller in callers if _is_shard(caller))
            node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
            return {"name": self.name, "kind": self.kind, "epoch": self.epoch, "pid": os.getpid(), "node": node,
                    "healing": sorted(self._healing), "healed_in": self.healed_in,
                    "batches": self._batches, "commands": self._commands, "lanes": lanes, "lane_kinds": kinds,
                    "shard_lanes": peers,
                    **self.stats()}

    def stats(self) -> dict[str, Any]:
        merged: dict[str, Any] = {}
        for component in self.components:
            merged.update(component.stats())
        return merged

    def _stats_op(self, gateway_id: str) -> dict[str, Any]:
        return self.stats()

    def _purge_connection(self, gateway_id: str, connection_id: int) -> bool:
        """Every component forgets the connection."""
        location = (gateway_id, connection_id)
        for component in self.components:
            component.purge_connection(location)
        return True

    # -- deliveries -----------------------------------------------------------------------

    def emit(self, routes: Routes, payload: Any, kind: int, meta: tuple | None) -> None:
        outbox = self._outbox
        for gateway_id, connection_ids in routes.items():
            item = (kind, payload, connection_ids, meta)  # router.contract.Delivery, inline: once per route
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
            bundle = contract.bundle(self.name, self.epoch, seq, items)
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


# After a gateway's lane closes, when to check whether the gateway still exists (seconds, each after
# the one before): a dead actor's name is released within moments; a live gateway reopens its lane.
GATEWAY_CHECKS_S = (0.5, 1.0, 2.0, 4.0, 8.0)
STORE_RETRY_FIRST_S, STORE_RETRY_MAX_S = 0.5, 5.0  # a shard starting while its store is unreachable

_RETRY = CommandError(contract.HEALING, "the shard is healing after a restart; retry")


def _is_shard(caller_id: str) -> bool:
    """Whether a lane's caller is a shard (it says its name, ``kind-shard-i``), not a gateway (whose
    ids, ``port-index-hex``, never have that part)."""
    return SHARD_SUFFIX in caller_id


def _restarted() -> bool:
    if not ray.is_initialized():
        return False
    context = ray.get_runtime_context()
    if context.get_actor_id() is None:
        return False  # not in a Ray actor (unit tests build shards directly)
    with warnings.catch_warnings():  # it reads a deprecated property inside Ray
        warnings.simplefilter("ignore", DeprecationWarning)
        return context.was_current_actor_reconstructed


# Ray restarts a crashed shard (with a new epoch); a command is never retried (it may have run).
ShardActor = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)(Shard)
