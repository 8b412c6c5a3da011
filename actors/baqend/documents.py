"""Baqend documents: storage, versioned writes, partial updates and ACLs (baqend-notes.md, "REST").

A document is a JSON object ``{"id": "/db/<Bucket>/<key>", "version", "acl", "createdAt",
"updatedAt", ...fields}``. :class:`DocumentTable` applies one write at a time with the version
check of ``If-Match`` and answers with the (before, after) images that real-time queries are
matched against; it keeps writes in a buffer until :meth:`DocumentTable.commit` writes them to
its :class:`DocumentStore` in one transaction. Pure apart from the store: no Ray, no sockets.
:func:`open_document_store` picks the store: SQLite under ``data_dir``, or PostgreSQL when
``store.url`` is set.
"""

from __future__ import annotations

import copy
import time
import weakref
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Callable, Container, Mapping, NamedTuple

import orjson
from psycopg_pool import ConnectionPool

from router.errors import CommandError
from router.ids import uuid4
from router.nesting import MAX_NESTING, too_deep
from router.pgtext import from_text, to_text
from router.postgres import create_schema, pool_of, transaction
from router.sqlite import open_wal, write_transaction

Document = dict[str, Any]
Principals = frozenset[str]  # "/db/User/<id>", "/db/Role/<name>"; empty = anonymous

NOT_FOUND = "not_found"
PRECONDITION_FAILED = "precondition_failed"
EXISTS = "exists"
BAD_REQUEST = "bad_request"
FORBIDDEN = "forbidden"

METADATA = ("id", "version", "acl", "createdAt", "updatedAt")
_READ_ONLY = frozenset({"id", "version", "createdAt", "updatedAt"})
# What a write answers a caller who may write the document but not read it.
_BLIND_FIELDS = ("id", "version", "createdAt", "updatedAt")

# What the store holds: a document nested deeper than MAX_NESTING, an integer beyond 64 bits, a
# longer field path or a bigger document is refused with 400 naming the rule.
MAX_PATH_PARTS = 32  # in a partial update's dotted path
INT_MIN, INT_MAX = -(1 << 63), (1 << 64) - 1  # what JSON decoders give and encoders write as integers
MAX_DOCUMENT_BYTES = 256 * 1024  # the default of baqend.max_document_bytes


def check_nesting(value: Any, what: str = "the object") -> None:
    """Raise ``bad_request`` when ``value`` nests deeper than :data:`MAX_NESTING`."""
    if too_deep(value):
        raise CommandError(BAD_REQUEST, f"{what} is nested deeper than {MAX_NESTING} levels")


def _integer(value: int | float) -> int | float:
    """An arithmetic result, refused when it leaves 64 bits (a decoded document never does)."""
    if isinstance(value, int) and not INT_MIN <= value <= INT_MAX:
        raise CommandError(BAD_REQUEST, "the object: integers must fit in 64 bits")
    return value


def encode_document(document: Document, max_bytes: int) -> bytes:
    """The stored body of ``document``, or ``bad_request`` naming the rule it breaks."""
    check_nesting(document)
    try:
        body = orjson.dumps(document)
    except orjson.JSONEncodeError as error:  # e.g. a value JSON cannot hold
        raise CommandError(BAD_REQUEST, f"the object cannot be stored: {error}") from None
    if len(body) > max_bytes:
        raise CommandError(BAD_REQUEST, f"the object would be {len(body)} bytes; the limit is {max_bytes}")
    return body


def visible(document: Document, principals: Principals) -> Document:
    """What a write answers: the document, or only its id and version for a caller who may write
    it but not read it (the acl's read rules hold for answers too)."""
    if readable(document, principals):
        return document
    return {name: document[name] for name in _BLIND_FIELDS if name in document}


_iso_second: tuple[int | None, str] = (None, "")  # the last second formatted, and its text up to the "."
_iso_last: tuple[int | None, str] = (None, "")  # the last millisecond formatted, and its text


