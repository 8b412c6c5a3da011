"""Baqend's shards: documents by id, and real-time queries by subscription (docs/baqend.md)."""

from __future__ import annotations

import logging
import time
from typing import Any

import ray

from actors.baqend.contract import DOCUMENT, QUERY, Op, Scan, Write, writes
from actors.baqend.documents import (NOT_FOUND, DocumentTable, iso_now, object_id, open_document_store, readable,
                                     reader, visible)
from actors.baqend.livequeries import QueryTable
from actors.baqend.mongoquery import QueryError, compile_query
from actors.shard import Component, Handler
from router import contract as core
from router.contract import DELIVER_EVENT, Location
from router.errors import CommandError
from router.lane import BlockingLane, encode
from router.shardmap import shard_index, shard_name

logger = logging.getLogger(__name__)

_HEALING_RETRY_S = 0.01  # a healing query shard's refused writes go again after this
# After a lane to a query shard failed (or could not be opened), its writes go by Ray calls this
# long before a new lane is tried: a shard that is down costs one failed attempt, not one a batch.
_LANE_RETRY_S = 1.0
_LANE_CONNECT_S = 2.0  # the hello on a lane to a query shard (local, or TLS across nodes)


def _refused(results: list) -> bool:
    """Whether a query shard refused a batch's writes because it is healing."""
    error = results[0] if results else None
    return isinstance(error, CommandError) and error.code == core.HEALING


def _healing(call: Any) -> bool:
    """Whether a query shard refused a call's writes because it is healing (a failed call is done)."""
    try:
        results, _ = ray.get(call)
    except Exception:
        return False
    return _refused(results)


class _QueryShard:
    """A query shard as a document shard forwards writes to it: its Ray handle and its lane.

    Without a lane the writes go by Ray call: while ``open_lane`` (a Ray call too, awaited across
    batches rather than within one) is on its way, for :data:`_LANE_RETRY_S` after a lane failed,
    and while a Ray call that timed out is still pending (a lane would overtake it).
    """

    __slots__ = ("name", "handle", "lane", "opening", "retry_at", "late")

    def __init__(self, name: str, handle: Any) -> None:
        self.name = name
        self.handle = handle
        self.lane: BlockingLane | None = None
        self.opening: Any = None  # the open_lane call in flight
        self.retry_at = 0.0  # no new lane before this (time.monotonic())
        self.late: Any = None  # a Ray call that did not finish by its batch's deadline


