"""actors/livequeries.py: a query shard's queries, the initial result racing writes (scanned in
pages, each read at its own moment), and the property that a live window always equals the query
re-run from scratch."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.baqend.documents import DocumentTable, MemoryDocumentStore, reader
from actors.baqend.contract import Baseline, InitialResult, Known, Scan, Write, tag
from actors.baqend.livequeries import QuerySpec
from actors.baqend.livequeries import QueryTable as _QueryTable


_KINDS = {InitialResult: "result", Baseline: "baseline"}


def _tagged(outputs):
    """Outputs as (route, ("result", key, documents) | ("baseline", key, entries) |
    ("match", key, events, meta, view))."""
    return None if outputs is None else [(route, (_KINDS.get(type(payload), "match"), *payload))
                                         for route, payload in outputs]


class QueryTable(_QueryTable):
    def load(self, key, scans=()):
        """Hand every page of ``scans`` (lists of pages, or single pages) over, then load."""
        for scan in scans:
            for page in (scan if isinstance(scan, list) else [scan]):
                self.page(key, page)
        return _tagged(super().load(key))

    def apply(self, source, epoch, items):
        return _tagged(super().apply(source, epoch, items))

ROUTE = ("gw", 1)
NOW = "2026-01-01T00:00:00.000Z"


class Source:
    """A document shard as the query shard sees it: stamped writes, and scans."""

    def __init__(self, index: int = 0, epoch: str = "e0") -> None:
        self.index, self.epoch, self.seq = index, epoch, 0
        self.table = DocumentTable(MemoryDocumentStore())

    def write(self, operation: str, key: str, **fields: Any) -> tuple:
        if operation == "insert":
            before, after = self.table.insert("Todo", key, fields, NOW)
        elif operation == "update":
            before, after = self.table.update("Todo", key, {"$set": fields}, None, NOW)
        else:
            before, after = self.table.delete("Todo", key, None)
        self.table.commit()
        self.seq += 1
        return Write("Todo", before, after, operation, self.seq, None)

    def page(self, after: str | None = None, max_rows: int = 1000) -> Scan:
        """One page, stamped with the last write it includes (as ``BaqendDocuments.scan``)."""
        return Scan(self.index, self.epoch, self.seq, *self.table.scan("Todo", after=after, max_rows=max_rows))

    def scan(self) -> list[Scan]:
        """Every page, at once."""
        pages = [self.page()]
        while pages[-1].upto is not None:
            pages.append(self.page(pages[-1].upto))
        return pages

    def documents(self) -> list[dict]:
        return [d for page in self.scan() for d in page.documents]


def scan(source: int, epoch: str, seq: int, documents: list) -> Scan:
    """A whole source in one page."""
    return Scan(source, epoch, seq, documents, None, 0)


def brief(outputs: list) -> list[tuple]:
    return [(kind, key, [(e["matchType"], e["operation"], e["data"]["id"].rsplit("/", 1)[1], e.get("index"))
                         for e in events])
            for _, (kind, key, events, *_rest) in outputs if kind == "match"]


def test_writes_buffered_while_loading_are_folded_into_the_result_once():
    source, table = Source(), QueryTable()
    table.apply(0, "e0", [source.write("insert", "a", n=1)])
    assert table.add("k", ROUTE, "s1", QuerySpec("Todo", sort={"n": 1}, initial=True))
    buffered = [source.write("insert", "b", n=2)]  # stored before the scan: in the scan
    scan = source.scan()
    buffered.append(source.write("update", "a", n=3))  # after the scan: only in the buffer
    assert table.apply(0, "e0", buffered) == []  # nothing is sent while loading
    outputs = table.load("k", [scan])
    assert [(route, kind, key) for route, (kind, key, _) in outputs] == [(ROUTE, "result", "k")]
    assert [(d["id"], d["n"]) for d in outputs[0][1][2]] == [("/db/Todo/b", 2), ("/db/Todo/a", 3)]


def test_writes_a_scan_included_but_still_in_flight_are_skipped():
    source, table = Source(), QueryTable()
    table.add("k", ROUTE, "s1", QuerySpec("Todo", initial=True))
    in_flight = [source.write("insert", "a", n=1)]
    scan = source.scan()  # includes "a", whose write has not reached the query shard yet
    assert table.load("k", [scan])[0][1][2][0]["id"] == "/db/Todo/a"
    assert table.apply(0, "e0", in_flight) == []  # not "add" a second time
    outputs = table.apply(0, "e0", [source.write("update", "a", n=2)])
    assert brief(outputs) == [("match", "k", [("change", "update", "a", None)])]


def test_a_restarted_document_shard_new_epoch_is_not_skipped():
    source, table = Source(), QueryTable()
    table.add("k", ROUTE, "s1", QuerySpec("Todo"))
    table.load("k", [scan(0, "old", 5, [])])
    outputs = table.apply(0, "new", [("Todo", None, {"id": "/db/Todo/x", "version": 1}, "insert", 1, None)])
    assert brief(outputs) == [("match", "k", [("add", "insert", "x", None)])]


def test_initial_false_sends_no_result_and_unsubscribe_while_loading_drops_the_load():
    table = QueryTable()
    table.add("k", ROUTE, "s1", QuerySpec("Todo"))
    document = {"id": "/db/Todo/a", "version": 3, "updatedAt": NOW}
    # no result for the client: the gateway is told the result's entries, to track what it holds
    assert table.load("k", [scan(0, "e", 0, [document])]) == [(ROUTE, ("baseline", "k", [("/db/Todo/a", (3, NOW))]))]
    assert table.load("k") is None  # loaded once
    assert table.page("k", scan(0, "e", 0, [])) is None
    table.add("k2", ROUTE, "s2", QuerySpec("Todo", initial=True))
    assert table.remove("k2")
    assert table.page("k2", scan(0, "e", 0, [])) is None
    assert table.load("k2") is None
    assert not table.add("k", ROUTE, "s1", QuerySpec("Todo"))  # key taken


def test_other_buckets_are_not_matched_and_purges_remove_everything():
    table = QueryTable()
    table.add("k1", ("gw", 1), "s", QuerySpec("Todo"))
    table.add("k2", ("gw", 2), "s", QuerySpec("Todo"))
    table.add("k3", ("other", 1), "s", QuerySpec("Todo"))
    for key in ("k1", "k2", "k3"):
        table.load(key, [])
    assert table.apply(0, "e", [("Note", None, {"id": "/db/Note/x", "version": 1}, "insert", 1, None)]) == []
    assert table.purge_connection(("gw", 1)) == 1
    assert table.purge_gateway("gw") == 1
    outputs = table.apply(0, "e", [("Todo", None, {"id": "/db/Todo/x", "version": 1}, "insert", 2, None)])
    assert [route for route, _ in outputs] == [("other", 1)]
    assert table.stats() == {"queries": 1, "loading": 0, "shared_states": 1, "sharing": 0, "connections": 1, "writes": 2,
                             "events": 1}


def test_acl_visibility_anonymous_sees_public_documents_only():
    table = QueryTable()
    table.add("anon", ROUTE, "s", QuerySpec("Todo", initial=True), reader(frozenset()))
    table.add("u1", ROUTE, "t", QuerySpec("Todo", initial=True), reader(frozenset({"/db/User/u1"})))
    private = {"id": "/db/Todo/p", "version": 1, "acl": {"read": {"/db/User/u1": "allow"}, "write": {}}}
    public = {"id": "/db/Todo/q", "version": 1, "acl": None}
    assert [d["id"] for d in table.load("anon", [scan(0, "e", 0, [private, public])])[0][1][2]] == ["/db/Todo/q"]
    assert [d["id"] for d in table.load("u1", [scan(0, "e", 0, [private, public])])[0][1][2]] == [
        "/db/Todo/p", "/db/Todo/q"]
    opened = {**private, "version": 2, "acl": None}
    outputs = table.apply(0, "e", [("Todo", private, opened, "update", 1, None)])
    assert brief(outputs) == [("match", "anon", [("add", "update", "p", None)]),
                              ("match", "u1", [("change", "update", "p", None)])]


def test_pages_and_the_load_may_come_in_any_order():
    """A healing query shard asks for commands again and they may come back in another order:
    the load waits for every page the gateway read, and a source's pages are kept in id order."""
    def run(order):
        source = Source()
        for key, n in (("a", 1), ("b", 2), ("c", 3), ("d", 4)):
            source.write("insert", key, n=n)
        first = source.page(None, 2)
        change = source.write("update", "b", n=9)  # after page 1 was read: it counts
        second = source.page(first.upto, 2)
        third = source.page(second.upto, 2)
        table = _QueryTable()
        table.add("k", ROUTE, "s1", QuerySpec("Todo", sort={"n": 1}, initial=True))
        table.apply(0, "e0", [change])
        outputs = []
        for step in order:
            if step == "load":
                outputs.append(table.load("k", 3))
            else:
                outputs.append(table.page("k", [first, second, third][step]))
        return outputs

    in_order = run([0, 1, 2, "load"])
    [(_, result)] = in_order[-1]
    assert [(d["id"][-1], d["n"]) for d in result.documents] == [("a", 1), ("c", 3), ("d", 4), ("b", 9)]
    assert run(["load", 2, 0, 1]) == [[], [], [], in_order[-1]]


