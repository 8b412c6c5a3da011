"""The gateway's side of the actor hops: batched commands out, ordered deliveries in.

Commands to one shard are coalesced into one Ray call: a batch is sent on the next event-loop
turn (so everything that arrived in one read cycle travels together) or as soon as it holds
``batch_max`` commands. At most ``max_inflight_batches`` calls are out per shard; while they are,
new commands accumulate, so batches grow with load instead of calls piling up.

Results come back per command, in order, to a callback (or a future for code that awaits).
Deliveries come back as bundles, either inside a batch's result (those for this gateway) or
pushed by shards; :class:`DeliverySequencer` puts each shard's bundles back in emission order.

Each link knows its shard's epoch (one per process incarnation). When a link loses its lane or a
call fails because the actor died, it holds its commands until it has learnt the epoch again; a
new epoch means Ray restarted the shard empty, and ``on_restart(link)`` lets the gateway's
sessions re-announce what they hold there, ahead of the commands that were waiting.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
from collections import deque
from functools import partial
from typing import Any, Callable

from ray.exceptions import ActorUnavailableError, RayActorError

from router import contract
from router.contract import delivery_weight
from router import lane as lanes
from router.errors import CommandError, ShardUnavailable
from router.lane import LaneClient
from router.shardmap import shard_index

logger = logging.getLogger(__name__)

Callback = Callable[[Any], None]


def _serializable(command: tuple) -> bool:
    try:
        pickle.dumps(command, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # RecursionError, PicklingError, TypeError, …
        return False
    return True


_CLOCK_SLACK_S = 0.001  # a timer may fire this much before its deadline by the loop's clock
_HEALING_RETRY_S = 0.02  # a healing shard's retried commands go again after this


def _after_reannounced(commands: list[tuple]) -> int:
    """Where a gateway's own re-announcements end in ``commands`` (0 if none is queued)."""
    return next((i + 1 for i, command in enumerate(commands) if command[0] == contract.Op.REANNOUNCED), 0)


class _Batch:
    __slots__ = ("commands", "callbacks", "timeouts", "sent_at", "expired", "done", "results", "bundle", "abandoned",
                 "timer", "size")

    def __init__(self, commands: list[tuple], callbacks: list[Callback | None], timeouts: list[float | None],
                 sent_at: float) -> None:
        self.commands = commands  # kept to send again what a healing shard asks to retry
        self.callbacks = callbacks
        self.timeouts = timeouts  # per command: its dialect's request timeout; None once it timed out
        self.sent_at = sent_at
        self.expired = 0  # commands already answered with a timeout
        self.size = len(callbacks)
        self.done = False
        self.abandoned = False
        self.results: Any = None
        self.bundle: Any = None
        self.timer: asyncio.TimerHandle | None = None

    def waiting(self) -> list[Callback | None]:
        """The callbacks not yet answered (all of them unless some timed out)."""
        if not self.expired:
            return self.callbacks
        return [callback for callback, limit in zip(self.callbacks, self.timeouts) if limit is not None]


class ShardLink:
    """The outbox and in-flight batches of one shard actor.

    Batches go over the shard's lane (``router/lane.py``) when one is open, else as Ray calls. A
    link changes transport only while nothing is in flight, so the shard still runs its batches
    in the order they were sent.
    """

    __slots__ = ("name", "handle", "commands", "callbacks", "timeouts", "inflight", "scheduled", "lane",
                 "next_lane", "lane_batches", "reconnect", "epoch", "held", "hold", "held_at", "retried_head")

    def __init__(self, name: str, handle: Any) -> None:
        self.name = name
        self.handle = handle
        self.commands: list[tuple] = []
        self.callbacks: list[Callback | None] = []
        self.timeouts: list[float] = []
        self.inflight: deque[_Batch] = deque()
        self.scheduled = False
        self.lane: LaneClient | None = None
        self.next_lane: LaneClient | None = None  # connected, waiting for the Ray batches to finish
        self.lane_batches: deque[_Batch] = deque()  # sent over the lane, in order, not yet answered
        self.reconnect: asyncio.Task | None = None
        self.epoch: str | None = None  # the shard incarnation this link last heard from
        self.held = False  # commands wait: the shard may have restarted, its epoch is not known yet
        self.hold = 0  # which hold ``held`` is: a timer ends only its own hold, never a later one
        self.held_at = 0.0  # loop time the current hold began: an epoch asked before it cannot end it
        self.retried_head = 0  # commands a healing shard sent back, queued right after core.reannounced


