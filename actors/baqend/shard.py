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
from router.shardmap import shard_index, shard_name

logger = logging.getLogger(__name__)

_HEALING_RETRY_S = 0.01  # a healing query shard's refused writes go again after this


def _healing(call: Any) -> bool:
    """Whether a query shard refused a call's writes because it is healing (a failed call is done)."""
    try:
        results, _ = ray.get(call)
    except Exception:
        return False
    error = results[0] if results else None
    return isinstance(error, CommandError) and error.code == core.HEALING


class BaqendDocuments(Component):
    """The documents whose id hashes to this shard.

    Each write is checked (version, acl), buffered, and committed to its store at the end of the
    batch; then the batch's (before, after) images are sent to every query shard in one call
    each, stamped ``(index, epoch, seq)`` (see :mod:`actors.baqend.livequeries` for why that keeps
    initial results and events consistent).
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
        self._query_shards: list[Any] | None = None

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
        are documents of different shards (whose calls Ray would not order). A query shard that
        is healing after a restart (its gateways are still registering the live queries again)
        asks for them again: they must reach the queries registered meanwhile."""
        deadline = time.monotonic() + self._forward_timeout_s
        shards = self._queries()
        while shards:
            calls = [shard.handle.remote(self.shard.name, [command]) for shard in shards]
            _, pending = ray.wait(calls, num_returns=len(calls), timeout=max(0.0, deadline - time.monotonic()))
            if pending:
                logger.warning("%s: %d query shard(s) did not apply writes within %gs", self.shard.name,
                               len(pending), self._forward_timeout_s)
                return
            shards = [shard for shard, call in zip(shards, calls) if _healing(call)]
            if shards:
                time.sleep(_HEALING_RETRY_S)

    def abort_batch(self) -> None:
        self.table.rollback()
        self._forward = []  # no query shard hears of writes that were not stored

    def _queries(self) -> list[Any]:
        if self._query_shards is None:
            self._query_shards = [ray.get_actor(shard_name(QUERY, i), namespace=self.shard.namespace)
                                  for i in range(self.settings.shards.query)]
        return self._query_shards

    def stats(self) -> dict[str, Any]:
        return {"writes": self.table.writes, "seq": self._seq, "scan_pages": self._scan_pages,
                "scan_page_max_documents": self._page_max_documents, "scan_page_max_bytes": self._page_max_bytes}


class BaqendQueries(Component):
    """The real-time queries whose subscription key hashes here (:class:`QueryTable`); their
    ``InitialResult`` and ``Matches`` go to the subscribers as ``DELIVER_EVENT``."""

    name = "baqend"

    def __init__(self, shard: Any) -> None:
        super().__init__(shard)
        self.table = QueryTable()

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
        return self.table.stats()


# What Baqend adds to which shard kind (the dialect table reads it).
COMPONENTS = {DOCUMENT: (BaqendDocuments,), QUERY: (BaqendQueries,)}