def iso_now(now_ms: int) -> str:
    """Baqend's timestamp format: ISO-8601 UTC with milliseconds, ``2017-08-17T05:02:45.540Z``
    (every write stamps its document and every event frame carries one, thousands in a
    millisecond: the last millisecond's text is kept, and the second's text is formatted once a
    second)."""
    global _iso_second, _iso_last
    last = _iso_last
    if last[0] == now_ms:
        return last[1]
    second, millisecond = divmod(now_ms, 1000)
    cached = _iso_second
    if cached[0] != second:
        cached = _iso_second = (second, time.strftime("%Y-%m-%dT%H:%M:%S.", time.gmtime(second)))
    text = f"{cached[1]}{millisecond:03d}Z"
    _iso_last = (now_ms, text)
    return text


def object_id(bucket: str, key: str) -> str:
    return f"/db/{bucket}/{key}"


def new_key() -> str:
    return uuid4()


# -- access control ------------------------------------------------------------------------------


def permitted(rules: Any, principals: Principals) -> bool:
    """One permission of an ``acl`` (``{"/db/User/1": "allow", "/db/Role/x": "deny"}``).

    A principal that is denied never passes; when any principal is allowed, only those pass;
    with no rules everyone passes (the object is public for that permission).
    """
    if not rules or type(rules) is not dict:
        return True
    allowed = False
    for ref, rule in rules.items():
        if rule == "deny" and ref in principals:
            return False
        if rule == "allow":
            allowed = True
    if not allowed:
        return True
    return any(rules.get(ref) == "allow" for ref in principals)


def readable(document: Mapping[str, Any], principals: Principals) -> bool:
    acl = document.get("acl")
    return acl is None or type(acl) is not dict or permitted(acl.get("read"), principals)


def writable(document: Mapping[str, Any], principals: Principals) -> bool:
    acl = document.get("acl")
    return not isinstance(acl, Mapping) or permitted(acl.get("write"), principals)


# One reader for the same principals (most subscribers are anonymous or share their roles), so
# the queries of one text and one reader share their predicate and their result state
# (actors/baqend/rtquery.py, livequeries.py). An entry lives while a query holds its reader, so
# there are never more than live subscriptions (themselves bounded by the gateways' limits).
_readers: weakref.WeakValueDictionary[frozenset, Callable[[Mapping[str, Any]], bool]] = weakref.WeakValueDictionary()


def reader(principals: Principals) -> Callable[[Mapping[str, Any]], bool]:
    """What a subscriber with ``principals`` may read (a document's ``acl.read``)."""
    if type(principals) is not frozenset:
        principals = frozenset(principals)
    found = _readers.get(principals)
    if found is None:
        def found(document: Mapping[str, Any]) -> bool:
            return readable(document, principals)

        _readers[principals] = found
    return found


def check_acl(value: Any) -> Any:
    """An ``acl`` as sent: null, or ``{"read": {ref: "allow"|"deny"}, "write": {...}}``."""
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) - {"read", "write"}:
        raise CommandError(BAD_REQUEST, 'acl must be null or {"read": {...}, "write": {...}}')
    for name, rules in value.items():
        if rules is None:
            continue
        if not isinstance(rules, dict) or any(rule not in ("allow", "deny") for rule in rules.values()):
            raise CommandError(BAD_REQUEST, f'acl.{name} must map user or role ids to "allow" or "deny"')
    return value


# -- partial updates -----------------------------------------------------------------------------