# -- registered again after a restart: the events from what the client holds ----------------------

HEARD = "2025-12-31T00:00:00.000Z"  # the client's last message: every write of these tests is after it


def test_a_query_registered_again_sends_what_changed_not_a_result():
    """The client holds [a b c] of {on: true}; meanwhile b no longer matches and c was deleted
    (before the scan), d was inserted (after the scan, still buffered while loading)."""
    source = Source()
    for key, n in (("a", 1), ("b", 2), ("c", 3)):
        source.write("insert", key, n=n, on=True)
    held = [(d["id"], tag(d)) for d in source.documents()]
    source.write("update", "b", on=False)
    source.write("delete", "c")
    table = QueryTable()
    assert table.add("k", ROUTE, "s1", QuerySpec("Todo", {"on": True}, initial=True), None, Known(held, HEARD))
    include = frozenset(oid for oid, _ in held)
    pages = [Scan(0, "e0", source.seq, *source.table.scan("Todo", lambda d: d.get("on") is True, include=include))]
    buffered = source.write("insert", "d", n=4, on=True)
    assert table.apply(0, "e0", [buffered]) == []
    outputs = table.load("k", pages)
    assert brief(outputs) == [("match", "k", [("remove", "update", "b", None), ("remove", "delete", "c", None),
                                              ("add", "insert", "d", None)])]
    assert outputs[0][1][4] is None  # unfiltered: the gateway tracks the result from the events
    assert table.queries["k"].known is None and table.queries["k"].images == {}
    # live from then on
    assert brief(table.apply(0, "e0", [source.write("update", "a", n=9)])) == [
        ("match", "k", [("change", "update", "a", None)])]


