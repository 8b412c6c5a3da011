"""One Baqend real-time query: its result, and the match events each write causes.

The logic of baqend-realtime-queries.md and baqend-notes.md ("Sorted windows") as a plain class, in
the style of InvaliDB: the query is validated and compiled once, loaded with the bucket's
documents, then told every write as (before image, after image, operation); it answers with the
events to send, already filtered by the subscription's ``matchTypes`` or ``operations``. The
shard that owns the query adds ``id``, ``type`` and ``date``. Pure: no I/O, no Ray.

A sorted query (sort, limit or offset given) keeps the sort key of *every* matching document, not
only the visible window, in a sorted list: an item leaving the window is replaced by the next one
at once, so the window never needs a re-query and never drifts from the database.
"""

from __future__ import annotations

import weakref
from bisect import bisect_left
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Mapping

import orjson
from sortedcontainers import SortedList

from actors.baqend.mongoquery import QueryError, UnsupportedQueryError, compile_query
from actors.baqend.sortkey import parse_sort, sort_key

MAX_RESULT = 500  # offset + limit of a sorted query
# A sorted query keeps its entries in a plain list while there are at most this many: a write finds
# and takes its place with one search and one insert done in C, where a SortedList runs its own
# Python code for each. Longer, they move to a SortedList (a plain list's insert moves every later
# entry), and back once they are fewer than half of it. SortedList's own lists hold up to 2,000.
LIST_MAX = 2000
MATCH_TYPES = frozenset({"add", "change", "changeIndex", "remove", "match"})
OPERATIONS = frozenset({"insert", "update", "delete", "none"})
WRITES = frozenset({"insert", "update", "delete"})
_SUBSUMED_BY_MATCH = frozenset({"add", "change", "changeIndex"})

BAD_REQUEST = "Bad Request"
NOT_SUPPORTED = "Query Not Supported"
BOTH_FILTERS = (
    "Only subscriptions for either operations or matchTypes are allowed. "
    "You cannot subscribe to a query using matchTypes and operations at the same time!"
)

Document = Mapping[str, Any]


class SubscriptionError(QueryError):
    """A subscribe message is refused: the fields of the error message the spec sends."""

    def __init__(self, message: str, status: int = 400, reason: str = BAD_REQUEST) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.reason = reason

    @property
    def error(self) -> dict[str, Any]:
        """The ``error`` object of the error message."""
        return {"message": self.message, "status": self.status, "reason": self.reason}

    def __reduce__(self):  # keep the fields through pickling (Ray serialises errors)
        return (SubscriptionError, (self.message, self.status, self.reason))


@dataclass(frozen=True, slots=True)
class Event:
    """One match message's own fields; ``index`` only on add/change/changeIndex of sorted queries."""

    match_type: str
    operation: str
    data: Document
    index: int | None = None

    def fields(self) -> dict[str, Any]:
        fields: dict[str, Any] = {"matchType": self.match_type, "operation": self.operation, "data": self.data}
        if self.index is not None:
            fields["index"] = self.index
        return fields


