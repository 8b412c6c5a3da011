"""The real-time queries one query shard owns, and the events each write causes for them.

InvaliDB's design: queries are partitioned across query shards (by subscription), documents across
document shards (by id), and every write's (before, after) images reach every query shard, which
matches them against its own queries only. Each query keeps its window (:class:`RealtimeQuery`),
so a write is evaluated against the window, never by re-running the query.

Consistency of the initial result with the stream of writes. A document shard stamps each write
it forwards with ``(source, epoch, seq)``: its index, a random id of its incarnation, and a counter
of its writes. Writes of one source arrive here in ``seq`` order (Ray runs one caller's calls to a
synchronous actor in submission order). A subscription is registered first (:meth:`add`: writes
for it are buffered from then on); then the gateway scans every document shard page by page
(bounded work per call), each page answering with the documents of an id range and the
``(epoch, seq)`` of the shard's last write when it was read, and hands the pages here
(:meth:`page`); :meth:`load` builds the query from them once all have come (in any order) and
replays the buffered writes the page of their document did not include (``seq`` above that
page's), and remembers to skip the writes a page did include but that are still on their way. So
the result is exactly the database as of the writes this shard has seen, and every later write is
applied once.

A query registered again after a restart (its gateway tells what the client holds, ``known``)
loads the same way, but sends the events from what the client holds to that result
(:mod:`actors.baqend.resync`) instead of a result. Pure: no Ray, no I/O.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from actors.baqend.mongoquery import STRING, bson_key
from actors.baqend.contract import Baseline, InitialResult, Known, Scan, Write, matches, tag
from actors.baqend.resync import resync
from actors.baqend.rtquery import Event, RealtimeQuery

Route = tuple[str, int]  # (gateway id, connection id)
Stamp = tuple[str, int]  # (epoch, seq) of a document shard
# Where, and the DELIVER_EVENT payload (an InitialResult, a Baseline or a contract.matches tuple).
Output = tuple[Route, tuple]


@dataclass(frozen=True, slots=True)
class QuerySpec:
    """The fields of a subscribe message a query is built from (already validated by the gateway)."""

    bucket: str
    query: Any = None
    sort: Any = None
    offset: Any = 0
    limit: Any = None
    match_types: Any = None
    operations: Any = None
    initial: bool = False

    def build(self, documents: list[Mapping[str, Any]] = (), visible: Callable | None = None) -> RealtimeQuery:
        return RealtimeQuery(self.query, self.sort, self.offset, self.limit, self.match_types, self.operations,
                             documents, visible=visible)


class Coverage:
    """What a source's scan pages include: page ``i`` covers the ids up to ``uptos[i]`` (the
    last page: all the rest) as of ``stamps[i]``. Pages are read in id order, each later; they
    may be handed over in another order (a healing shard's retries), and are kept in id order."""

    __slots__ = ("uptos", "stamps", "top")

    def __init__(self) -> None:
        self.uptos: list[str] = []
        self.stamps: list[Stamp] = []
        self.top: dict[str, int] = {}  # epoch -> the highest seq a page of it includes

    def add(self, upto: str | None, stamp: Stamp) -> None:
        if upto is None:  # the last page
            self.stamps.append(stamp)
        else:
            index = bisect_left(self.uptos, upto)
            self.uptos.insert(index, upto)
            self.stamps.insert(index, stamp)
        epoch, seq = stamp
        self.top[epoch] = max(seq, self.top.get(epoch, seq))

    def stamp_of(self, oid: str) -> Stamp | None:
        """The stamp of the page that covers ``oid`` (None if no page does)."""
        index = bisect_left(self.uptos, oid)
        return self.stamps[index] if index < len(self.stamps) else None

    def covers(self, oid: str, epoch: str, seq: int) -> bool:
        """Whether the page of ``oid`` already includes its write ``(epoch, seq)``."""
        return _covered(self.stamp_of(oid), epoch, seq)

    def passed(self, epoch: str, seq: int) -> bool:
        """Whether no page includes a write of that epoch after ``(epoch, seq)``."""
        return seq >= self.top.get(epoch, -1)


@dataclass(slots=True)
class LiveQuery:
    key: str
    route: Route
    sub_id: str
    spec: QuerySpec
    visible: Callable | None
    query: RealtimeQuery | None = None  # None while loading
    documents: list = field(default_factory=list)  # the pages' documents, while loading
    pages: dict[int, Coverage] = field(default_factory=dict)  # source -> its pages, while loading
    buffer: list[tuple[int, str, Write]] = field(default_factory=list)
    skip: dict[int, Coverage] = field(default_factory=dict)  # source -> pages whose writes may still arrive
    received: int = 0  # pages handed over
    expected: int | None = None  # pages the gateway read, once it asked to load before all came
    known: Known | None = None  # registered again: what the client holds, until loaded
    # registered again: the pages' image of each document they have (held ones that no longer
    # match included), then of each buffered write's; None: deleted
    images: dict[str, Any] = field(default_factory=dict)
    state: "SharedState | None" = None  # the result state it shares with equal queries, once caught up


class SharedState:
    """One result state for the live queries of one bucket, one :attr:`RealtimeQuery.share_key`
    (the same text, sort, window, filters and reader) and one index term (:func:`index_term` of the
    spec as sent: a query sent as JSON text is not indexed) that have seen the same writes: a write is
    matched once for all of them and their events are one list. Many clients subscribe to the same
    few queries; their cost then grows with the distinct queries, not with the subscriptions.

    The bucket's index holds the state in its members' place, so a write meets it once: its events
    go to the members' routes and keys (:meth:`targets`: two lists, made again at the first write
    after the members changed, so a join or a leave costs O(1) and a write at most the O(members)
    its events cost anyway), without a look at each member's :class:`LiveQuery`."""

    __slots__ = ("key", "query", "members", "term", "routes", "keys")

    def __init__(self, key: tuple, query: RealtimeQuery, term: tuple[str, Any] | None) -> None:
        self.key = key
        self.query = query
        self.term = term  # what the bucket indexes it by: its members' index_term
        self.members: dict[str, LiveQuery] = {}
        self.routes: list[Route] = []
        self.keys: list[str] | None = None  # None: made again by targets()

    def targets(self) -> tuple[list[Route], list[str]]:
        if self.keys is None:
            self.routes = [live.route for live in self.members.values()]
            self.keys = list(self.members)
        return self.routes, self.keys


def index_term(query: Any) -> tuple[str, Any] | None:
    """A top-level ``{"field": scalar}`` the query requires, to index it by; None if it has none.

    Only plain strings (not date-like) and numbers: for them a dict lookup finds exactly the
    documents MongoDB's equality can match (an array field is looked up by each element).
    """
    if not isinstance(query, dict):
        return None
    for name, value in query.items():
        if name.startswith("$") or "." in name:
            continue
        if (type(value) in (int, float) and value == value) or (type(value) is str and bson_key(value)[0] == STRING):
            return name, value
    return None


class _Bucket:
    """A bucket's queries: those indexed by an equality term, and those every write is matched
    against. An entry is a :class:`LiveQuery` of its own, or a :class:`SharedState` for all its
    members (by the state's key)."""

    __slots__ = ("scan", "equal", "fields", "size")

    def __init__(self) -> None:
        self.scan: dict[Any, LiveQuery | SharedState] = {}
        self.equal: dict[tuple[str, Any], dict[Any, LiveQuery | SharedState]] = {}
        self.fields: dict[str, int] = {}  # indexed field -> entries indexed by it
        self.size = 0  # entries

    def add(self, key: Any, entry: LiveQuery | SharedState, term: tuple[str, Any] | None) -> None:
        self.size += 1
        if term is None:
            self.scan[key] = entry
            return
        self.equal.setdefault(term, {})[key] = entry
        self.fields[term[0]] = self.fields.get(term[0], 0) + 1

    def remove(self, key: Any, term: tuple[str, Any] | None) -> None:
        if term is None:
            if self.scan.pop(key, None) is not None:
                self.size -= 1
            return
        holders = self.equal.get(term)
        if holders is not None and holders.pop(key, None) is not None:
            self.size -= 1
            if not holders:
                del self.equal[term]
            self.fields[term[0]] -= 1
            if not self.fields[term[0]]:
                del self.fields[term[0]]

    def candidates(self, before: Any, after: Any) -> Any:
        """The entries a write can concern: one indexed by ``f = v`` only if before or after has it.
        May be a view of the index (no copy): no entry is added or removed while it is iterated."""
        if not self.fields:
            return self.scan.values()
        if before is None and after is not None and not self.scan and len(self.fields) == 1:
            # An insert, every query indexed by one field: the holders of the document's value as
            # they are. (Its value a list, or a type the index skips: below.)
            for name in self.fields:
                value = after.get(name)
                if type(value) in (int, float, str):
                    holders = self.equal.get((name, value))
                    return holders.values() if holders else ()
        found = dict(self.scan)
        equal = self.equal
        for name in self.fields:
            for image in (before, after):
                if image is None:
                    continue
                value = image.get(name)
                for item in (value if type(value) is list else (value,)):
                    if type(item) in (int, float, str):
                        holders = equal.get((name, item))
                        if holders:
                            found.update(holders)
        return found.values()


class QueryTable:
    def __init__(self) -> None:
        self.queries: dict[str, LiveQuery] = {}
        self.by_bucket: dict[str, _Bucket] = {}
        self.by_connection: dict[Route, set[str]] = {}
        self.routes: dict[Route, Route] = {}  # each connection's route, the one object its queries hold
        self.received: dict[int, Stamp] = {}  # source -> last write seen
        self.states: dict[tuple, SharedState] = {}  # (bucket, share key, index term) -> the state its queries share
        self.writes = 0
        self.events = 0

    def __len__(self) -> int:
        return len(self.queries)

    # -- subscriptions ---------------------------------------------------------------------------

    def add(self, key: str, route: Route, sub_id: str, spec: QuerySpec, visible: Callable | None = None,
            known: Known | None = None) -> bool:
        """Register a query; writes for it are buffered until :meth:`load`. False if the key is taken.
        With ``known`` (registered again after a restart), :meth:`load` sends the events from what
        the client holds to the fresh result instead of a result."""
        if key in self.queries:
            return False
        keys = self.by_connection.get(route)
        if keys is None:
            keys = self.by_connection[route] = set()
            self.routes[route] = route
        else:  # one route object for a connection's queries (a shared state's events refer to it)
            route = self.routes[route]
        keys.add(key)
        live = LiveQuery(key, route, sub_id, spec, visible, known=known)
        self.queries[key] = live
        bucket = self.by_bucket.get(spec.bucket)
        if bucket is None:
            bucket = self.by_bucket[spec.bucket] = _Bucket()
        bucket.add(key, live, index_term(spec.query))
        return True

    def page(self, key: str, scan: Scan) -> list[Output] | None:
        """Take one page of a source's scan. None if the query is gone (unsubscribed meanwhile) or
        already loaded; else what loading it sends, if this was the last page :meth:`load` waited for."""
        live = self.queries.get(key)
        if live is None or live.query is not None:
            return None
        source, epoch, seq, documents, upto, _, others = scan
        live.received += 1
        live.documents.extend(documents)
        if live.known is not None:
            images = live.images
            for document in documents:
                images[document["id"]] = document
            for document in others:
                images[document["id"]] = document
        coverage = live.pages.get(source)
        if coverage is None:
            coverage = live.pages[source] = Coverage()
        coverage.add(upto, (epoch, seq))
        if live.expected is not None and live.received >= live.expected:
            return self._load(live)
        return []

    def load(self, key: str, pages: int | None = None) -> list[Output] | None:
        """Build the query from its pages (every document shard's, each to its end): now, or once
        ``pages`` of them have come if some have not yet (then it answers ``[]``).

        Returns the outputs to deliver: the ``result`` when asked for, else the result's entries
        for the gateway to track (:class:`Baseline`); for a query registered again, the events
        from what its client holds instead. None if the query is gone (unsubscribed meanwhile)
        or already loaded.
        """
        live = self.queries.get(key)
        if live is None or live.query is not None:
            return None
        if pages is not None and live.received < pages:
            live.expected = pages
            return []
        return self._load(live)

    def _load(self, live: LiveQuery) -> list[Output]:
        query = live.spec.build(live.documents, live.visible)
        live.documents = []
        pages, live.pages = live.pages, {}
        known, images = live.known, live.images
        for source, epoch, item in live.buffer:
            oid = _object_id(item.before, item.after)
            coverage = pages.get(source)
            if coverage is None or not coverage.covers(oid, epoch, item.seq):
                query.changes(item.before, item.after, item.operation)  # folded into the result, not sent
                if known is not None:
                    images[oid] = item.after
        live.buffer = []
        for source, coverage in pages.items():
            seen = self.received.get(source)
            if seen is None or any(not _covered(seen, epoch, seq) for epoch, seq in coverage.top.items()):
                live.skip[source] = coverage
        live.query = query
        live.known, live.images = None, {}
        if known is not None:
            outputs = self._resynced(live, known, images)
        elif not live.spec.initial:
            outputs = [(live.route, Baseline(live.key, [(d["id"], tag(d)) for d in query.result()]))]
        else:
            outputs = [(live.route, InitialResult(live.key, query.result()))]
        if not live.skip:
            self._share(live)
        return outputs

    def _share(self, live: LiveQuery) -> None:
        """Caught up (loaded, no write of its pages still on its way): join the state of its equal
        queries, or start one. A query whose documents differ from the state's keeps its own (it
        cannot when both have seen the same writes; checked rather than assumed)."""
        query = live.query
        if query.share_key is None:
            return
        # The index term too: the same text as a dict and as JSON (or an int and an IntEnum) share
        # a share key, but the bucket finds a query by the term of the spec it was sent as.
        term = index_term(live.spec.query)
        key = (live.spec.bucket, query.share_key, term)
        bucket = self.by_bucket[live.spec.bucket]
        state = self.states.get(key)
        if state is None:
            state = self.states[key] = SharedState(key, query, term)
            bucket.add(key, state, term)
        elif state.query is not query:
            if not query.same_state(state.query):
                return
            live.query = state.query
        bucket.remove(live.key, state.term)  # the state answers for it
        state.members[live.key] = live
        state.keys = None
        live.state = state

    def _unshare(self, live: LiveQuery) -> None:
        """Out of its state (being removed); the state out of the bucket with its last member."""
        state = live.state
        live.state = None
        del state.members[live.key]
        state.keys = None
        if not state.members:
            del self.states[state.key]
            self.by_bucket[live.spec.bucket].remove(state.key, state.term)

    def _resynced(self, live: LiveQuery, known: Known, images: dict[str, Any]) -> list[Output]:
        """The events that bring the client from what it holds to the loaded result."""
        query, visible = live.query, live.visible

        def lookup(oid: str) -> tuple[Any, bool]:
            document = query.document(oid)
            if document is not None:
                return document, True
            document = images.get(oid)
            return document, document is not None and (visible is None or visible(document))

        changes = resync(known.entries, known.since, query.result(), query.is_sorted, lookup)
        outputs: list[Output] = []
        self._emit(outputs, live, self._answer(query, changes), None)
        return outputs

    def _emit(self, outputs: list[Output], live: LiveQuery, answer: tuple[list[dict], list | None],
              meta: tuple | None) -> None:
        """The subscription's :func:`~actors.baqend.contract.matches` of an :meth:`_answer`, if it
        holds anything."""
        events, view = answer
        if events or view:
            self.events += len(events)
            outputs.append((live.route, matches(live.key, events, meta, view)))

    @staticmethod
    def _answer(query: RealtimeQuery, changes: list[Event]) -> tuple[list[dict], list | None]:
        """The events' fields the subscription asked for, and when it filters them, every change
        for the gateway to track the result. Read-only once made: the queries of a shared state
        send the same lists (pickled once in a bundle)."""
        if not query.filtered:
            return [event.fields() for event in changes], None
        return [event.fields() for event in query.deliverable(changes)], [_entry(event) for event in changes]

    def remove(self, key: str) -> bool:
        live = self.queries.pop(key, None)
        if live is None:
            return False
        bucket = self.by_bucket[live.spec.bucket]
        if live.state is not None:
            self._unshare(live)
        else:
            bucket.remove(key, index_term(live.spec.query))
        if not bucket.size:
            del self.by_bucket[live.spec.bucket]
        keys = self.by_connection[live.route]
        keys.discard(key)
        if not keys:
            del self.by_connection[live.route]
            del self.routes[live.route]
        return True

    def purge_connection(self, route: Route) -> int:
        keys = list(self.by_connection.get(route, ()))
        for key in keys:
            self.remove(key)
        return len(keys)

    def purge_gateway(self, gateway_id: str) -> int:
        count = 0
        for route in [route for route in self.by_connection if route[0] == gateway_id]:
            count += self.purge_connection(route)
        return count

    # -- writes ------------------------------------------------------------------------------------

    def apply(self, source: int, epoch: str, items: list[Write]) -> list[Output]:
        """The events of a source's writes, in order, for every query of their buckets."""
        outputs: list[Output] = []
        for item in items:
            self.writes += 1
            bucket, before, after, operation, seq, meta = item
            self.received[source] = (epoch, seq)
            queries = self.by_bucket.get(bucket)
            if queries is None:
                continue
            # A query indexed by f = v is skipped when neither image has v at f: the write can
            # neither enter nor leave its result (nor matter while it loads).
            matched: dict[Any, bool] = {}  # predicate -> after satisfies it: tested once per text
            caught_up = None
            for entry in queries.candidates(before, after):
                if type(entry) is SharedState:  # caught-up equal queries: matched once, the same events to each
                    query = entry.query
                    events, view = self._answer(query, self._changes(query, before, after, operation, matched))
                    if events or view:
                        routes, keys = entry.targets()
                        self.events += len(events) * len(keys)
                        outputs += [(route, matches(key, events, meta, view)) for route, key in zip(routes, keys)]
                    continue
                live = entry
                query = live.query
                if query is None:
                    live.buffer.append((source, epoch, item))
                    continue
                covered = False
                if live.skip:
                    covered, done = self._covered(live, source, before, after, epoch, seq)
                    if done:
                        if caught_up is None:
                            caught_up = []
                        caught_up.append(live)
                if covered:
                    continue
                self._emit(outputs, live, self._answer(query, self._changes(query, before, after, operation, matched)),
                           meta)
            if caught_up is not None:  # after the write reached every query: all have seen the same
                for live in caught_up:
                    self._share(live)
        return outputs

    @staticmethod
    def _covered(live: LiveQuery, source: int, before: Any, after: Any, epoch: str, seq: int) -> tuple[bool, bool]:
        """Whether a page of ``live``'s scan held this write of ``source`` already (skipped), and
        whether it was the last write any page held, of every source (the query has caught up)."""
        coverage = live.skip.get(source)
        if coverage is None:
            return False, False
        covered = coverage.covers(_object_id(before, after), epoch, seq)
        if coverage.passed(epoch, seq):  # no later write of the source is in a page
            del live.skip[source]
            return covered, not live.skip
        return covered, False

    @staticmethod
    def _changes(query: RealtimeQuery, before: Any, after: Any, operation: str, matched: dict) -> list[Event]:
        hit = None
        if after is not None:
            predicate = query.predicate
            hit = matched.get(predicate)
            if hit is None:
                hit = matched[predicate] = bool(predicate(after))
        return query.changes(before, after, operation, hit)

    def stats(self) -> dict[str, Any]:
        return {"queries": len(self.queries), "loading": sum(1 for q in self.queries.values() if q.query is None),
                "shared_states": len(self.states),
                "sharing": sum(len(state.members) for state in self.states.values() if len(state.members) > 1),
                "connections": len(self.by_connection), "writes": self.writes, "events": self.events}


def _entry(event: Event) -> tuple:
    """A change as the gateway tracks it: (matchType, id, tag or None for a remove, index)."""
    data = event.data
    return (event.match_type, data["id"], None if event.match_type == "remove" else tag(data), event.index)


def _object_id(before: Any, after: Any) -> str:
    return (after if after is not None else before)["id"]


def _covered(stamp: Stamp | None, epoch: str, seq: int) -> bool:
    """Whether a scan with ``stamp`` already includes the write ``(epoch, seq)`` of its source."""
    if stamp is None:
        return False
    stamp_epoch, stamp_seq = stamp
    return stamp_epoch == epoch and seq <= stamp_seq


__all__ = ["Coverage", "Event", "LiveQuery", "QuerySpec", "QueryTable", "SharedState"]