def test_a_buffered_write_to_a_held_document_counts_as_its_current_image():
    source = Source()
    source.write("insert", "a", n=1, on=True)
    held = [(d["id"], tag(d)) for d in source.documents()]
    table = QueryTable()
    table.add("k", ROUTE, "s1", QuerySpec("Todo", {"on": True}, {"n": 1}, 0, 2), None, Known(held, HEARD))
    pages = [Scan(0, "e0", source.seq, *source.table.scan("Todo", include=frozenset(oid for oid, _ in held)))]
    table.apply(0, "e0", [source.write("update", "a", on=False)])  # after the scan: no longer matches
    outputs = table.load("k", pages)
    assert brief(outputs) == [("match", "k", [("remove", "update", "a", None)])]
    assert outputs[0][1][2][0]["data"]["on"] is False


def test_a_filtered_query_tells_the_gateway_every_change_and_the_client_only_what_it_asked_for():
    source = Source()
    for key, n in (("a", 1), ("b", 2)):
        source.write("insert", key, n=n, on=True)
    held = [(d["id"], tag(d)) for d in source.documents()]
    source.write("delete", "a")
    source.write("insert", "c", n=3, on=True)
    table = QueryTable()
    table.add("k", ROUTE, "s1", QuerySpec("Todo", sort={"n": 1}, limit=5, match_types=["add"]), None,
              Known(held, HEARD))
    [(_, (kind, key, events, meta, view))] = table.load("k", [source.scan()])
    assert [(e["matchType"], e["operation"], e["data"]["id"], e["index"]) for e in events] == [
        ("add", "insert", "/db/Todo/c", 1)]
    assert view == [("remove", "/db/Todo/a", None, None), ("add", "/db/Todo/c", (1, NOW), 1)]
    # a write whose events are all filtered out still tells the gateway
    [(_, (_, _, events, _, view))] = table.apply(0, "e0", [source.write("delete", "b")])
    assert events == [] and view == [("remove", "/db/Todo/b", None, None)]


def test_a_query_loaded_without_initial_gives_the_gateway_its_entries():
    source = Source()
    source.write("insert", "a", n=1)
    table = QueryTable()
    table.add("k", ROUTE, "s1", QuerySpec("Todo"))
    assert table.load("k", [source.scan()]) == [(ROUTE, ("baseline", "k", [("/db/Todo/a", (1, NOW))]))]


# -- the property: a live window always equals the query re-run from scratch ----------------------

KEYS = [f"k{i}" for i in range(8)]
write = st.tuples(st.sampled_from(["put", "delete"]), st.sampled_from(KEYS), st.integers(0, 6), st.booleans())
SPECS = [
    QuerySpec("Todo", {"on": True}, {"n": 1}, 2, 3, initial=True),
    QuerySpec("Todo", {"n": {"$gte": 2}}, {"n": -1, "on": 1}, 0, 2, initial=True),
    QuerySpec("Todo", {}, None, 0, 4, initial=True),
    QuerySpec("Todo", {"on": True}, initial=True),
    QuerySpec("Todo", {"n": 3}, initial=True),  # indexed by n = 3
    QuerySpec("Todo", {"n": 2.0, "on": True}, {"on": -1}, 0, 2, initial=True),  # indexed by n = 2
]


def _planned(sources: list[Source], planned: tuple) -> tuple | None:
    """A generated write as its source makes it: (source, operation, key, n, on, whether the
    document exists), or None for a delete of a document that does not exist."""
    action, key, n, on = planned
    source = sources[int(key[1:]) % 2]
    exists = source.table.get(f"/db/Todo/{key}") is not None
    if action == "delete" and not exists:
        return None
    operation = "delete" if action == "delete" else ("update" if exists else "insert")
    return source, operation, key, n, on, exists


@settings(max_examples=200, deadline=None)
@given(st.lists(write, max_size=40), st.integers(0, 40), st.integers(0, 40), st.sampled_from(range(len(SPECS))),
       st.integers(1, 3))