class RealtimeQuery:
    """A subscription's query over one bucket: validated, compiled, and kept up to date.

    ``query`` and ``sort`` may be the JSON strings of the subscribe message or decoded objects.
    Documents are JSON objects with an ``id``; they are kept by reference and must not be mutated
    afterwards (each write hands over new images).
    """

    # Slots: a query shard holds one per distinct query and reads a handful of them on every
    # write; in the object itself they are fewer cache lines away than in an instance dict.
    __slots__ = ("_visible", "predicate", "offset", "is_sorted", "limit", "match_types", "operations",
                 "_id_field", "share_key", "_documents", "_entries", "_order", "_key")

    def __init__(
        self,
        query: Mapping[str, Any] | str | None = None,
        sort: Any = None,
        offset: Any = 0,
        limit: Any = None,
        match_types: Any = None,
        operations: Any = None,
        documents: Iterable[Document] = (),
        id_field: str = "id",
        visible: Callable[[Document], bool] | None = None,
    ) -> None:
        # ``visible`` hides documents the subscriber may not read (their acl): a hidden document
        # is treated as not matching, so one that becomes hidden leaves the result.
        matches, text = _compile(query)
        self._visible = visible
        # What a document must satisfy to be in the result: one object for every query of the
        # same text and the same ``visible`` check (:func:`_compile` and :func:`_restricted` share
        # them), so a caller matching one write against many queries tests it once per predicate.
        self.predicate = matches if visible is None else _restricted(matches, visible, text)
        spec = _sort_spec(sort)
        self.offset = _offset(offset)
        requested_limit = _limit(limit)
        self.is_sorted = bool(spec) or requested_limit is not None or self.offset > 0
        # A missing limit means all that is allowed, and a larger one is capped (the guide's
        # "limit(500) with offset(5) is registered as limit(495)").
        self.limit: int | None = None
        if self.is_sorted:
            self.limit = min(requested_limit or MAX_RESULT, MAX_RESULT - self.offset)
        self.match_types = _choice(match_types, "all", MATCH_TYPES, "match types")
        self.operations = _choice(operations, "any", OPERATIONS, "operations")
        if self.match_types is not None and self.operations is not None:
            raise SubscriptionError(BOTH_FILTERS)
        self._id_field = id_field
        # Queries with equal keys hold the same result once they have seen the same writes: a
        # caller may keep one of them for all (QueryTable's shared states). None: not shareable.
        self.share_key = None if text is None or id_field != "id" else (
            text, spec, self.offset, self.limit, self.match_types, self.operations, visible)
        self._documents: dict[Any, Document] = {}  # id -> current image, every matching object
        self._entries: dict[Any, tuple] = {}  # id -> its sort key (the id last), sorted queries
        self._order: list | SortedList = []  # the entries in order (LIST_MAX)
        self._key = sort_key(spec, id_field)
        for document in documents:
            self._admit(document)

    # -- reading ---------------------------------------------------------------------------

    def matches(self, document: Document) -> bool:
        return self.predicate(document)

    def result(self) -> list[Document]:
        """The current result: the visible window in order, or every match (in arrival order)."""
        if not self.is_sorted:
            return list(self._documents.values())
        window = self._order[self.offset:self.offset + self.limit]
        return [self._documents[entry[-1]] for entry in window]

    def __len__(self) -> int:
        """Matching documents, including those outside the window."""
        return len(self._documents)

    def document(self, object_id: Any) -> Document | None:
        """The current image of a matching document (in the window or not), None if none matches."""
        return self._documents.get(object_id)

    def same_state(self, other: "RealtimeQuery") -> bool:
        """Whether ``other`` is a query of the same key holding the same matching documents, so
        either can stand for the other from now on."""
        return (self.share_key is not None and self.share_key == other.share_key
                and self._documents == other._documents)

    @property
    def filtered(self) -> bool:
        """Whether the subscription asked for only some match types or operations."""
        return self.match_types is not None or self.operations is not None

    # -- writes ----------------------------------------------------------------------------

    def apply(self, before: Document | None, after: Document | None, operation: str) -> list[Event]:
        """The events one write causes, in sending order, filtered as the subscription asked."""
        return self.deliverable(self.changes(before, after, operation))

    def deliverable(self, events: Iterable[Event]) -> list[Event]:
        """Of ``events`` (most specific types), those the subscription asked for, as it asked."""
        delivered = []
        for event in events:
            event = self._filter(event)
            if event is not None:
                delivered.append(event)
        return delivered

    def changes(self, before: Document | None, after: Document | None, operation: str,
                matched: bool | None = None) -> list[Event]:
        """Every event of one write with the most specific match type, before any filtering.
        ``matched``: whether ``after`` satisfies :attr:`predicate`, if the caller knows (None: test it)."""
        object_id = self._object_id(before, after, operation)
        if after is not None and (self.predicate(after) if matched is None else matched):
            new = after
        else:
            new = None
        if self.is_sorted:
            return self._window_changes(object_id, before, after, new, operation)
        old = self._documents.get(object_id)
        if new is not None:
            self._documents[object_id] = new
            return [Event("change" if old is not None else "add", operation, new)]
        if old is not None:
            del self._documents[object_id]
            return [Event("remove", operation, self._departed(old, before, after, operation))]
        return []

    def _window_changes(self, object_id: Any, before: Document | None, after: Document | None,
                        new: Document | None, operation: str) -> list[Event]:
        # Only the written object moves; every other matching object shifts by at most one
        # place, so at most one other object can leave the window (the first or last visible
        # one) and at most one can enter (at the first or last visible place).
        low, high = self.offset, self.offset + self.limit
        old_entry = self._entries.get(object_id)
        new_entry = self._key(new) if new is not None else None
        if old_entry is None and new_entry is None:
            return []
        old_edges = self._edges(low, high)
        old_document = self._documents.get(object_id)
        old_pos = new_pos = None
        if old_entry is not None:
            old_pos = self._take(old_entry)
            del self._entries[object_id]
            del self._documents[object_id]
        if new_entry is not None:
            new_pos = self._put(new_entry)
            self._entries[object_id] = new_entry
            self._documents[object_id] = new
        was_visible = old_pos is not None and low <= old_pos < high
        is_visible = new_pos is not None and low <= new_pos < high

        if was_visible and is_visible:
            kind = "change" if old_pos == new_pos else "changeIndex"
            return [Event(kind, operation, new, new_pos - low)]
        removed: list[Event] = []
        added: list[Event] = []
        if was_visible:
            removed.append(Event("remove", operation, self._departed(old_document, before, after, operation)))

        def moved(entry: tuple) -> int:
            """How far another entry moved: a place down for the written object's new entry
            before it, a place up for its old one; its place now and before, without a search."""
            return ((new_entry is not None and new_entry < entry)
                    - (old_entry is not None and old_entry < entry))

        for previous, entry in old_edges:
            if entry[-1] != object_id and not low <= previous + moved(entry) < high:
                removed.append(Event("remove", "none", self._documents[entry[-1]]))
        for position, entry in self._edges(low, high):
            if entry[-1] == object_id:
                continue
            previous = position - moved(entry)
            if not low <= previous < high:
                added.append(Event("add", "none", self._documents[entry[-1]], position - low))
        if is_visible:
            added.append(Event("add", operation, new, new_pos - low))
        # Clients apply events in order: the remove first, so an add's index is that of the
        # window after the remove (baqend-notes.md).
        return removed + added

    def _edges(self, low: int, high: int) -> list[tuple[int, tuple]]:
        """The entries at the first and the last visible place, where the window can change, each
        with its place."""
        size = len(self._order)
        edges = []
        if low < size:
            edges.append((low, self._order[low]))
        last = min(high, size) - 1
        if last > low:
            edges.append((last, self._order[last]))
        return edges

    def _take(self, entry: tuple) -> int:
        """Remove ``entry`` (held) from the order; its place was."""
        order = self._order
        if type(order) is list:
            position = bisect_left(order, entry)  # entries are unique (the id ends each)
            del order[position]
            return position
        position = order.index(entry)
        del order[position]
        if len(order) < LIST_MAX // 2:
            self._order = list(order)
        return position

    def _put(self, entry: tuple) -> int:
        """Insert ``entry`` (not held) into the order; its place is."""
        order = self._order
        if type(order) is list:
            position = bisect_left(order, entry)
            order.insert(position, entry)
            if len(order) > LIST_MAX:
                self._order = SortedList(order)
            return position
        order.add(entry)
        return order.index(entry)

    def _admit(self, document: Document) -> None:
        object_id = document.get(self._id_field)
        if object_id is None:
            raise ValueError(f"a document needs an {self._id_field!r}")
        self._documents.pop(object_id, None)
        entry = self._entries.pop(object_id, None)
        if entry is not None:
            self._take(entry)
        if not self.predicate(document):
            return
        self._documents[object_id] = document
        if self.is_sorted:
            entry = self._key(document)
            self._entries[object_id] = entry
            self._put(entry)

    def _object_id(self, before: Document | None, after: Document | None, operation: str) -> Any:
        if operation not in WRITES:
            raise ValueError(f"operation must be insert, update or delete, not {operation!r}")
        if operation == "delete":
            if before is None or after is not None:
                raise ValueError("a delete needs a before image and no after image")
            image = before
        elif after is None:
            raise ValueError(f"an {operation} needs an after image")
        else:
            image = after
        object_id = image.get(self._id_field)
        if object_id is None:
            raise ValueError(f"a document needs an {self._id_field!r}")
        return object_id

    def _departed(self, old: Document, before: Document | None, after: Document | None,
                  operation: str) -> Document:
        """The data of the written object's remove: its new image, or for a delete its last one
        without ``version``, which is how the SDK recognises a deleted object. An image the
        subscriber may not read (the write tightened the acl) is never sent: it gets the last
        image it was allowed to see instead."""
        allowed = self._visible
        if operation != "delete":
            if after is not None and (allowed is None or allowed(after)):
                return after
            return old
        last = before if before is not None and (allowed is None or allowed(before)) else old
        return {name: value for name, value in last.items() if name != "version"}

    def _filter(self, event: Event) -> Event | None:
        if self.operations is not None:
            return event if event.operation in self.operations else None
        if self.match_types is None or event.match_type in self.match_types:
            return event
        if event.match_type in _SUBSUMED_BY_MATCH and "match" in self.match_types:
            return replace(event, match_type="match")
        return None