class BaqendDocuments(Component):
    """The documents whose id hashes to this shard.

    Each write is checked (version, acl), buffered, and committed to its store at the end of the
    batch; then the batch's (before, after) images are sent to every query shard in one batch
    each, over a lane (a Ray call while there is none), stamped ``(index, epoch, seq)`` (see
    :mod:`actors.baqend.livequeries` for why that keeps initial results and events consistent).
    """

    name = "baqend"

    def __init__(self, shard: Any) -> None:
        super().__init__(shard)
        index, count = shard.index, self.settings.shards.document
        self.table = DocumentTable(open_document_store(self.settings),
                                   owns=lambda oid: shard_index(oid, count) == index,
                                   max_document_bytes=self.settings.baqend.max_document_bytes)
        self._seq = 0
        self._forward: list[Write] = []
        self._max_scan_documents = self.settings.baqend.max_scan_documents
        self._max_scan_bytes = self.settings.baqend.max_scan_bytes
        self._scan_pages = 0
        self._page_max_documents = self._page_max_bytes = 0  # the largest pages served (stats)
        self._forward_timeout_s = self.settings.baqend.request_timeout_s / 2
        self._query_shards: list[_QueryShard] | None = None
        self._node_id: str | None = None
        self._lane_batches = self._ray_batches = self._lanes_lost = 0

    def operations(self) -> dict[str, Handler]:
        return {Op.INSERT: self.insert, Op.REPLACE: self.replace, Op.UPDATE: self.update, Op.DELETE: self.delete,
                Op.GET: self.get, Op.SCAN: self.scan}

    def _written(self, bucket: str, before: Any, after: Any, operation: str, meta: tuple | None) -> None:
        self._seq += 1
        self._forward.append(Write(bucket, before, after, operation, self._seq, meta))

    def _iso(self) -> str:
        return iso_now(self.now)

    def insert(self, gateway_id, bucket, key, fields, principals=frozenset(), meta=None):
        before, after = self.table.insert(bucket, key, fields, self._iso(), principals)
        self._written(bucket, before, after, "insert", meta)
        return visible(after, principals)

    def replace(self, gateway_id, bucket, key, fields, if_match, principals=frozenset(), meta=None):
        before, after = self.table.replace(bucket, key, fields, if_match, self._iso(), principals)
        self._written(bucket, before, after, "update" if before is not None else "insert", meta)
        return visible(after, principals), before is None

    def update(self, gateway_id, bucket, key, operations, if_match, principals=frozenset(), meta=None):
        before, after = self.table.update(bucket, key, operations, if_match, self._iso(), principals)
        self._written(bucket, before, after, "update", meta)
        return visible(after, principals)

    def delete(self, gateway_id, bucket, key, if_match, principals=frozenset(), meta=None):
        before, after = self.table.delete(bucket, key, if_match, principals)
        self._written(bucket, before, after, "delete", meta)
        return visible(before, principals)

    def get(self, gateway_id, bucket, key, principals=frozenset()):
        oid = object_id(bucket, key)
        document = self.table.get(oid)
        if document is None or not readable(document, principals):
            # An object the caller may not read is reported as missing: its existence is not revealed.
            raise CommandError(NOT_FOUND, f"the object {oid} does not exist")
        return document

    def scan(self, gateway_id: str, bucket: str, query: Any = None, after: str | None = None,
             include: tuple = ()) -> Scan:
        """One page of the bucket's matching documents (ids above ``after``; bounded rows and
        bytes, so one call never holds the shard long nor fills a lane frame), and the stamp of
        the last write they include; with the current images of the ids of ``include`` in its
        range that do not match (what a client holds of a live query being rebuilt)."""
        try:
            keep = compile_query(query or {})
        except QueryError as error:
            raise CommandError("bad_request", str(error)) from None
        documents, upto, nbytes, others = self.table.scan(bucket, keep, after, self._max_scan_documents,
                                                          self._max_scan_bytes, frozenset(include))
        self._scan_pages += 1
        self._page_max_documents = max(self._page_max_documents, len(documents))
        self._page_max_bytes = max(self._page_max_bytes, nbytes)
        return Scan(self.shard.index, self.shard.epoch, self._seq, documents, upto, nbytes, others)

    def after_batch(self) -> None:
        if self.table.dirty:
            self.table.commit()  # before the answers leave and before any query hears of it
        if self._forward:
            items, self._forward = self._forward, []
            self._send(writes(self.shard.index, self.shard.epoch, items))

    def _send(self, command: tuple) -> None:
        """Hand a batch's writes to every query shard and wait until each has applied them: a
        client that writes B after A's answer then gets A's events before B's, even when A and B
        are documents of different shards (whose batches nothing else orders). A query shard that
        is healing after a restart (its gateways are still registering the live queries again)
        asks for them again: they must reach the queries registered meanwhile.

        The batch goes to every query shard first, then the replies are read: over lanes (a Ray
        call each way cost more than the matching). A query shard whose lane fails mid-call (its
        process died: a lane never outlives it) gets the batch again by Ray call, which waits for
        the restarted shard; it refuses it while healing, as above. Should the old process have
        applied it after all, the query shard drops the repeat (``BaqendQueries.writes``)."""
        deadline = time.monotonic() + self._forward_timeout_s
        batch = [command]
        encoded = None  # pickled once for every lane
        targets = self._queries()
        while targets:
            laned, calls = [], []
            for target in targets:
                lane = self._lane(target)
                if lane is not None:
                    try:
                        if encoded is None:
                            encoded = encode(batch)
                        lane.send(batch, deadline, encoded)
                        laned.append(target)
                        continue
                    except Exception as error:
                        self._lost(target, error)
                calls.append((target, self._call(target, batch)))
            healing, late = [], 0
            for target in laned:
                try:
                    results, _ = target.lane.receive(deadline)
                except TimeoutError:
                    late += 1  # the lane stays: its next reply read drops this one
                    continue
                except Exception as error:
                    self._lost(target, error)
                    calls.append((target, self._call(target, batch)))
                    continue
                self._lane_batches += 1
                if _refused(results):
                    healing.append(target)
            if calls:
                refs = [call for _, call in calls]
                _, pending = ray.wait(refs, num_returns=len(refs), timeout=max(0.0, deadline - time.monotonic()))
                pending = set(pending)
                for target, call in calls:
                    if call in pending:
                        target.late = call
                        late += 1
                    elif _healing(call):
                        healing.append(target)
            if late:
                logger.warning("%s: %d query shard(s) did not apply writes within %gs", self.shard.name, late,
                               self._forward_timeout_s)
                return
            targets = healing
            if targets:
                time.sleep(_HEALING_RETRY_S)

    def _call(self, target: _QueryShard, batch: list) -> Any:
        self._ray_batches += 1
        return target.handle.handle.remote(self.shard.name, batch)

    def _lane(self, target: _QueryShard) -> BlockingLane | None:
        """``target``'s lane, or None while its writes go by Ray call (see :class:`_QueryShard`)."""
        if target.lane is not None:
            return target.lane
        if target.late is not None:
            if ray.wait([target.late], timeout=0)[1]:
                return None
            target.late = None
        if target.opening is None:
            if time.monotonic() >= target.retry_at:
                if self._node_id is None:
                    self._node_id = ray.get_runtime_context().get_node_id()
                target.opening = target.handle.open_lane.remote(self._node_id)
            return None
        if not ray.wait([target.opening], timeout=0)[0]:
            return None
        opening, target.opening = target.opening, None
        try:
            target.lane = BlockingLane.connect(ray.get(opening), self.shard.name, _LANE_CONNECT_S)
        except Exception as error:
            target.retry_at = time.monotonic() + _LANE_RETRY_S
            logger.warning("%s: no lane to %s (%s); its writes go by Ray call for %gs", self.shard.name,
                           target.name, error, _LANE_RETRY_S)
        return target.lane

    def _lost(self, target: _QueryShard, error: Exception) -> None:
        """``target``'s lane failed: closed for good; Ray calls until :data:`_LANE_RETRY_S` passed."""
        if target.lane is not None:
            target.lane.close()
        target.lane = None
        target.retry_at = time.monotonic() + _LANE_RETRY_S
        self._lanes_lost += 1
        logger.warning("%s: the lane to %s failed (%s: %s); writes go by Ray call for %gs", self.shard.name,
                       target.name, type(error).__name__, error, _LANE_RETRY_S)

    def abort_batch(self) -> None:
        self.table.rollback()
        self._forward = []  # no query shard hears of writes that were not stored

    def _queries(self) -> list[_QueryShard]:
        if self._query_shards is None:
            names = [shard_name(QUERY, i) for i in range(self.settings.shards.query)]
            self._query_shards = [_QueryShard(name, ray.get_actor(name, namespace=self.shard.namespace))
                                  for name in names]
        return self._query_shards

    def stats(self) -> dict[str, Any]:
        return {"writes": self.table.writes, "seq": self._seq, "scan_pages": self._scan_pages,
                "scan_page_max_documents": self._page_max_documents, "scan_page_max_bytes": self._page_max_bytes,
                "forward_lanes": sum(1 for target in self._query_shards or () if target.lane is not None),
                "forward_lane_batches": self._lane_batches, "forward_ray_batches": self._ray_batches,
                "forward_lanes_lost": self._lanes_lost}


