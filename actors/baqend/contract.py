"""Baqend between gateways and shards: documents by id (document shards), real-time queries by
subscription key (query shards), and the writes document shards forward to query shards."""

from __future__ import annotations

from typing import Any, NamedTuple

DOCUMENT = "document"  # shard kind: documents, by object id
QUERY = "query"  # shard kind: real-time queries, by subscription key


class Op:
    # document shards
    INSERT = "baqend.insert"
    REPLACE = "baqend.replace"
    UPDATE = "baqend.update"
    DELETE = "baqend.delete"
    GET = "baqend.get"
    SCAN = "baqend.scan"
    # query shards
    SUBSCRIBE = "baqend.subscribe"
    PAGE = "baqend.page"
    LOAD = "baqend.load"
    UNSUBSCRIBE = "baqend.unsubscribe"
    WRITES = "baqend.writes"  # from document shards


def object_key(bucket: str, key: str) -> str:
    """What places a document on its shard: its object id."""
    return f"/db/{bucket}/{key}"


# -- document shards ------------------------------------------------------------------------------

def insert(bucket: str, key: str, fields: dict, principals: frozenset = frozenset(), meta: tuple | None = None) -> tuple:
    """Answers the stored document."""
    return (Op.INSERT, bucket, key, fields, principals, meta)


def replace(bucket: str, key: str, fields: dict, if_match: int | None, principals: frozenset = frozenset(),
            meta: tuple | None = None) -> tuple:
    """Answers (the stored document, created?)."""
    return (Op.REPLACE, bucket, key, fields, if_match, principals, meta)


def update(bucket: str, key: str, operations: dict, if_match: int | None, principals: frozenset = frozenset(),
           meta: tuple | None = None) -> tuple:
    """Answers the stored document."""
    return (Op.UPDATE, bucket, key, operations, if_match, principals, meta)


def delete(bucket: str, key: str, if_match: int | None, principals: frozenset = frozenset(),
           meta: tuple | None = None) -> tuple:
    """Answers the deleted document."""
    return (Op.DELETE, bucket, key, if_match, principals, meta)


def get(bucket: str, key: str, principals: frozenset = frozenset()) -> tuple:
    return (Op.GET, bucket, key, principals)


def scan(bucket: str, query: Any = None, after: str | None = None) -> tuple:
    """Answers a :class:`Scan`: one page of the shard's matching documents with ids above ``after``."""
    return (Op.SCAN, bucket, query, after)


class Scan(NamedTuple):
    """One page of a document shard's scan: the matching documents of its ids up to ``upto``."""

    source: int  # the document shard's index
    epoch: str
    seq: int  # the last write the documents include
    documents: list
    upto: str | None  # the last id the page covers (scan on after it); None: the shard is done
    nbytes: int  # the documents' stored size


class Write(NamedTuple):
    """One write a document shard forwards to every query shard, in its order."""

    bucket: str
    before: Any  # the document before, or None
    after: Any  # the document after, or None
    operation: str  # insert | update | delete
    seq: int
    meta: tuple | None


# -- query shards ---------------------------------------------------------------------------------

def subscribe(key: str, connection_id: int, sub_id: str, spec: Any, principals: frozenset = frozenset()) -> tuple:
    """Register a query (its initial result follows ``load``); answers True."""
    return (Op.SUBSCRIBE, key, connection_id, sub_id, spec, principals)


def page(key: str, scan: Scan) -> tuple:
    """One page of a document shard's scan for a loading query, in the shard's page order;
    answers True (False if it is gone or already loaded)."""
    return (Op.PAGE, key, scan)


def load(key: str) -> tuple:
    """Every document shard's pages are in: build the query and send its result; answers True
    (False if it is gone)."""
    return (Op.LOAD, key)


def unsubscribe(key: str) -> tuple:
    return (Op.UNSUBSCRIBE, key)


def writes(source: int, epoch: str, items: list[Write]) -> tuple:
    return (Op.WRITES, source, epoch, items)


class InitialResult(NamedTuple):
    """A ``DELIVER_EVENT`` payload: the query's result when it starts."""

    key: str  # the subscription's key (unique; a client may reuse a subscription id later)
    documents: list


class Matches(NamedTuple):
    """A ``DELIVER_EVENT`` payload: the events one write caused in one query."""

    key: str
    events: list  # event fields
    meta: tuple | None