def test_live_window_after_random_writes_equals_rerunning_the_query(writes, subscribe_at, delivered_at, which,
                                                                    page_rows):
    """Writes go to two document shards; the query subscribes in the middle and reads each shard
    in pages of ``page_rows`` rows, one page of each between writes (each page stamped when read),
    while writes are still in flight to the query shard; the window it keeps must be the query
    re-run at the end."""
    spec = SPECS[which]
    sources = [Source(0, "a"), Source(1, "b")]
    in_flight: list[list[tuple]] = [[], []]
    table, window = QueryTable(), None
    sent: list[tuple] = []
    reading: dict[int, str | None] | None = None  # source -> where its next page starts, while loading

    def deliver(count: int) -> None:
        for index in (0, 1):
            items, in_flight[index] = in_flight[index][:count], in_flight[index][count:]
            if items:
                sent.extend(table.apply(index, sources[index].epoch, items))

    def read_pages() -> None:
        """One page of each source still being read (read now, handed over after some deliveries)."""
        nonlocal reading
        pages = [sources[index].page(after, page_rows) for index, after in reading.items()]
        deliver(delivered_at % 3)
        for page in pages:
            assert table.page("q", page) == []
            reading[page.source] = page.upto
            if page.upto is None:
                del reading[page.source]
        if not reading:
            sent.extend(table.load("q"))
            reading = None

    for step, planned in enumerate(writes + [None]):
        if step == subscribe_at:
            table.add("q", ROUTE, "s", spec)
            reading = {0: None, 1: None}
        if reading is not None:
            read_pages()
        if planned is None:
            break
        planned_write = _planned(sources, planned)
        if planned_write is None:
            continue
        source, operation, key, n, on, _ = planned_write
        item = source.write(operation, key, n=n, on=on)
        in_flight[source.index].append(item)
        if step % 3 == 0:
            deliver(1)
    if "q" not in table.queries:  # subscribe_at was past the last write
        table.add("q", ROUTE, "s", spec)
        reading = {0: None, 1: None}
    while reading is not None:
        read_pages()
    deliver(100)
    # The client's view: the result, then every match applied in order (as the SDK's resultStream).
    # Strictly: an add is for an object not shown, a change/remove for one shown, and a change
    # carries a newer version than the one shown (a write applied twice would repeat one).
    versions: dict[str, int] = {}
    for _, (kind, key, *rest) in sent:
        if kind == "result":
            window = [d["id"] for d in rest[0]]
            versions = {d["id"]: d["version"] for d in rest[0]}
            continue
        for event in rest[0]:
            oid, match_type = event["data"]["id"], event["matchType"]
            if match_type == "add":
                assert oid not in versions, event
                versions[oid] = event["data"]["version"]
            elif match_type == "remove":
                assert oid in versions, event
                del versions[oid]
            else:
                assert event["data"]["version"] > versions[oid], event
                versions[oid] = event["data"]["version"]
            if match_type in ("remove", "changeIndex") and oid in window:
                window.remove(oid)
            if match_type in ("add", "changeIndex"):
                if "index" in event:
                    window.insert(event["index"], oid)
                else:
                    window.append(oid)
    fresh = spec.build([d for source in sources for d in source.documents()]).result()
    expected = [d["id"] for d in fresh]
    if spec.sort is None and not spec.limit:
        assert sorted(window) == sorted(expected)
    else:
        assert window == expected


@pytest.mark.parametrize("buffered", [True, False], ids=["buffered while loading", "in flight after"])
def test_each_page_folds_in_or_skips_a_write_by_the_stamp_of_its_own_page(buffered):
    """Page 1 (a, b) is read, then b changes, then page 2 (c) is read. The change is newer than b's
    page, so it counts, although page 2's stamp includes it (one stamp for the whole source, the
    highest, would have dropped it); the inserts are in the pages and are not repeated."""
    source, table = Source(), QueryTable()
    inserts = [source.write("insert", key, n=n) for key, n in (("a", 1), ("b", 2), ("c", 3))]
    table.add("k", ROUTE, "s1", QuerySpec("Todo", sort={"n": 1}, initial=True))
    first = source.page(None, 2)
    change = source.write("update", "b", n=9)
    second = source.page(first.upto, 2)
    assert (first.upto, first.seq, second.upto, second.seq) == ("/db/Todo/b", 3, None, 4)
    if buffered:
        assert table.apply(0, "e0", inserts + [change]) == []  # they reach the query shard while it loads
    [(_, (_, _, result))] = table.load("k", [first, second])
    if buffered:
        assert [(d["id"][-1], d["n"]) for d in result] == [("a", 1), ("c", 3), ("b", 9)]
    else:
        assert [(d["id"][-1], d["n"]) for d in result] == [("a", 1), ("b", 2), ("c", 3)]
        assert table.apply(0, "e0", inserts) == []
        assert brief(table.apply(0, "e0", [change])) == [("match", "k", [("changeIndex", "update", "b", 2)])]
    assert [(d["id"][-1], d["n"]) for d in table.queries["k"].query.result()] == [("a", 1), ("c", 3), ("b", 9)]
    assert table.queries["k"].skip == {}  # past every page: nothing more to skip


def test_a_buffered_write_older_than_the_scan_does_not_overwrite_the_scans_image():
    source, table = Source(), QueryTable()
    table.add("k", ROUTE, "s1", QuerySpec("Todo", sort={"n": 1}, initial=True))
    first, second = source.write("insert", "a", n=1), source.write("update", "a", n=2)
    table.apply(0, "e0", [first])  # reaches the query shard while it loads
    scan = source.scan()  # has n=2
    result = table.load("k", [scan])[0][1][2]
    assert [(d["id"], d["n"], d["version"]) for d in result] == [("/db/Todo/a", 2, 2)]
    assert table.apply(0, "e0", [second]) == []  # already in the result
    assert [(d["n"], d["version"]) for d in table.queries["k"].query.result()] == [(2, 2)]