def _parent(document: Document, path: str, create: bool) -> tuple[Any, str]:
    """The container holding the last part of a dotted path, and that part."""
    parts = path.split(".")
    if len(parts) > MAX_PATH_PARTS:
        raise CommandError(BAD_REQUEST, f"a field path has at most {MAX_PATH_PARTS} parts")
    if any(not part for part in parts):
        raise CommandError(BAD_REQUEST, f"invalid field path {path!r}")
    if parts[0] in _READ_ONLY:
        raise CommandError(BAD_REQUEST, f"{parts[0]} cannot be changed by a partial update")
    node: Any = document
    for part in parts[:-1]:
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise CommandError(BAD_REQUEST, f"{path}: no element {part}")
            node = node[int(part)]
            continue
        if not isinstance(node, dict):
            raise CommandError(BAD_REQUEST, f"{path}: {part} is not an object")
        child = node.get(part)
        if child is None:
            if not create:
                return None, parts[-1]
            child = node[part] = {}
        node = child
    return node, parts[-1]


def _get(document: Document, path: str) -> Any:
    node, name = _parent(document, path, False)
    if isinstance(node, dict):
        return node.get(name)
    if isinstance(node, list) and name.isdigit() and int(name) < len(node):
        return node[int(name)]
    return None


def _set(document: Document, path: str, value: Any) -> None:
    node, name = _parent(document, path, True)
    if isinstance(node, list):
        if not name.isdigit() or int(name) >= len(node):
            raise CommandError(BAD_REQUEST, f"{path}: no element {name}")
        node[int(name)] = value
    elif isinstance(node, dict):
        node[name] = value
    else:
        raise CommandError(BAD_REQUEST, f"{path}: the parent is not an object")


def _number(value: Any, operator: str, path: str) -> int | float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CommandError(BAD_REQUEST, f"{operator} on {path} needs a number")
    return value


def _list(document: Document, path: str, operator: str) -> list:
    current = _get(document, path)
    if current is None:
        current = []
        _set(document, path, current)
    if not isinstance(current, list):
        raise CommandError(BAD_REQUEST, f"{operator}: {path} is not an array")
    return current


def _arithmetic(operator: str) -> Callable[[Any, Any], Any]:
    return {
        "$inc": lambda a, b: a + b,
        "$dec": lambda a, b: a - b,
        "$mul": lambda a, b: a * b,
        "$min": min,
        "$max": max,
    }[operator]


_BITWISE = {"$and": lambda a, b: a & b, "$or": lambda a, b: a | b, "$xor": lambda a, b: a ^ b}
UPDATE_OPERATORS = frozenset({
    "$set", "$unset", "$inc", "$dec", "$mul", "$min", "$max", "$push", "$unshift", "$pop", "$shift", "$add",
    "$remove", "$put", "$replace", "$currentDate", "$rename", "$and", "$or", "$xor",
})


def apply_update(document: Document, operations: Any, now: str) -> Document:
    """A new document with the SDK's partial update ``{"$set": {"a.b": 1}, "$inc": {"n": 2}}`` applied."""
    if not isinstance(operations, dict) or not operations:
        raise CommandError(BAD_REQUEST, 'a partial update is an object such as {"$set": {"name": "x"}}')
    result = copy.deepcopy(document)
    for operator, fields in operations.items():
        if operator not in UPDATE_OPERATORS:
            raise CommandError(BAD_REQUEST, f"unknown update operator {operator}; known: "
                               + ", ".join(sorted(UPDATE_OPERATORS)))
        if not isinstance(fields, dict):
            raise CommandError(BAD_REQUEST, f"{operator} needs an object of field paths")
        for path, value in fields.items():
            _apply_one(result, operator, path, value, now)
    return result