# -- subscribe fields ------------------------------------------------------------------------


def _decode(value: Any, name: str) -> Any:
    if isinstance(value, (str, bytes)):
        if not value.strip():
            return None
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError as error:
            raise SubscriptionError(f"{name} is not valid JSON: {error.msg}") from None
    return value


# Compiled queries shared by every query of the same text (many clients subscribe to the same
# few queries): one predicate object, tested once per write for all of them (QueryTable.apply).
# Only a query made of JSON's own values is shared (what its text decodes back to; not a NaN,
# a tuple or a datetime given through the Python API), by its text of at most 1 KiB; an entry
# lives as long as a query holds its predicate, and at most 4,096 are shared at once.
_SHARED_MAX = 4096
_SHARED_TEXT_MAX = 1024
_shared: weakref.WeakValueDictionary[bytes, Callable[[Document], bool]] = weakref.WeakValueDictionary()
# The same for a shared predicate joined with a ``visible`` check (a subscriber's acl reader, one
# object for the same principals: actors.baqend.documents.reader): by (predicate, check).
_restricted_shared: weakref.WeakValueDictionary[tuple, Callable[[Document], bool]] = weakref.WeakValueDictionary()


def _compile(query: Any) -> tuple[Callable[[Document], bool], bytes | None]:
    """The query's predicate, and its text: what equal queries are known by (None: a query not made
    of JSON's own values, or too long; compiled for this query alone)."""
    query = _decode(query, "query")
    query = {} if query is None else query
    text = _shared_text(query)
    if text is not None:
        predicate = _shared.get(text)
        if predicate is not None:
            return predicate, text
    try:
        predicate = compile_query(query)
    except UnsupportedQueryError as error:
        raise SubscriptionError(str(error), 400, NOT_SUPPORTED) from None
    except QueryError as error:
        raise SubscriptionError(str(error)) from None
    if text is not None and len(_shared) < _SHARED_MAX:
        _shared[text] = predicate  # a compiled query is a Python function: weakly referenced
    return predicate, text