def test_equality_index_finds_array_elements_and_skips_unrelated_writes():
    table = QueryTable()
    table.add("tags", ROUTE, "s", QuerySpec("Todo", {"tags": "a"}))
    table.add("n", ROUTE, "t", QuerySpec("Todo", {"n": 1, "x": {"$gt": 0}}))
    table.load("tags", [])
    table.load("n", [])
    doc = {"id": "/db/Todo/d", "version": 1, "tags": ["b", "a"], "n": 1.0, "x": 1}
    outputs = table.apply(0, "e", [("Todo", None, doc, "insert", 1, None)])
    assert sorted(key for _, (_, key, *_) in outputs) == ["n", "tags"]
    moved = {**doc, "version": 2, "tags": ["b"], "n": 2}
    outputs = table.apply(0, "e", [("Todo", doc, moved, "update", 2, None)])
    assert brief(outputs) == [("match", "tags", [("remove", "update", "d", None)]),
                              ("match", "n", [("remove", "update", "d", None)])]
    bucket = table.by_bucket["Todo"]
    assert list(bucket.candidates({"n": 7}, None)) == []
    table.remove("tags")
    table.remove("n")
    assert "Todo" not in table.by_bucket


def test_an_insert_into_a_bucket_of_queries_indexed_by_one_field_finds_array_elements_too():
    """Every query of the bucket indexed by one field, no scanned one: an insert is looked up by
    its value at that field, an array by each element."""
    table = QueryTable()
    table.add("a", ROUTE, "s", QuerySpec("Todo", {"tags": "a"}))
    table.add("a2", ROUTE, "t", QuerySpec("Todo", {"tags": "a", "n": {"$gt": 0}}))
    table.add("b", ROUTE, "u", QuerySpec("Todo", {"tags": "b"}))
    for key in ("a", "a2", "b"):
        table.load(key, [])
    assert table.by_bucket["Todo"].fields == {"tags": 3} and not table.by_bucket["Todo"].scan

    def keys(doc):
        return sorted(key for _, (_, key, *_) in table.apply(0, "e", [("Todo", None, doc, "insert", 1, None)]))

    assert keys({"id": "/db/Todo/d1", "version": 1, "tags": "a", "n": 1}) == ["a", "a2"]
    assert keys({"id": "/db/Todo/d2", "version": 1, "tags": ["c", "a"], "n": 0}) == ["a"]
    assert keys({"id": "/db/Todo/d3", "version": 1, "tags": ["b", "a"], "n": 1}) == ["a", "a2", "b"]
    assert keys({"id": "/db/Todo/d4", "version": 1, "tags": "c"}) == []
    assert keys({"id": "/db/Todo/d5", "version": 1}) == []


def test_a_held_document_the_subscriber_may_no_longer_read_leaves_as_updated_not_deleted():
    source = Source()
    source.write("insert", "a", n=1, on=True)
    held = [(d["id"], tag(d)) for d in source.documents()]
    source.write("update", "a", acl={"read": {"/db/User/u1": "allow"}, "write": {}})
    table = QueryTable()
    table.add("k", ROUTE, "s1", QuerySpec("Todo", {"on": True}), reader(frozenset()), Known(held, HEARD))
    outputs = table.load("k", [source.scan()])  # the page has it (it matches), the subscriber may not read it
    assert brief(outputs) == [("match", "k", [("remove", "update", "a", None)])]
    assert outputs[0][1][2][0]["data"] == {"id": "/db/Todo/a"}


def test_a_write_tests_the_predicate_of_one_query_text_once_for_all_its_queries(monkeypatch):
    import weakref

    from actors.baqend import rtquery

    tested = []
    compile_query = rtquery.compile_query

    def counted(query):
        test = compile_query(query)

        def predicate(document):
            tested.append(document["id"])
            return test(document)
        return predicate

    monkeypatch.setattr(rtquery, "compile_query", counted)
    monkeypatch.setattr(rtquery, "_shared", weakref.WeakValueDictionary())
    table = QueryTable()
    text = {"g": 1, "n": {"$gt": 0}}
    for index in range(5):
        table.add(f"k{index}", ROUTE, f"s{index}", QuerySpec("Todo", text))
    table.add("sorted", ROUTE, "t", QuerySpec("Todo", text, sort={"n": -1}, limit=2))
    table.add("other", ROUTE, "u", QuerySpec("Todo", {"g": 1, "n": {"$gt": 5}}))
    table.add("anon", ROUTE, "v", QuerySpec("Todo", text), reader(frozenset()))
    for key in list(table.queries):
        table.load(key, [])
    tested.clear()
    document = {"id": "/db/Todo/d", "version": 1, "acl": None, "g": 1, "n": 3}
    outputs = table.apply(0, "e", [("Todo", None, document, "insert", 1, None)])
    assert brief(outputs) == [*[("match", f"k{index}", [("add", "insert", "d", None)]) for index in range(5)],
                              ("match", "sorted", [("add", "insert", "d", 0)]),
                              ("match", "anon", [("add", "insert", "d", None)])]
    # once for the five queries and the sorted one, once for "other", once inside "anon"'s own check
    assert tested == ["/db/Todo/d"] * 3
    tested.clear()
    # two writes in one batch: each tested on its own
    private = {**document, "version": 2, "n": 7, "acl": {"read": {"/db/User/u1": "allow"}, "write": {}}}
    public = {"id": "/db/Todo/e", "version": 1, "acl": None, "g": 1, "n": 9}
    outputs = table.apply(0, "e", [("Todo", document, private, "update", 2, None),
                                   ("Todo", None, public, "insert", 3, None)])
    assert brief(outputs) == [*[("match", f"k{index}", [("change", "update", "d", None)]) for index in range(5)],
                              ("match", "sorted", [("change", "update", "d", 0)]),
                              ("match", "other", [("add", "update", "d", None)]),
                              ("match", "anon", [("remove", "update", "d", None)]),
                              *[("match", f"k{index}", [("add", "insert", "e", None)]) for index in range(5)],
                              ("match", "sorted", [("add", "insert", "e", 0)]),
                              ("match", "other", [("add", "insert", "e", None)]),
                              ("match", "anon", [("add", "insert", "e", None)])]
    assert tested == ["/db/Todo/d"] * 3 + ["/db/Todo/e"] * 3