def _apply_one(document: Document, operator: str, path: str, value: Any, now: str) -> None:
    if operator == "$set":
        _set(document, path, value)
    elif operator == "$unset":
        node, name = _parent(document, path, False)
        if isinstance(node, dict):
            node.pop(name, None)
    elif operator in ("$inc", "$dec", "$mul", "$min", "$max"):
        operand = _number(value, operator, path)
        current = _get(document, path)
        if current is None:
            current = 0 if operator in ("$inc", "$dec", "$mul") else operand
        _set(document, path, _integer(_arithmetic(operator)(_number(current, operator, path), operand)))
    elif operator in _BITWISE:
        if isinstance(value, bool) or not isinstance(value, int):
            raise CommandError(BAD_REQUEST, f"{operator} on {path} needs an integer")
        current = _get(document, path) or 0
        if isinstance(current, bool) or not isinstance(current, int):
            raise CommandError(BAD_REQUEST, f"{operator}: {path} is not an integer")
        _set(document, path, _integer(_BITWISE[operator](current, value)))
    elif operator == "$push":
        _list(document, path, operator).append(value)
    elif operator == "$unshift":
        _list(document, path, operator).insert(0, value)
    elif operator == "$pop":
        items = _list(document, path, operator)
        if items:
            items.pop()
    elif operator == "$shift":
        items = _list(document, path, operator)
        if items:
            items.pop(0)
    elif operator == "$add":
        items = _list(document, path, operator)
        if value not in items:
            items.append(value)
    elif operator == "$remove":
        current = _get(document, path)
        if isinstance(current, list):
            current[:] = [item for item in current if item != value]
        elif isinstance(current, dict):
            if not isinstance(value, str):
                raise CommandError(BAD_REQUEST, f"$remove on the map {path} needs a key")
            current.pop(value, None)
    elif operator == "$put":
        if not isinstance(value, dict):
            raise CommandError(BAD_REQUEST, f"$put on {path} needs an object")
        current = _get(document, path)
        if current is None:
            current = {}
            _set(document, path, current)
        if not isinstance(current, dict):
            raise CommandError(BAD_REQUEST, f"$put: {path} is not a map")
        current.update(value)
    elif operator == "$replace":
        node, name = _parent(document, path, False)
        if not isinstance(node, list) or not name.isdigit() or int(name) >= len(node):
            raise CommandError(BAD_REQUEST, f"$replace: {path} is not an element of an array")
        node[int(name)] = value
    elif operator == "$currentDate":
        _set(document, path, now)
    elif operator == "$rename":
        if not isinstance(value, str) or not value:
            raise CommandError(BAD_REQUEST, f"$rename of {path} needs the new field name")
        node, name = _parent(document, path, False)
        if isinstance(node, dict) and name in node:
            moved = node.pop(name)
            _set(document, value, moved)


# -- storage ---------------------------------------------------------------------------------------


class DocumentStore(ABC):
    """Where documents live; the table reads through it and writes in batches."""

    @abstractmethod
    def load(self, oid: str) -> Document | None: ...

    @abstractmethod
    def rows(self, bucket: str, after: str | None, limit: int) -> list[tuple[str, bytes]]:
        """Up to ``limit`` stored ``(id, body)`` of ``bucket`` with ids above ``after``, in id order."""

    @abstractmethod
    def save(self, rows: list[tuple[str, str, bytes | None]]) -> None:
        """Write ``(id, bucket, document or None to delete)`` rows atomically."""

    def close(self) -> None:
        pass


class MemoryDocumentStore(DocumentStore):
    def __init__(self) -> None:
        self.rows_by_id: dict[str, tuple[str, bytes]] = {}

    def load(self, oid: str) -> Document | None:
        row = self.rows_by_id.get(oid)
        return None if row is None else orjson.loads(row[1])

    def rows(self, bucket: str, after: str | None, limit: int) -> list[tuple[str, bytes]]:
        found = sorted((oid, body) for oid, (row_bucket, body) in self.rows_by_id.items()
                       if row_bucket == bucket and (after is None or oid > after))
        return found[:limit]

    def save(self, rows: list[tuple[str, str, bytes | None]]) -> None:
        for oid, bucket, body in rows:
            if body is None:
                self.rows_by_id.pop(oid, None)
            else:
                self.rows_by_id[oid] = (bucket, body)