class ShardClient:
    def __init__(
        self,
        gateway_id: str,
        shards: dict[str, list[tuple[str, Any]]],
        loop: asyncio.AbstractEventLoop,
        on_bundle: Callable[[tuple], None],
        batch_max: int,
        max_inflight: int,
        timeout_s: float,
        on_backlog: Callable[[bool], None] | None = None,
        max_pending: int = 200_000,
    ) -> None:
        self.gateway_id = gateway_id
        self.links = {kind: [ShardLink(name, handle) for name, handle in pairs] for kind, pairs in shards.items()}
        self.loop = loop
        self.on_bundle = on_bundle
        self.batch_max = batch_max
        self.max_inflight = max_inflight
        self.timeout_s = timeout_s
        self.on_backlog = on_backlog
        self.max_pending = max_pending
        self.lanes_paused = False  # pause_lanes: too many deliveries wait in the gateway
        self.lane_pauses = 0
        self.on_batch: Callable[[int], None] | None = None  # observes each batch's size
        # The gateway's corked writes (``corked_count()``, ``write_since(mark)``): a reply's answers
        # are written before its deliveries are applied.
        self.writes: Any = None
        self.pending = 0  # commands not yet answered
        self.backlogged = False
        self.batches_sent = 0
        self.commands_sent = 0
        self.lane_batches_sent = 0
        self.lanes_lost = 0
        self.restarts_seen = 0
        self.retried = 0  # commands a healing shard asked to send again
        self.node_id: str | None = None  # set by open_lanes: lanes are wanted
        self.on_restart: Callable[[ShardLink], None] | None = None
        self.closed = False

    # -- addressing -----------------------------------------------------------------------

    def link(self, kind: str, key: str) -> ShardLink:
        links = self.links[kind]
        return links[shard_index(key, len(links))]

    def all(self, kind: str) -> list[ShardLink]:
        return self.links[kind]

    # -- sending --------------------------------------------------------------------------

    def view(self, timeout_s: float) -> "ShardView":
        """A dialect's handle on this client: the same links and batches, its own request timeout."""
        return ShardView(self, timeout_s)

    def send(self, link: ShardLink, command: tuple, callback: Callback | None = None,
             timeout_s: float | None = None) -> None:
        """Queue ``command``; ``callback(result)`` runs with its result, or with a ShardUnavailable
        when the shard fails or has not answered after ``timeout_s`` (default: the client's)."""
        link.commands.append(command)
        link.callbacks.append(callback)
        link.timeouts.append(timeout_s or self.timeout_s)
        self.pending += 1
        if len(link.commands) >= self.batch_max:
            self._flush(link)
        elif not link.scheduled:
            link.scheduled = True
            self.loop.call_soon(self._flush_scheduled, link)
        if not self.backlogged and self.pending > self.max_pending:
            self.backlogged = True
            if self.on_backlog is not None:
                self.on_backlog(True)

    def request(self, link: ShardLink, command: tuple, timeout_s: float | None = None) -> asyncio.Future:
        future = self.loop.create_future()

        def resolve(result: Any) -> None:
            if future.done():
                return
            if isinstance(result, ShardUnavailable):
                future.set_exception(result)
            else:
                future.set_result(result)

        self.send(link, command, resolve, timeout_s)
        return future

    def send_each(self, requests: list[tuple[ShardLink, tuple]], on_results: Callable[[list], None],
                  timeout_s: float | None = None) -> None:
        """Send each ``(link, command)``; ``on_results(results)`` runs once, when every one has
        answered, with the results in ``requests`` order (a failure is its ShardUnavailable or
        CommandError, for the caller to judge)."""
        if not requests:
            on_results([])
            return
        results: list[Any] = [None] * len(requests)
        remaining = [len(requests)]

        def collect(index: int, result: Any) -> None:
            results[index] = result
            remaining[0] -= 1
            if not remaining[0]:
                on_results(results)

        for index, (link, command) in enumerate(requests):
            self.send(link, command, partial(collect, index), timeout_s)

    def send_all(self, links: list[ShardLink], command: tuple, on_results: Callable[[list], None],
                 timeout_s: float | None = None) -> None:
        """:meth:`send_each` of one ``command`` to each of ``links``."""
        self.send_each([(link, command) for link in links], on_results, timeout_s)

    async def gather(self, kind: str, command: tuple, timeout_s: float | None = None) -> list[Any]:
        """Send ``command`` to every shard of ``kind``; results in shard order."""
        return list(await asyncio.gather(*(self.request(link, command, timeout_s) for link in self.links[kind])))

    def _flush_scheduled(self, link: ShardLink) -> None:
        link.scheduled = False
        self._flush(link)

    def _flush(self, link: ShardLink) -> None:
        if link.held:
            return
        if link.next_lane is not None and not link.inflight:
            link.lane, link.next_lane = link.next_lane, None
        while link.commands and len(link.inflight) < self.max_inflight:
            batch_max = self.batch_max
            if link.retried_head:
                link.retried_head = max(0, link.retried_head - max(0, batch_max - _after_reannounced(link.commands)))
            commands, callbacks, timeouts = (link.commands[:batch_max], link.callbacks[:batch_max],
                                             link.timeouts[:batch_max])
            del link.commands[:batch_max]
            del link.callbacks[:batch_max]
            del link.timeouts[:batch_max]
            batch = _Batch(commands, callbacks, timeouts, self.loop.time())
            link.inflight.append(batch)
            self.batches_sent += 1
            self.commands_sent += len(commands)
            if self.on_batch is not None:
                self.on_batch(len(commands))
            lane = link.lane
            try:
                if lane is not None:
                    lane.call(commands)
                    link.lane_batches.append(batch)
                    self.lane_batches_sent += 1
                else:
                    ref = link.handle.call.remote(self.gateway_id, commands)
            except Exception as error:  # unpicklable, or the lane/handle itself is unusable
                if self._isolate_unsendable(link, batch, commands):
                    continue  # the others go in the next round of this loop
                batch.results = ShardUnavailable(f"{link.name}: {error}")
                batch.done = True
                self._drain(link)
                continue
            batch.timer = self.loop.call_later(min(timeouts), self._timed_out, link, batch)
            if lane is None:
                ref.future().add_done_callback(
                    lambda future, link=link, batch=batch: self.loop.call_soon_threadsafe(
                        self._completed, link, batch, future
                    )
                )

    def _isolate_unsendable(self, link: ShardLink, batch: _Batch, commands: list[tuple]) -> bool:
        """A batch could not be sent: when some of its commands cannot be serialized (a value
        nested too deep, an unpicklable object), answer just those with an error and put the
        others back at the head of the outbox. False when every command is fine (the transport
        itself failed)."""
        bad = {index for index, command in enumerate(commands) if not _serializable(command)}
        if not bad:
            return False
        link.inflight.remove(batch)
        error = CommandError("bad_request", "the request cannot be sent to a shard (nested too deep?)")
        keep = [index for index in range(len(commands)) if index not in bad]
        link.commands[0:0] = [commands[index] for index in keep]
        link.callbacks[0:0] = [batch.callbacks[index] for index in keep]
        link.timeouts[0:0] = [batch.timeouts[index] for index in keep]
        self.commands_sent -= len(commands)
        self.batches_sent -= 1
        self._answer([batch.callbacks[index] for index in sorted(bad)], error)
        return True

    # -- receiving ------------------------------------------------------------------------

    def _completed(self, link: ShardLink, batch: _Batch, future: Any) -> None:
        try:
            results, bundle, epoch = future.result()
        except Exception as error:
            results, bundle = ShardUnavailable(f"{link.name} unavailable: {type(error).__name__}"), None
            if isinstance(error, (RayActorError, ActorUnavailableError)):
                self._recover(link)
        else:
            self._epoch_seen(link, epoch, batch.sent_at)
        self._settle(link, batch, results, bundle)

    def _settle(self, link: ShardLink, batch: _Batch, results: Any, bundle: Any) -> None:
        if batch.timer is not None:
            batch.timer.cancel()
        if batch.abandoned:
            # Its callbacks were already told it timed out, but its deliveries still count:
            # the sequencer expects every bundle a shard emits.
            if bundle is not None:
                self.on_bundle(bundle)
            return
        batch.results, batch.bundle, batch.done = results, bundle, True
        self._drain(link)

    def _timed_out(self, link: ShardLink, batch: _Batch) -> None:
        """The earliest deadline in ``batch`` passed: answer the commands whose timeout it was with
        a timeout, and wait on for the others; once none waits, the batch is abandoned."""
        if batch.done:
            return
        waited = self.loop.time() - batch.sent_at
        callbacks, timeouts = batch.callbacks, batch.timeouts
        expired: dict[float, list[Callback | None]] = {}
        later: float | None = None
        for index, limit in enumerate(timeouts):
            if limit is None:
                continue
            if limit <= waited + _CLOCK_SLACK_S:
                expired.setdefault(limit, []).append(callbacks[index])
                callbacks[index] = timeouts[index] = None
                batch.expired += 1
            elif later is None or limit < later:
                later = limit
        if later is None:
            batch.abandoned = True
            try:
                link.inflight.remove(batch)
            except ValueError:
                pass
        else:
            batch.timer = self.loop.call_later(later - waited, self._timed_out, link, batch)
        for limit, answered in expired.items():
            self._answer(answered, ShardUnavailable(f"{link.name} did not answer in {limit:g}s", True))
        if later is None:
            self._flush(link)

    def _drain(self, link: ShardLink) -> None:
        """Hand results over in the order the batches were sent."""
        inflight = link.inflight
        while inflight and inflight[0].done:
            batch = inflight.popleft()
            results = batch.results
            if isinstance(results, ShardUnavailable):
                self._answer(batch.waiting(), results)
            else:
                self.pending -= batch.size - batch.expired
                writes = self.writes if batch.bundle is not None else None
                mark = writes.corked_count() if writes is not None else 0
                healing = False
                for callback, result in zip(batch.callbacks, results):
                    if result.__class__ is CommandError and result.code == contract.HEALING:
                        healing = True  # retried below: the loop of every answer keeps no index
                    elif callback is not None:
                        try:
                            callback(result)
                        except Exception:
                            logger.exception("result callback failed")
                if healing:
                    retry = [index for index, (callback, result) in enumerate(zip(batch.callbacks, results))
                             if result.__class__ is CommandError and result.code == contract.HEALING
                             and (callback is not None or batch.timeouts[index] is not None)]
                    if retry:
                        self._retry(link, batch, retry)
                if writes is not None:
                    writes.write_since(mark)
            if batch.bundle is not None:
                self.on_bundle(batch.bundle)
        self._check_backlog()
        if link.commands or (link.next_lane is not None and not inflight):
            self._flush(link)

    def _retry(self, link: ShardLink, batch: _Batch, indexes: list[int]) -> None:
        """A healing shard did not run these commands: send them again shortly, after this
        gateway's own re-announcements if those are still queued."""
        commands = link.commands
        # After the retried commands of earlier batches: they go again in the order they were sent.
        at = _after_reannounced(commands) + link.retried_head
        link.retried_head += len(indexes)
        commands[at:at] = [batch.commands[i] for i in indexes]
        link.callbacks[at:at] = [batch.callbacks[i] for i in indexes]
        link.timeouts[at:at] = [batch.timeouts[i] or self.timeout_s for i in indexes]
        self.pending += len(indexes)
        self.retried += len(indexes)
        if not link.held:  # the whole link pauses a moment: the shard would send everything back
            self._hold(link, _HEALING_RETRY_S, self._resume)

    def _hold(self, link: ShardLink, seconds: float, end: Callable[[ShardLink, int], None]) -> None:
        """Hold ``link``'s commands; ``end(link, hold)`` in ``seconds`` ends this hold if it is still
        the link's (an epoch learned meanwhile ends it sooner, and a later hold replaces it)."""
        link.held = True
        link.hold += 1
        link.held_at = self.loop.time()
        self.loop.call_later(seconds, end, link, link.hold)

    def _resume(self, link: ShardLink, hold: int) -> None:
        if link.held and link.hold == hold:
            link.held = False
            self._flush(link)

    def _answer(self, callbacks: list[Callback | None], error: Exception) -> None:
        self.pending -= len(callbacks)
        for callback in callbacks:
            if callback is not None:
                try:
                    callback(error)
                except Exception:
                    logger.exception("error callback failed")
        self._check_backlog()

    def _check_backlog(self) -> None:
        if self.backlogged and self.pending < self.max_pending // 2:
            self.backlogged = False
            if self.on_backlog is not None:
                self.on_backlog(False)

    # -- lanes ----------------------------------------------------------------------------

    async def open_lanes(self, node_id: str, timeout_s: float = 30.0) -> int:
        """Open a lane to every shard (until then, and whenever one is lost, batches go by Ray).

        Returns how many opened now; the others keep trying in the background."""
        self.node_id = node_id
        links = self._all_links()
        opened = await asyncio.gather(*(self._open_lane(link, timeout_s) for link in links), return_exceptions=True)
        for link, result in zip(links, opened):
            if result is not True:
                logger.warning("lane to %s not open yet (%s); using Ray calls meanwhile", link.name, result)
                self._reopen(link)
        return sum(1 for result in opened if result is True)

    async def learn_epochs(self, timeout_s: float = 30.0) -> None:
        """Without lanes: learn every shard's epoch now, so that a restart is told from a first call."""
        await asyncio.gather(*(self._probe(link, timeout_s) for link in self._all_links()))

    def _all_links(self) -> list[ShardLink]:
        return [link for kind_links in self.links.values() for link in kind_links]

    # -- restarts -------------------------------------------------------------------------

    async def _probe(self, link: ShardLink, timeout_s: float) -> None:
        asked_at = self.loop.time()
        epoch = await asyncio.wait_for(asyncio.wrap_future(link.handle.current_epoch.remote().future()), timeout_s)
        self._epoch_seen(link, epoch, asked_at)

    def _epoch_seen(self, link: ShardLink, epoch: str, asked_at: float) -> None:
        """The shard behind ``link`` runs as ``epoch`` (as of a call made at ``asked_at``). A new one
        (Ray restarted it, empty): the gateway re-announces what its connections hold there first,
        then the waiting commands go. The same one ends a hold only when it was asked after the hold
        began: an answer to a call made before the shard's death (its process answered, then died)
        says nothing of the process that follows."""
        known, link.epoch = link.epoch, epoch
        if known is not None and known != epoch:
            self.restarts_seen += 1
            logger.warning("%s restarted (epoch %s, was %s); re-announcing this gateway's state", link.name, epoch,
                           known)
            waiting = link.commands, link.callbacks, link.timeouts
            link.commands, link.callbacks, link.timeouts = [], [], []
            held, link.held = link.held, True  # the re-announce is queued whole, before the rest
            if self.on_restart is not None:
                try:
                    self.on_restart(link)
                except Exception:
                    logger.exception("re-announcing to %s failed", link.name)
            self.send(link, contract.reannounced())  # the shard serves everyone once all gateways sent it
            link.held = held
            link.commands += waiting[0]
            link.callbacks += waiting[1]
            link.timeouts += waiting[2]
        if link.held and (known != epoch or asked_at >= link.held_at):
            link.held = False
        if link.commands and not link.scheduled:
            link.scheduled = True
            self.loop.call_soon(self._flush_scheduled, link)

    def poll_epochs(self) -> None:
        """Without lanes (a lane's closing tells of a restart): ask every shard its epoch, since a
        restart would otherwise be noticed only by the next command, and a shard holding this
        gateway's subscriptions may get none for a long time."""
        if self.node_id is not None:
            return
        for link in self._all_links():
            if link.epoch is not None and (link.reconnect is None or link.reconnect.done()):
                link.reconnect = self.loop.create_task(self._poll(link))

    async def _poll(self, link: ShardLink) -> None:
        try:
            await self._probe(link, self.timeout_s)
        except Exception as error:  # restarting: the next sweep asks again
            logger.info("shard %s: epoch not known (%s)", link.name, type(error).__name__)

    def _recover(self, link: ShardLink) -> None:
        """``link`` lost its lane or a call: hold its commands until its epoch is known again (for at
        most the request timeout; the commands then go and may time out), and reopen its lane."""
        if self.closed:
            return
        self._hold(link, self.timeout_s, self._release)  # its own deadline, also over a healing pause
        self._reopen(link)

    def _release(self, link: ShardLink, hold: int) -> None:
        if link.held and link.hold == hold:
            logger.warning("%s: epoch still unknown after %gs; sending its commands anyway", link.name, self.timeout_s)
            link.held = False
            self._flush(link)

    async def _open_lane(self, link: ShardLink, timeout_s: float) -> bool:
        # The epoch comes with the address: that of the process the lane reaches (a probe before
        # would miss a restart between it and this call, and nothing would be re-announced).
        asked_at = self.loop.time()
        address, epoch = await asyncio.wait_for(
            asyncio.wrap_future(link.handle.open_lane_with_epoch.remote(self.node_id).future()), timeout_s)

        def factory() -> LaneClient:
            return LaneClient(lambda results, bundle: self._lane_reply(link, results, bundle), self.on_bundle,
                              lambda lane, exc: self._lane_lost(link, lane, exc))

        lane = await asyncio.wait_for(lanes.connect(self.loop, address, self.gateway_id, factory), timeout_s)
        if self.closed:
            lane.close()
            return False
        link.next_lane = lane
        if self.lanes_paused:
            self._pause_lane(lane, True)
        self._epoch_seen(link, epoch, asked_at)  # a restart's re-announce goes first, over this lane
        if not link.inflight:
            self._flush(link)
        return True

    def pause_lanes(self, paused: bool) -> None:
        """Stop (or go back to) reading every lane: while the gateway has more deliveries waiting
        than it writes in a few loop turns, the rest stays with the shards (``DeliverySequencer``)."""
        self.lanes_paused = paused
        self.lane_pauses += paused
        for link in self._all_links():
            for lane in (link.lane, link.next_lane):
                self._pause_lane(lane, paused)

    @staticmethod
    def _pause_lane(lane: LaneClient | None, paused: bool) -> None:
        transport = None if lane is None else lane.transport
        if transport is not None and not transport.is_closing():
            if paused:
                transport.pause_reading()
            else:
                transport.resume_reading()

    def _lane_reply(self, link: ShardLink, results: Any, bundle: Any) -> None:
        self._settle(link, link.lane_batches.popleft(), results, bundle)

    def _lane_lost(self, link: ShardLink, lane: LaneClient, exc: Exception | None) -> None:
        if link.next_lane is lane:
            # Lost before it took over from Ray calls: nothing went over it; open another.
            link.next_lane = None
            self.lanes_lost += 1
            if not self.closed:
                self._reopen(link)
            return
        if link.lane is not lane:
            return
        link.lane = None
        self.lanes_lost += 1
        if not self.closed:
            logger.warning("lane to %s lost (%s); reopening", link.name, exc or "closed")
            self._recover(link)  # first: what the failures' callbacks send waits for the epoch
        failed, link.lane_batches = link.lane_batches, deque()
        error = ShardUnavailable(f"{link.name}: lane lost")
        for batch in failed:
            self._settle(link, batch, error, None)

    def _reopen(self, link: ShardLink) -> None:
        """Until the link knows its epoch and (when lanes are wanted) has a lane again, keep trying."""
        if link.reconnect is not None and not link.reconnect.done():
            return

        async def retry() -> None:
            delay = 0.1
            while not self.closed:
                try:
                    if self.node_id is None or link.lane is not None or link.next_lane is not None:
                        if not link.held:
                            return
                        await self._probe(link, 30.0)  # no lane to open: the epoch is enough
                    elif not await self._open_lane(link, 30.0):
                        return
                    if not link.held:
                        return
                    # Still held: a hold began after the epoch was asked (another call failed
                    # meanwhile), which only an epoch asked after it ends: ask again, shortly.
                    await asyncio.sleep(_HEALING_RETRY_S)
                    continue
                except Exception as error:  # the shard is restarting, or gone for now
                    logger.info("shard %s: %s; retrying in %.1fs", link.name, type(error).__name__, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

        link.reconnect = self.loop.create_task(retry())

    def close(self) -> None:
        """Stop using lanes (the gateway stops)."""
        self.closed = True
        for kind_links in self.links.values():
            for link in kind_links:
                if link.reconnect is not None:
                    link.reconnect.cancel()
                for lane in (link.lane, link.next_lane):
                    if lane is not None:
                        lane.close()

    def stats(self) -> dict[str, Any]:
        links = self._all_links()
        return {
            "pending": self.pending,
            "batches": self.batches_sent,
            "commands": self.commands_sent,
            "mean_batch": round(self.commands_sent / self.batches_sent, 2) if self.batches_sent else 0.0,
            "lanes": sum(1 for link in links if link.lane is not None),
            "lane_batches": self.lane_batches_sent,
            "lanes_lost": self.lanes_lost,
            "lanes_paused": self.lanes_paused,
            "lane_pauses": self.lane_pauses,
            "restarts_seen": self.restarts_seen,
            "retried": self.retried,
            "held": sum(1 for link in links if link.held),
        }


class ShardView:
    """A dialect's handle on the gateway's :class:`ShardClient`: the same links and batches (a
    dialect's commands share batches with every other's), with the dialect's own request timeout
    (its ``request_timeout_s``)."""

    __slots__ = ("client", "timeout_s", "link", "all")

    def __init__(self, client: ShardClient, timeout_s: float) -> None:
        self.client = client
        self.timeout_s = timeout_s
        self.link = client.link
        self.all = client.all

    def send(self, link: ShardLink, command: tuple, callback: Callback | None = None) -> None:
        self.client.send(link, command, callback, self.timeout_s)

    def request(self, link: ShardLink, command: tuple) -> asyncio.Future:
        return self.client.request(link, command, self.timeout_s)

    def send_each(self, requests: list[tuple[ShardLink, tuple]], on_results: Callable[[list], None]) -> None:
        self.client.send_each(requests, on_results, self.timeout_s)

    def send_all(self, links: list[ShardLink], command: tuple, on_results: Callable[[list], None]) -> None:
        self.client.send_all(links, command, on_results, self.timeout_s)

    async def gather(self, kind: str, command: tuple) -> list[Any]:
        return await self.client.gather(kind, command, self.timeout_s)


class _Source:
    """What the sequencer knows of one shard: its epoch, the next bundle it expects, the early
    ones waiting for it, and the timer of the current gap."""

    __slots__ = ("epoch", "expected", "waiting", "timer")

    def __init__(self, epoch: str) -> None:
        self.epoch = epoch
        self.expected = 0
        self.waiting: dict[int, list] = {}  # seq -> items, arrived before `expected`
        self.timer: asyncio.TimerHandle | None = None


class DeliverySequencer:
    """Applies each shard's delivery bundles in the order the shard emitted them.

    A bundle that arrives early waits for the ones before it; if a gap lasts longer than
    ``timeout_s`` (a bundle was lost, e.g. its call failed), the sequencer skips past it and
    counts the skip. A new epoch (the shard restarted) starts a fresh sequence.

    At most about ``max_per_turn`` deliveries (``contract.delivery_weight``) are applied in one event-loop
    turn, counted over every bundle of the turn: the rest, and every bundle after it, wait in order
    for the next turns, so that one shard reply (a thousand publishes to a thousand subscribers
    each) never holds the loop for seconds: reads, acks, pings and timers run between the slices,
    and each slice is written before the next is applied. An item is never split (a message to
    more connections than the limit is one slice). While more than ``BACKLOG_TURNS`` turns' worth
    wait, ``on_backlog(True)`` (the gateway stops reading its lanes, so the shards hold what follows
    as they did while a long turn held the loop); ``on_backlog(False)`` once one turn's worth is left.
    """

    BACKLOG_TURNS = 8

    def __init__(self, apply: Callable[[list], None], timeout_s: float, loop: asyncio.AbstractEventLoop,
                 max_per_turn: int = 0, on_backlog: Callable[[bool], None] | None = None) -> None:
        self.apply = apply
        self.timeout_s = timeout_s
        self.loop = loop
        self._sources: dict[str, _Source] = {}
        self._retired: dict[str, set[str]] = {}  # source -> epochs it has moved past
        self.skipped = 0
        self.stale = 0
        self.max_per_turn = max_per_turn  # 0: no limit
        self.on_backlog = on_backlog
        self._later: deque = deque()  # items, in order, left for the next turns
        self._later_count = 0  # their deliveries
        self._continuing = False
        self._spent = 0  # deliveries applied in this loop turn
        self._turn_scheduled = False
        self.backlogged = False
        self.closed = False
        self.sliced = 0  # turns that left deliveries for a later one

    def accept(self, bundle: tuple) -> None:
        source, epoch, seq, items = bundle
        state = self._sources.get(source)
        if state is None or state.epoch != epoch:
            retired = self._retired.setdefault(source, set())
            if epoch in retired:
                self.stale += 1  # a straggler from before the shard restarted
                return
            if state is not None:
                retired.add(state.epoch)
                if state.timer is not None:
                    state.timer.cancel()
            state = self._sources[source] = _Source(epoch)
        expected = state.expected
        if seq == expected:
            self._apply(items)
            state.expected = expected + 1
            if state.waiting:
                self._drain(source, state)
        elif seq > expected:
            state.waiting[seq] = items
            if state.timer is None:
                state.timer = self.loop.call_later(self.timeout_s, self._gap_expired, source)
        else:
            self.stale += 1

    def _drain(self, source: str, state: _Source) -> None:
        """The gap before ``state.expected`` closed: apply what waited behind it. A later gap (a
        bundle still missing further on) gets a wait of its own: the closed gap's timer would
        skip it before it had been the first one missing for ``timeout_s``."""
        waiting = state.waiting
        while state.expected in waiting:
            self._apply(waiting.pop(state.expected))
            state.expected += 1
        if state.timer is not None:
            state.timer.cancel()
            state.timer = None
        if waiting:
            state.timer = self.loop.call_later(self.timeout_s, self._gap_expired, source)

    def _gap_expired(self, source: str) -> None:
        state = self._sources.get(source)
        if state is None:
            return
        state.timer = None
        if not state.waiting:
            return
        first = min(state.waiting)
        self.skipped += first - state.expected
        logger.warning("deliveries from %s: gap of %d bundle(s) skipped", source, first - state.expected)
        state.expected = first
        self._drain(source, state)

    def _apply(self, items: list) -> None:
        limit = self.max_per_turn
        if not limit:
            self._run(items)
            return
        if self.closed:
            return
        if self._later:  # earlier deliveries still wait for their turn: these go behind them
            self._defer(items, 0)
            return
        budget = limit - self._spent
        cut, count = 0, 0
        if budget > 0:
            cut = len(items)
            for index, item in enumerate(items):
                count += delivery_weight(item)
                if count >= budget:
                    cut = index + 1
                    break
        if cut < len(items):
            self._defer(items, cut)  # queued before the run: whatever the run causes comes behind
        if cut:
            self._charge(count)
            self._run(items if cut == len(items) else items[:cut])
        self._continue_later()

    @property
    def waiting(self) -> int:
        """Deliveries left for the next loop turns."""
        return self._later_count

    def _run(self, items: list) -> None:
        try:
            self.apply(items)
        except Exception:
            logger.exception("applying deliveries failed")

    def _defer(self, items: list, start: int) -> None:
        later = self._later
        count = 0
        for index in range(start, len(items)):
            item = items[index]
            later.append(item)
            count += delivery_weight(item)
        self._later_count += count
        if not self.backlogged and self._later_count > self.BACKLOG_TURNS * self.max_per_turn:
            self._set_backlogged(True)

    def _charge(self, count: int) -> None:
        """``count`` deliveries applied in this turn; the count starts again with the next turn."""
        self._spent += count
        if not self._turn_scheduled:
            self._turn_scheduled = True
            self.loop.call_soon(self._new_turn)

    def _new_turn(self) -> None:
        self._spent = 0
        self._turn_scheduled = False

    def _continue_later(self) -> None:
        """Scheduled after a slice is applied, so the next turn runs, in order: the turn's count
        reset, the slice's writes (scheduled as it was applied), then the next slice."""
        if self._later and not self._continuing:
            self._continuing = True
            self.sliced += 1
            self.loop.call_soon(self._continue)

    def _continue(self) -> None:
        """The next slice of the deliveries left for later (after the I/O of the turn between)."""
        self._continuing = False
        if self.closed:
            return
        later, limit = self._later, self.max_per_turn
        items, count = [], 0
        while later and count < limit:
            item = later.popleft()
            items.append(item)
            count += delivery_weight(item)
        self._later_count -= count
        if self.backlogged and self._later_count <= limit:
            self._set_backlogged(False)
        self._charge(count)
        self._run(items)
        self._continue_later()

    def _set_backlogged(self, backlogged: bool) -> None:
        self.backlogged = backlogged
        if self.on_backlog is not None:
            try:
                self.on_backlog(backlogged)
            except Exception:
                logger.exception("backlog callback failed")

    def close(self) -> None:
        """The gateway stops: what still waits is dropped (its connections are gone)."""
        self.closed = True
        self._later.clear()
        self._later_count = 0
        self.backlogged = False

    def forget(self, source: str) -> None:
        self._retired.pop(source, None)
        state = self._sources.pop(source, None)
        if state is not None and state.timer is not None:
            state.timer.cancel()