# -- shared result states ----------------------------------------------------------------------------

class Unshared(QueryTable):
    """Every query keeps its own state: what sharing must be indistinguishable from."""

    def _share(self, live):
        pass


def test_equal_queries_share_one_state_matched_once_and_send_the_same_events(monkeypatch):
    from actors.baqend.rtquery import RealtimeQuery

    computed = []
    changes = RealtimeQuery.changes

    def counted(self, *args, **kwargs):
        computed.append(self)
        return changes(self, *args, **kwargs)

    monkeypatch.setattr(RealtimeQuery, "changes", counted)
    source, table = Source(), QueryTable()
    table.apply(0, "e0", [source.write("insert", "a", g=1, n=1)])
    anonymous, user = reader(frozenset()), reader(frozenset({"/db/User/u1"}))
    assert reader(frozenset()) is anonymous  # one reader for the same principals
    text = {"g": 1}
    for index in range(5):  # the same query, the same reader: one state
        table.add(f"k{index}", ("gw", 10 + index), f"s{index}", QuerySpec("Todo", text), anonymous)
    table.add("sorted", ROUTE, "t", QuerySpec("Todo", text, sort={"n": -1}, limit=2), anonymous)
    table.add("user", ROUTE, "u", QuerySpec("Todo", text), user)  # another reader: its own
    table.add("filtered", ROUTE, "v", QuerySpec("Todo", text, match_types=["add"]), anonymous)  # other filters
    for key in list(table.queries):
        table.load(key, [source.scan()])
    assert [len(state.members) for state in table.states.values()] == [5, 1, 1, 1]
    assert len({id(table.queries[f"k{index}"].query) for index in range(5)}) == 1
    assert table.stats()["shared_states"] == 4 and table.stats()["sharing"] == 5
    computed.clear()
    outputs = _QueryTable.apply(table, 0, "e0", [source.write("update", "a", g=1, n=2)])
    assert len(computed) == 4  # once a state, not once a query
    assert [(route, payload[0]) for route, payload in outputs] == [
        *[(("gw", 10 + index), f"k{index}") for index in range(5)], (ROUTE, "sorted"), (ROUTE, "user"),
        (ROUTE, "filtered")]  # no event it asked for; the change for the gateway's view of its result
    assert len({id(payload[1]) for _, payload in outputs[:5]}) == 1  # one list, pickled once in a bundle
    assert brief(_tagged(outputs)) == [*[("match", f"k{index}", [("change", "update", "a", None)]) for index in range(5)],
                                       ("match", "sorted", [("change", "update", "a", 0)]),
                                       ("match", "user", [("change", "update", "a", None)]),
                                       ("match", "filtered", [])]
    assert table.events == 7
    # Members leave; the state stays for the others, and goes with the last one.
    key = next(key for key, state in table.states.items() if len(state.members) == 5)
    assert table.remove("k0") and table.purge_connection(("gw", 11)) == 1
    assert sorted(table.states[key].members) == ["k2", "k3", "k4"]
    outputs = table.apply(0, "e0", [source.write("insert", "b", g=1, n=3)])
    assert [key for _, (_, key, *_) in outputs] == ["k2", "k3", "k4", "sorted", "user", "filtered"]
    for member in ("k2", "k3", "k4"):
        table.remove(member)
    assert key not in table.states and len(table.states) == 3


def test_the_bucket_indexes_a_shared_state_once_in_its_members_place():
    """A write meets a state once (not each member), its events reach every member by the lists
    the state makes at the first write after its members changed (a join or a leave costs no walk
    over the members), and a connection's queries hold one route object."""
    source, table = Source(), QueryTable()
    table.apply(0, "e0", [source.write("insert", "z", g=2, n=0)])  # the shard has seen the source's writes
    for index in range(4):
        table.add(f"k{index}", ("gw", index % 2), f"s{index}", QuerySpec("Todo", {"g": 1}))
    table.add("own", ("gw", 0), "t", QuerySpec("Todo", {"g": 1}, sort={"n": 1}, limit=3))
    bucket = table.by_bucket["Todo"]
    assert list(bucket.equal[("g", 1)]) == ["k0", "k1", "k2", "k3", "own"] and bucket.size == 5  # loading: each its own
    for key in list(table.queries):
        table.load(key, [source.scan()])
    [(key, state), (own_key, own)] = table.states.items()
    assert list(bucket.equal[("g", 1)].values()) == [state, own] and bucket.size == 2 and bucket.fields == {"g": 2}
    assert list(state.members) == ["k0", "k1", "k2", "k3"] and state.keys is None  # made at the first write
    assert table.queries["k0"].route is table.queries["k2"].route is table.queries["own"].route
    outputs = table.apply(0, "e0", [source.write("insert", "a", g=1, n=1)])
    assert brief(outputs) == [*[("match", f"k{index}", [("add", "insert", "a", None)]) for index in range(4)],
                              ("match", "own", [("add", "insert", "a", 0)])]
    assert [route for route, _ in outputs] == [("gw", 0), ("gw", 1), ("gw", 0), ("gw", 1), ("gw", 0)]
    assert state.keys == ["k0", "k1", "k2", "k3"] and state.routes == [("gw", 0), ("gw", 1)] * 2
    assert table.events == 5
    table.remove("k1")
    assert state.keys is None and list(state.members) == ["k0", "k2", "k3"] and bucket.size == 2
    outputs = table.apply(0, "e0", [source.write("insert", "b", g=1, n=2)])
    assert [key for _, (_, key, *_) in outputs] == ["k0", "k2", "k3", "own"]
    for member in ("k0", "k2", "k3"):
        table.remove(member)
    assert list(bucket.equal[("g", 1)].values()) == [own] and bucket.size == 1 and key not in table.states
    assert table.purge_connection(("gw", 0)) == 1
    assert table.by_bucket == {} and table.states == {} and table.by_connection == {} and table.routes == {}