class SqliteDocumentStore(DocumentStore):
    """One SQLite file (WAL) shared by the document shards of a machine; each reads its own ids."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._db = open_wal(path)
        self._db.execute("CREATE TABLE IF NOT EXISTS documents "
                         "(id TEXT PRIMARY KEY, bucket TEXT NOT NULL, body BLOB NOT NULL)")
        # Pages of a bucket in id order: (bucket, id) serves both the filter and the order.
        self._db.execute("CREATE INDEX IF NOT EXISTS documents_bucket_id ON documents (bucket, id)")
        self._db.execute("DROP INDEX IF EXISTS documents_bucket")  # its prefix, from before pages

    def load(self, oid: str) -> Document | None:
        row = self._db.execute("SELECT body FROM documents WHERE id = ?", (oid,)).fetchone()
        return None if row is None else orjson.loads(row[0])

    def rows(self, bucket: str, after: str | None, limit: int) -> list[tuple[str, bytes]]:
        return self._db.execute("SELECT id, body FROM documents WHERE bucket = ? AND id > ? ORDER BY id LIMIT ?",
                                (bucket, after or "", limit)).fetchall()

    def save(self, rows: list[tuple[str, str, bytes | None]]) -> None:
        with write_transaction(self._db) as db:
            for oid, bucket, body in rows:
                if body is None:
                    db.execute("DELETE FROM documents WHERE id = ?", (oid,))
                else:
                    db.execute("INSERT INTO documents (id, bucket, body) VALUES (?, ?, ?) ON CONFLICT(id) "
                               "DO UPDATE SET bucket = excluded.bucket, body = excluded.body",
                               (oid, bucket, body))

    def close(self) -> None:
        self._db.close()


class PostgresDocumentStore(DocumentStore):
    """Table ``baqend_documents`` of the cluster's database, shared by the document shards of every
    node; each reads its own ids.

    ``id`` and ``bucket`` are ``COLLATE "C"``: pages are in byte order of the UTF-8 ids, as SQLite
    and :class:`DocumentTable` (Python's ``sorted``) order them, whatever the database's default
    collation (``en_US`` puts ``a`` before ``B``). The ``(bucket, id)`` index then serves both the
    filter and the order. Ids go through :mod:`router.pgtext` (text cannot hold NUL).
    """

    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool
        create_schema(pool, "baqend_documents", [
            'CREATE TABLE IF NOT EXISTS baqend_documents (id TEXT COLLATE "C" PRIMARY KEY, '
            'bucket TEXT COLLATE "C" NOT NULL, body BYTEA NOT NULL)',
            "CREATE INDEX IF NOT EXISTS baqend_documents_bucket_id ON baqend_documents (bucket, id)"])

    def load(self, oid: str) -> Document | None:
        with self._pool.connection() as connection:
            row = connection.execute("SELECT body FROM baqend_documents WHERE id = %s", (to_text(oid),)).fetchone()
        return None if row is None else orjson.loads(row[0])

    def rows(self, bucket: str, after: str | None, limit: int) -> list[tuple[str, bytes]]:
        with self._pool.connection() as connection:
            found = connection.execute(
                "SELECT id, body FROM baqend_documents WHERE bucket = %s AND id > %s ORDER BY id LIMIT %s",
                (bucket, to_text(after or ""), limit)).fetchall()
        return [(from_text(oid), body) for oid, body in found]

    def save(self, rows: list[tuple[str, str, bytes | None]]) -> None:
        # Applied in order, a batch leaves each id as its last row says: so deletes and upserts
        # can go as two batched statements (one round trip each) instead of one per row.
        last = {oid: (bucket, body) for oid, bucket, body in rows}
        deletes = [(to_text(oid),) for oid, (_, body) in last.items() if body is None]
        upserts = [(to_text(oid), bucket, body) for oid, (bucket, body) in last.items() if body is not None]
        with transaction(self._pool) as connection:
            cursor = connection.cursor()
            if deletes:
                cursor.executemany("DELETE FROM baqend_documents WHERE id = %s", deletes)
            if upserts:
                cursor.executemany("INSERT INTO baqend_documents (id, bucket, body) VALUES (%s, %s, %s) "
                                   "ON CONFLICT (id) DO UPDATE SET bucket = excluded.bucket, body = excluded.body",
                                   upserts)


def open_document_store(settings: Any) -> DocumentStore:
    """PostgreSQL when ``settings.store.url`` is set, else the machine's SQLite file under ``data_dir``."""
    if settings.store.postgres:
        return PostgresDocumentStore(pool_of(settings.store))
    return SqliteDocumentStore(settings.data_dir / "documents.sqlite3")


# -- the table -------------------------------------------------------------------------------------

Write = tuple[Document | None, Document | None]  # (before image, after image)


class Page(NamedTuple):
    """One call's part of a bucket scan: the documents, the last id covered, their stored bytes."""

    documents: list[Document]
    upto: str | None  # None: nothing after this page
    nbytes: int
    others: tuple = ()  # the documents of ``include`` in the page's range that ``keep`` refused


class DocumentTable:
    """The documents one shard owns: versioned writes, buffered until :meth:`commit`.

    ``owns(id)`` tells which documents of a shared store belong to this table (for scans).
    Every write returns its (before, after) images; the caller forwards them to the queries.
    """

    def __init__(self, store: DocumentStore, owns: Callable[[str], bool] = lambda oid: True,
                 max_document_bytes: int = MAX_DOCUMENT_BYTES) -> None:
        self.store = store
        self.owns = owns
        self.max_document_bytes = max_document_bytes
        # id -> (bucket, document or None when deleted, its stored body): checked and encoded
        # when written, so a commit never meets a document the store cannot hold
        self._pending: dict[str, tuple[str, Document | None, bytes | None]] = {}
        self.writes = 0

    @property
    def dirty(self) -> bool:
        return bool(self._pending)

    def get(self, oid: str) -> Document | None:
        pending = self._pending.get(oid)
        if pending is not None:
            return pending[1]
        return self.store.load(oid)

    def scan(self, bucket: str, keep: Callable[[Document], bool] = lambda d: True, after: str | None = None,
             max_rows: int = 1000, max_bytes: int = 1 << 20, include: Container[str] = ()) -> Page:
        """One page of the bucket's documents that ``keep`` accepts, ids above ``after`` in id order.

        At most ``max_rows`` stored rows are read, and the documents stop before ``max_bytes`` of
        bodies (a page has at least one, so it always moves on). Writes not yet committed are
        seen as they will be stored. ``upto`` is the last id the page covers, None at the end.
        The documents of ``include`` that ``keep`` refuses come in ``others`` (a live query being
        rebuilt needs the current image of what its client holds), within the same byte bound.
        """
        rows = self.store.rows(bucket, after, max_rows)
        upto = rows[-1][0] if len(rows) == max_rows else None  # below it the store was read whole
        candidates: dict[str, tuple[Document | None, bytes | None]] = {
            oid: (None, body) for oid, body in rows if self.owns(oid)}
        for oid, (row_bucket, document, body) in self._pending.items():
            if row_bucket == bucket and (after is None or oid > after) and (upto is None or oid <= upto):
                candidates[oid] = (document, body)
        documents: list[Document] = []
        others: list[Document] = []
        size = total = 0  # bytes of the documents, and with the others (what bounds the page)
        examined = after
        for oid in sorted(candidates):
            document, body = candidates[oid]
            if body is None:  # deleted, not yet committed
                examined = oid
                continue
            if document is None:
                document = orjson.loads(body)
            matches = keep(document)
            if matches or oid in include:
                if total and total + len(body) > max_bytes:
                    return Page(documents, examined, size, tuple(others))
                total += len(body)
                if matches:
                    documents.append(document)
                    size += len(body)
                else:
                    others.append(document)
            examined = oid
        return Page(documents, upto, size, tuple(others))

    def commit(self) -> None:
        if not self._pending:
            return
        rows = [(oid, bucket, body) for oid, (bucket, _, body) in self._pending.items()]
        try:
            self.store.save(rows)
        finally:
            self._pending.clear()  # stored, or (the transaction rolled back) dropped: never stuck

    def rollback(self) -> None:
        """Forget the writes not yet committed (their commit failed)."""
        self._pending.clear()

    def _put(self, oid: str, bucket: str, document: Document | None) -> None:
        body = None if document is None else encode_document(document, self.max_document_bytes)
        self._pending[oid] = (bucket, document, body)
        self.writes += 1

    # -- writes ---------------------------------------------------------------------------------

    def insert(self, bucket: str, key: str, fields: Mapping[str, Any], now: str,
               principals: Principals = frozenset()) -> Write:
        oid = object_id(bucket, key)
        if self.get(oid) is not None:
            raise CommandError(EXISTS, f"the object {oid} already exists")
        document = self._stamp(oid, fields, 1, now, now)
        self._put(oid, bucket, document)
        return None, document

    def replace(self, bucket: str, key: str, fields: Mapping[str, Any], if_match: str | None, now: str,
                principals: Principals = frozenset()) -> Write:
        """PUT: with a version, only that version is replaced; ``*`` needs the object to exist;
        without ``If-Match`` the object is replaced or created (the SDK's forced save)."""
        oid = object_id(bucket, key)
        before = self._current(oid, if_match, principals, create=if_match is None)
        if before is None:
            after = self._stamp(oid, fields, 1, now, now)
        else:
            after = self._stamp(oid, fields, before["version"] + 1, before.get("createdAt", now), now)
        self._put(oid, bucket, after)
        return before, after

    def update(self, bucket: str, key: str, operations: Any, if_match: str | None, now: str,
               principals: Principals = frozenset()) -> Write:
        oid = object_id(bucket, key)
        before = self._current(oid, if_match, principals)
        changed = apply_update(before, operations, now)
        check_acl(changed.get("acl"))
        changed["version"] = before["version"] + 1
        changed["updatedAt"] = now
        self._put(oid, bucket, changed)
        return before, changed

    def delete(self, bucket: str, key: str, if_match: str | None, principals: Principals = frozenset()) -> Write:
        oid = object_id(bucket, key)
        before = self._current(oid, if_match, principals)
        self._put(oid, bucket, None)
        return before, None

    def _current(self, oid: str, if_match: str | None, principals: Principals, create: bool = False) -> Document | None:
        current = self.get(oid)
        if current is None:
            if create:
                return None
            raise CommandError(NOT_FOUND, f"the object {oid} does not exist")
        if not readable(current, principals) and not writable(current, principals):
            # hidden answers as missing: its existence is not revealed to who may neither read nor write it
            raise CommandError(NOT_FOUND, f"the object {oid} does not exist")
        if if_match not in (None, "*") and str(current["version"]) != if_match:
            raise CommandError(PRECONDITION_FAILED, f"the object {oid} is at version {current['version']}, "
                               f"not {if_match}")
        if not writable(current, principals):
            raise CommandError(FORBIDDEN, f"the acl of {oid} does not allow this write")
        return current

    @staticmethod
    def _stamp(oid: str, fields: Mapping[str, Any], version: int, created: str, now: str) -> Document:
        document: Document = {"id": oid, "version": version, "acl": check_acl(fields.get("acl")),
                              "createdAt": created, "updatedAt": now}
        for name, value in fields.items():
            if name not in METADATA:
                document[name] = value
        return document


def principals_of(claims: Mapping[str, Any]) -> Principals:
    """The user and roles a token speaks for: ``sub`` (a user id or ``/db/User/<id>``) and ``roles``."""
    refs: set[str] = set()
    subject = claims.get("sub")
    if isinstance(subject, str) and subject:
        refs.add(subject if subject.startswith("/db/") else f"/db/User/{subject}")
    roles = claims.get("roles")
    if isinstance(roles, list):
        for role in roles:
            if isinstance(role, str) and role:
                refs.add(role if role.startswith("/db/") else f"/db/Role/{role}")
    return frozenset(refs)