class BaqendQueries(Component):
    """The real-time queries whose subscription key hashes here (:class:`QueryTable`); their
    ``InitialResult`` and ``matches`` go to the subscribers as ``DELIVER_EVENT``."""

    name = "baqend"

    def __init__(self, shard: Any) -> None:
        super().__init__(shard)
        self.table = QueryTable()
        self._applied: dict[int, tuple[str, int]] = {}  # document shard -> (epoch, seq of its last write applied)
        self.repeated = 0  # writes a document shard sent again that had been applied (dropped)

    def operations(self) -> dict[str, Handler]:
        return {Op.SUBSCRIBE: self.subscribe, Op.PAGE: self.page, Op.LOAD: self.load,
                Op.UNSUBSCRIBE: self.unsubscribe, Op.WRITES: self.writes}

    def subscribe(self, gateway_id, key, connection_id, sub_id, spec, principals=frozenset(), known=None) -> bool:
        return self.table.add(key, (gateway_id, connection_id), sub_id, spec, reader(frozenset(principals)), known)

    def page(self, gateway_id: str, key: str, scan: Scan) -> bool:
        outputs = self.table.page(key, scan)
        if outputs is None:
            return False
        self._deliver(outputs)
        return True

    def load(self, gateway_id: str, key: str, pages: int) -> bool:
        outputs = self.table.load(key, pages)
        if outputs is None:
            return False
        self._deliver(outputs)
        return True

    def unsubscribe(self, gateway_id: str, key: str) -> bool:
        return self.table.remove(key)

    def writes(self, source_name: str, source: int, epoch: str, items: list) -> int:
        """Apply a document shard's writes. A shard sends its batches one at a time, each after
        the one before was applied, so its ``seq`` only grows within an epoch; a write at or
        below the last one applied is a batch sent again after its lane broke although it had
        run (the reply was lost), and is dropped: matching it twice would send its events twice."""
        applied = self._applied.get(source)
        if applied is not None and applied[0] == epoch and items and items[0].seq <= applied[1]:
            fresh = [item for item in items if item.seq > applied[1]]
            self.repeated += len(items) - len(fresh)
            items = fresh
        if not items:
            return 0
        self._applied[source] = (epoch, items[-1].seq)
        outputs = self.table.apply(source, epoch, items)
        self._deliver(outputs)
        return len(outputs)

    def _deliver(self, outputs: list) -> None:
        for (gateway_id, connection_id), payload in outputs:
            self.emit({gateway_id: (connection_id,)}, payload, DELIVER_EVENT)

    def purge_connection(self, location: Location) -> None:
        self.table.purge_connection(location)

    def purge_gateway(self, gateway_id: str) -> int:
        return self.table.purge_gateway(gateway_id)

    def stats(self) -> dict[str, Any]:
        return {**self.table.stats(), "repeated_writes": self.repeated}


# What Baqend adds to which shard kind (the dialect table reads it).
COMPONENTS = {DOCUMENT: (BaqendDocuments,), QUERY: (BaqendQueries,)}