def test_the_same_text_indexed_and_not_keeps_two_states_each_query_once():
    """``{"g": 1}`` as a dict is indexed by g = 1, sent as JSON text it is not (scanned): the same
    share key, but a state stands in the bucket under its members' term, so they do not share one.
    (Shared, the scanned one stayed in the bucket beside the state: every event twice, and events
    after it was removed.)"""
    table = QueryTable()
    table.add("a", ("gw", 1), "s1", QuerySpec("Todo", {"g": 1}))
    table.add("b", ("gw", 2), "s2", QuerySpec("Todo", '{"g": 1}'))
    table.add("c", ("gw", 3), "s3", QuerySpec("Todo", {"h": 1}))
    for key in ("a", "b", "c"):
        table.load(key)
    assert table.queries["a"].query.share_key == table.queries["b"].query.share_key
    assert table.queries["a"].state is not table.queries["b"].state and len(table.states) == 3
    bucket = table.by_bucket["Todo"]
    assert bucket.size == 3 and len(bucket.scan) == 1 and bucket.fields == {"g": 1, "h": 1}

    def insert(name):
        doc = {"id": f"/db/Todo/{name}", "version": 1, "g": 1}
        return sorted(key for _, (_, key, *_) in table.apply(0, "e", [("Todo", None, doc, "insert", 1, None)]))

    assert insert("d") == ["a", "b"]
    table.remove("b")
    assert insert("e") == ["a"] and bucket.size == 2 and not bucket.scan


def test_a_query_joins_its_equal_state_only_once_it_has_seen_the_same_writes():
    source, table = Source(), QueryTable()
    table.add("first", ROUTE, "s1", QuerySpec("Todo", {"g": 1}))
    table.load("first", [source.scan()])
    in_flight = [source.write("insert", "a", g=1, n=1)]
    assert brief(table.apply(0, "e0", in_flight)) == [("match", "first", [("add", "insert", "a", None)])]
    late = [source.write("insert", "b", g=1, n=2)]
    table.add("second", ROUTE, "s2", QuerySpec("Todo", {"g": 1}))
    table.load("second", [source.scan()])  # its page has b, whose write has not reached this shard yet
    assert table.queries["second"].skip and table.queries["second"].state is None
    assert brief(table.apply(0, "e0", late)) == [("match", "first", [("add", "insert", "b", None)])]
    second = table.queries["second"]
    assert not second.skip and second.state is table.queries["first"].state and len(second.state.members) == 2
    outputs = table.apply(0, "e0", [source.write("update", "a", g=1, n=5)])
    assert brief(outputs) == [("match", "first", [("change", "update", "a", None)]),
                              ("match", "second", [("change", "update", "a", None)])]


def test_a_query_whose_documents_differ_from_the_state_keeps_its_own():
    """Cannot happen when both have seen the same writes: checked, not assumed."""
    source, table = Source(), QueryTable()
    table.apply(0, "e0", [source.write("insert", "a", g=1, n=1)])
    table.add("first", ROUTE, "s1", QuerySpec("Todo", {"g": 1}))
    table.load("first", [source.scan()])
    table.add("second", ROUTE, "s2", QuerySpec("Todo", {"g": 1}))
    table.load("second", [scan(0, "e0", source.seq, [])])  # a page without "a"
    first, second = table.queries["first"], table.queries["second"]
    assert second.state is None and second.query is not first.query
    outputs = table.apply(0, "e0", [source.write("update", "a", g=1, n=2)])
    assert brief(outputs) == [("match", "first", [("change", "update", "a", None)]),
                              ("match", "second", [("add", "update", "a", None)])]


SHARED_SPECS = [  # equal pairs, and near misses of each
    QuerySpec("Todo", {"on": True}, initial=True),
    QuerySpec("Todo", {"on": True}, initial=True),
    QuerySpec("Todo", '{"on": true}', initial=False),  # the same text sent as JSON: shared, without a result
    QuerySpec("Todo", {"on": True}, match_types=["add", "remove"], initial=True),
    QuerySpec("Todo", {"on": True}, {"n": -1}, 0, 2, initial=True),
    QuerySpec("Todo", {"on": True}, {"n": -1}, 0, 2, initial=True),
    QuerySpec("Todo", {"on": True}, {"n": -1}, 1, 2, operations=["update"], initial=True),
    QuerySpec("Todo", {"n": 3}, initial=True),  # indexed by n = 3
    QuerySpec("Todo", {"n": 3}, initial=True),
    QuerySpec("Todo", '{"n": 3}', initial=True),  # the same text sent as JSON: not indexed (scanned)
]
PRINCIPALS = [frozenset(), frozenset({"/db/User/u1"})]