def _restricted(matches: Callable[[Document], bool], visible: Callable[[Document], bool],
                text: bytes | None) -> Callable[[Document], bool]:
    """``matches`` and ``visible`` both; one object for the same two when ``matches`` is the shared
    predicate of ``text``."""
    shared = text is not None and _shared.get(text) is matches
    key = (matches, visible)
    predicate = _restricted_shared.get(key) if shared else None
    if predicate is None:
        def predicate(document: Document) -> bool:
            return matches(document) and visible(document)

        if shared and len(_restricted_shared) < _SHARED_MAX:
            _restricted_shared[key] = predicate
    return predicate


def _shared_text(query: Any) -> bytes | None:
    """The text ``query`` is shared by, or None (too long, or not made of JSON's own values)."""
    try:
        text = orjson.dumps(query)
    except (TypeError, orjson.JSONEncodeError):  # e.g. an integer beyond 64 bits
        return None
    if len(text) > _SHARED_TEXT_MAX or orjson.loads(text) != query:
        return None
    return text


def _sort_spec(sort: Any):
    try:
        return parse_sort(_decode(sort, "sort"))
    except SubscriptionError:
        raise
    except QueryError as error:
        raise SubscriptionError(str(error)) from None


def _count(value: Any, name: str) -> int | None:
    if value is None:
        return None
    if (
        isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0
        or (isinstance(value, float) and not value.is_integer())
    ):
        raise SubscriptionError(f"{name} must be a non-negative integer")
    return int(value)


def _offset(value: Any) -> int:
    offset = _count(value, "offset") or 0
    if offset >= MAX_RESULT:
        raise SubscriptionError(
            f"Offset + limit may not exceed {MAX_RESULT}, but offset already was {offset}.", 400, NOT_SUPPORTED
        )
    return offset


def _limit(value: Any) -> int | None:
    # 0 means "no limit", as in MongoDB; the SDK sends a limit only when it is positive.
    return _count(value, "limit") or None


def _choice(value: Any, wildcard: str, allowed: frozenset[str], name: str) -> frozenset[str] | None:
    """A matchTypes/operations list as the SDK normalises it; None stands for the wildcard."""
    if value is None or value == "" or value == []:
        return None
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list):
        raise SubscriptionError(f"{name} must be a list of strings")
    if wildcard in items:
        return None
    for item in items:
        if not isinstance(item, str) or item not in allowed:
            raise SubscriptionError(
                f"{item} not allowed for {name}! (permitted: {','.join(sorted(allowed))}.)"
            )
    return frozenset(items)