@settings(max_examples=150, deadline=None)
@given(st.lists(write, max_size=30),
       st.lists(st.tuples(st.integers(0, 30), st.sampled_from(range(len(SHARED_SPECS))), st.integers(0, 1),
                          st.integers(0, 30)), min_size=1, max_size=6),
       st.integers(0, 3), st.integers(1, 3))
def test_shared_states_send_exactly_what_unshared_queries_send(writes, subscriptions, delivered_at, page_rows):
    """Subscriptions (some equal, some with another reader, some unsubscribed later) arrive while
    writes race their pages to the query shard, as in the property above; a table that shares
    states sends, to every subscription, exactly what one that does not share sends. (Within one
    call, in the order of each subscription's own outputs: the order between subscriptions, each
    on a route of its own, is not a contract; a shared state answers for its members together.)"""
    sources = [Source(0, "a"), Source(1, "b")]
    in_flight: list[list[tuple]] = [[], []]
    tables = [QueryTable(), Unshared()]
    sent: list[list] = [[], []]
    reading: dict[str, dict[int, str | None]] = {}  # subscription -> where each source's next page starts

    def each(call, *args):
        results = [call(table, *args) for table in tables]
        for index, result in enumerate(results):
            if isinstance(result, list):
                sent[index].extend(sorted(result, key=lambda output: output[0]))  # stable: each route's order
            else:
                sent[index].append(result)
        return results

    def deliver(count: int) -> None:
        for index in (0, 1):
            items, in_flight[index] = in_flight[index][:count], in_flight[index][count:]
            if items:
                each(QueryTable.apply, index, sources[index].epoch, items)

    def read_pages() -> None:
        for key in list(reading):
            pages = [sources[index].page(after, page_rows) for index, after in reading[key].items()]
            deliver(delivered_at)
            for page in pages:
                each(_QueryTable.page, key, page)
                reading[key][page.source] = page.upto
                if page.upto is None:
                    del reading[key][page.source]
            if not reading[key]:
                each(QueryTable.load, key)
                del reading[key]

    for step, planned in enumerate(writes + [None]):
        for number, (at, which, principals, leave) in enumerate(subscriptions):
            key = f"q{number}"
            if at == step:
                each(_QueryTable.add, key, ("gw", number), f"s{number}", SHARED_SPECS[which],
                     reader(PRINCIPALS[principals]))
                reading[key] = {0: None, 1: None}
            elif at < leave == step:
                reading.pop(key, None)
                each(_QueryTable.remove, key)
        read_pages()
        if planned is None:
            break
        planned_write = _planned(sources, planned)
        if planned_write is None:
            continue
        source, operation, key, n, on, exists = planned_write
        fields = {"n": n, "on": on}
        if n == 6:  # only u1 may read it
            fields["acl"] = {"read": {"/db/User/u1": "allow"}, "write": {}}
        elif exists:
            fields["acl"] = None
        in_flight[source.index].append(source.write(operation, key, **fields))
        if step % 3 == 0:
            deliver(1)
    while reading:
        read_pages()
    deliver(100)
    assert sent[0] == sent[1]
    assert tables[0].events == tables[1].events
    assert len({id(state.query) for state in tables[0].states.values()}) == len(tables[0].states)
    held = len(tables[0].queries)
    assert tables[0].purge_gateway("gw") == held and tables[0].states == {}  # none left behind


def test_a_query_registered_again_joins_its_equal_state_once_loaded():
    source = Source()
    for key, n in (("a", 1), ("b", 2)):
        source.write("insert", key, n=n, on=True)
    held = [(d["id"], tag(d)) for d in source.documents()]
    source.write("update", "b", on=False)
    table = QueryTable()
    table.add("fresh", ROUTE, "s0", QuerySpec("Todo", {"on": True}), reader(frozenset()))
    table.load("fresh", [source.scan()])
    include = frozenset(oid for oid, _ in held)
    table.add("again", ROUTE, "s1", QuerySpec("Todo", {"on": True}, initial=True), reader(frozenset()), Known(held, HEARD))
    pages = [Scan(0, "e0", source.seq, *source.table.scan("Todo", lambda d: d.get("on") is True, include=include))]
    assert brief(table.apply(0, "e0", [source.write("insert", "c", n=3, on=True)])) == [
        ("match", "fresh", [("add", "insert", "c", None)])]
    assert brief(table.load("again", pages)) == [("match", "again", [("remove", "update", "b", None),
                                                                     ("add", "insert", "c", None)])]
    again, fresh = table.queries["again"], table.queries["fresh"]
    assert again.state is not None and again.state is fresh.state and again.query is fresh.query
    assert brief(table.apply(0, "e0", [source.write("update", "a", n=9)])) == [
        ("match", "fresh", [("change", "update", "a", None)]), ("match", "again", [("change", "update", "a", None)])]
