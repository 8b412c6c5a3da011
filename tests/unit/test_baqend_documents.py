"""actors/baqend/documents.py: versioned writes, partial updates, acl rules and the stores.

The store tests take ``store_settings`` (tests/unit/conftest.py): each runs on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import secrets
import sqlite3

import orjson
import psycopg
import pytest

from actors.baqend.documents import (
    DocumentStore, DocumentTable, MemoryDocumentStore, Page, apply_update, iso_now, open_document_store, permitted,
    principals_of,
)
from router.errors import CommandError
from router.settings import load_settings

NOW, LATER = "2026-01-01T00:00:00.000Z", "2026-01-01T00:00:01.000Z"


def refused(call, *args) -> tuple[str, str]:
    with pytest.raises(CommandError) as caught:
        call(*args)
    return caught.value.code, caught.value.message


def test_insert_stamps_metadata_and_ignores_client_metadata():
    table = DocumentTable(MemoryDocumentStore())
    before, after = table.insert("Todo", "a", {"id": "x", "version": 9, "createdAt": "no", "name": "A"}, NOW)
    assert before is None
    assert after == {"id": "/db/Todo/a", "version": 1, "acl": None, "createdAt": NOW, "updatedAt": NOW, "name": "A"}
    assert refused(table.insert, "Todo", "a", {}, NOW) == ("exists", "the object /db/Todo/a already exists")


def test_replace_checks_if_match_and_upserts_without_it():
    table = DocumentTable(MemoryDocumentStore())
    table.insert("Todo", "a", {"n": 1}, NOW)
    before, after = table.replace("Todo", "a", {"n": 2}, "1", LATER)
    assert (before["version"], after["version"], after["n"], after["createdAt"], after["updatedAt"]) == (1, 2, 2, NOW, LATER)
    assert refused(table.replace, "Todo", "a", {}, "1", LATER) == (
        "precondition_failed", "the object /db/Todo/a is at version 2, not 1")
    assert refused(table.replace, "Todo", "b", {}, "*", LATER) == ("not_found", "the object /db/Todo/b does not exist")
    assert table.replace("Todo", "b", {"n": 7}, None, LATER) == (None, {
        "id": "/db/Todo/b", "version": 1, "acl": None, "createdAt": LATER, "updatedAt": LATER, "n": 7})


def test_delete_returns_the_last_image_and_checks_the_version():
    table = DocumentTable(MemoryDocumentStore())
    table.insert("Todo", "a", {"n": 1}, NOW)
    assert refused(table.delete, "Todo", "a", "2")[0] == "precondition_failed"
    before, after = table.delete("Todo", "a", "1")
    assert (before["n"], after) == (1, None)
    assert table.get("/db/Todo/a") is None
    assert refused(table.delete, "Todo", "a", None)[0] == "not_found"


def test_partial_update_operators():
    document = {"id": "/db/T/a", "version": 1, "n": 5, "tags": ["x"], "m": {"k": 1}, "bits": 6, "list": [1, 2, 3]}
    updated = apply_update(document, {
        "$set": {"name": "N", "deep.er": 1}, "$inc": {"n": 2, "fresh": 1}, "$push": {"tags": "y"},
        "$unshift": {"list": 0}, "$put": {"m": {"j": 2}}, "$xor": {"bits": 3}, "$currentDate": {"at": None},
        "$max": {"top": 4}, "$replace": {"list.1": 9},
    }, LATER)
    assert updated == {"id": "/db/T/a", "version": 1, "n": 7, "fresh": 1, "tags": ["x", "y"], "m": {"k": 1, "j": 2},
                       "bits": 5, "list": [0, 9, 2, 3], "name": "N", "deep": {"er": 1}, "at": LATER, "top": 4}
    assert document["tags"] == ["x"]  # the before image is untouched
    assert apply_update(document, {"$unset": {"m": 1}, "$pop": {"list": 1}, "$shift": {"tags": 1},
                                   "$remove": {}, "$mul": {"n": 3}, "$rename": {"bits": "b"}}, LATER) == {
        "id": "/db/T/a", "version": 1, "n": 15, "tags": [], "b": 6, "list": [1, 2]}
    assert apply_update({"id": "i", "s": [1, 2, 1], "d": {"a": 1}}, {"$remove": {"s": 1}, "$add": {"s": 3}}, NOW) == {
        "id": "i", "s": [2, 3], "d": {"a": 1}}


@pytest.mark.parametrize(("operations", "message"), [
    ({}, 'a partial update is an object such as {"$set": {"name": "x"}}'),
    ({"$bogus": {"a": 1}}, "unknown update operator $bogus"),
    ({"$inc": {"n": "1"}}, "$inc on n needs a number"),
    ({"$set": {"version": 3}}, "version cannot be changed by a partial update"),
    ({"$push": {"n": 1}}, "$push: n is not an array"),
    ({"$set": 5}, "$set needs an object of field paths"),
])
def test_bad_partial_updates_are_refused(operations, message):
    code, text = refused(apply_update, {"id": "i", "n": 1}, operations, NOW)
    assert code == "bad_request" and text.startswith(message)


def test_acl_rules_and_principals():
    user = frozenset({"/db/User/u1"})
    assert permitted(None, frozenset()) and permitted({}, frozenset())
    assert not permitted({"/db/User/u1": "allow"}, frozenset())
    assert permitted({"/db/User/u1": "allow"}, user)
    assert not permitted({"/db/User/u1": "deny"}, user)
    assert permitted({"/db/User/u2": "deny"}, user)
    assert principals_of({"sub": "u1", "roles": ["admin", "/db/Role/x"]}) == {
        "/db/User/u1", "/db/Role/admin", "/db/Role/x"}
    table = DocumentTable(MemoryDocumentStore())
    table.insert("T", "a", {"acl": {"read": {}, "write": {"/db/User/u1": "allow"}}}, NOW)
    assert refused(table.update, "T", "a", {"$set": {"x": 1}}, None, NOW, frozenset())[0] == "forbidden"
    assert table.update("T", "a", {"$set": {"x": 1}}, None, NOW, user)[1]["x"] == 1
    assert refused(table.insert, "T", "b", {"acl": {"read": {"u": "maybe"}}}, NOW)[0] == "bad_request"


def test_the_store_persists_commits_and_scans_only_owned_ids(store_settings):
    table = DocumentTable(open_document_store(store_settings), owns=lambda oid: oid.endswith(("a", "b")))
    table.insert("T", "a", {"n": 1}, NOW)
    table.insert("T", "b", {"n": 2}, NOW)
    table.insert("U", "a", {"n": 3}, NOW)
    assert table.dirty and [d["n"] for d in table.scan("T").documents] == [1, 2]  # pending writes are visible
    table.commit()
    table.delete("T", "b", None)
    table.commit()
    table.store.close()
    reopened = DocumentTable(open_document_store(store_settings), owns=lambda oid: oid.endswith("a"))
    assert [d["id"] for d in reopened.scan("T").documents] == ["/db/T/a"]
    assert reopened.get("/db/U/a")["n"] == 3 and reopened.get("/db/T/b") is None
    assert reopened.scan("T", lambda d: d["n"] > 5) == Page([], None, 0)


def pages(table: DocumentTable, bucket: str, keep=lambda d: True, **bounds) -> list[Page]:
    found, after = [], None
    while True:
        page = table.scan(bucket, keep, after, **bounds)
        found.append(page)
        if page.upto is None:
            return found
        after = page.upto


def test_a_scan_reads_at_most_max_rows_and_max_bytes_per_page_and_pages_cover_the_bucket(store_settings):
    """Before: a scan answered the whole bucket in one reply, however large."""
    check_pages(open_document_store(store_settings))


def test_the_memory_store_pages_as_the_others():
    check_pages(MemoryDocumentStore())


def check_pages(backend: DocumentStore) -> None:
    table = DocumentTable(backend, owns=lambda oid: int(oid[-2:]) % 2 == 0)  # the even keys are this shard's
    for index in range(30):  # every document the same size
        table.insert("T", f"k{index:02d}", {"n": index, "pad": "x" * (40 - len(str(index)))}, NOW)
    table.insert("U", "k00", {"n": 0}, NOW)
    table.commit()
    size = len(orjson.dumps(table.get("/db/T/k00")))
    found = pages(table, "T", lambda d: d["n"] % 4 == 0, max_rows=7, max_bytes=10 * size)
    assert [d["n"] for page in found for d in page.documents] == [0, 4, 8, 12, 16, 20, 24, 28]
    # 7 rows a page: ids up to k06, k13, k20, k27, then the rest
    assert [page.upto for page in found] == ["/db/T/k06", "/db/T/k13", "/db/T/k20", "/db/T/k27", None]
    assert all(page.nbytes == len(page.documents) * size for page in found)
    # the byte bound: a page ends before the document that would pass it, but holds at least one
    found = pages(table, "T", max_rows=100, max_bytes=2 * size)
    assert [[d["n"] for d in page.documents] for page in found] == [[0, 2], [4, 6], [8, 10], [12, 14], [16, 18],
                                                                      [20, 22], [24, 26], [28]]
    assert [page.upto for page in found][:2] == ["/db/T/k02", "/db/T/k06"]  # the next scan goes on after it
    assert [len(page.documents) for page in pages(table, "T", max_rows=100, max_bytes=1)] == [1] * 15


def body(oid: str, n: int = 0) -> bytes:
    return orjson.dumps({"id": oid, "version": 1, "n": n})


def test_a_second_store_reads_what_the_first_saved_at_once(store_settings):
    """Two stores on one location are two shards (two processes, or two nodes on PostgreSQL)."""
    writer, reader = open_document_store(store_settings), open_document_store(store_settings)
    assert reader.load("/db/T/a") is None
    writer.save([("/db/T/a", "T", body("/db/T/a", 1)), ("/db/T/b", "T", body("/db/T/b", 2))])
    assert reader.load("/db/T/a") == orjson.loads(body("/db/T/a", 1))
    assert reader.rows("T", None, 10) == [("/db/T/a", body("/db/T/a", 1)), ("/db/T/b", body("/db/T/b", 2))]
    writer.save([("/db/T/a", "T", None), ("/db/T/b", "T", body("/db/T/b", 3))])  # None deletes
    assert reader.load("/db/T/a") is None
    assert reader.rows("T", None, 10) == [("/db/T/b", body("/db/T/b", 3))]
    writer.close()
    reader.close()


def test_a_save_is_all_or_nothing(store_settings):
    store = open_document_store(store_settings)
    store.save([("/db/T/kept", "T", body("/db/T/kept", 1)), ("/db/T/gone", "T", body("/db/T/gone"))])
    failure = psycopg.errors.NotNullViolation if store_settings.store.postgres else sqlite3.IntegrityError
    with pytest.raises(failure):  # the last row has no bucket: it cannot be stored
        store.save([("/db/T/kept", "T", body("/db/T/kept", 2)), ("/db/T/gone", "T", None),
                    ("/db/T/new", "T", body("/db/T/new")), ("/db/T/broken", None, body("/db/T/broken"))])
    assert store.rows("T", None, 10) == [("/db/T/gone", body("/db/T/gone")), ("/db/T/kept", body("/db/T/kept", 1))]
    store.save([("/db/T/new", "T", body("/db/T/new"))])  # the store is usable after the failed transaction
    assert store.load("/db/T/new") == orjson.loads(body("/db/T/new"))
    store.close()


def test_rows_of_one_save_apply_in_order(store_settings):
    store = open_document_store(store_settings)
    store.save([("/db/T/a", "T", body("/db/T/a", 1)), ("/db/T/a", "T", None),  # written, then deleted
                ("/db/T/b", "T", None), ("/db/T/b", "T", body("/db/T/b", 2)),  # deleted (absent), then written
                ("/db/T/c", "T", body("/db/T/c", 3)), ("/db/T/c", "T", body("/db/T/c", 4))])
    assert store.rows("T", None, 10) == [("/db/T/b", body("/db/T/b", 2)), ("/db/T/c", body("/db/T/c", 4))]
    store.close()


@pytest.fixture
def collated_settings(store_settings, request):
    """``store_settings``, but on PostgreSQL in a database whose default collation is ICU ``en-US``
    (a common server default): there "a" < "B" and "e" < "é" < "f", unlike the byte order in which
    SQLite and the table page ids. The test server's own database sorts by code point anyway."""
    if not store_settings.store.postgres:
        return store_settings
    server = request.getfixturevalue("postgres_server")
    base, database, schema = server.url.rsplit("/", 1)[0], "router_en_us", f"t_{secrets.token_hex(6)}"
    with psycopg.connect(server.url, autocommit=True) as connection:
        if connection.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone() is None:
            connection.execute(f"CREATE DATABASE {database} TEMPLATE template0 LOCALE_PROVIDER icu "
                               "ICU_LOCALE 'en-US' LOCALE 'C.UTF-8'")
    with psycopg.connect(f"{base}/{database}", autocommit=True) as connection:
        assert connection.execute("SELECT 'a' < 'B', 'é' < 'f'").fetchone() == (True, True)
        connection.execute(f'CREATE SCHEMA "{schema}"')
    return load_settings(None, data_dir=store_settings.data_dir,
                         store={"url": f"{base}/{database}?options=-csearch_path%3D{schema}"})


def test_pages_follow_the_byte_order_of_ids_whatever_the_collation(collated_settings):
    store = open_document_store(collated_settings)
    keys = ["f", "a", "é", "B", "e", "z", "Z", "a0", "_"]
    store.save([(f"/db/T/{key}", "T", body(f"/db/T/{key}")) for key in keys])
    ordered = ["B", "Z", "_", "a", "a0", "e", "f", "z", "é"]  # code points: as SQLite and sorted() order them
    assert [oid for oid, _ in store.rows("T", None, 100)] == [f"/db/T/{key}" for key in ordered]
    seen, after = [], None
    while page := store.rows("T", after, 2):
        seen.append([oid.rsplit("/", 1)[1] for oid, _ in page])
        after = page[-1][0]
    assert seen == [["B", "Z"], ["_", "a"], ["a0", "e"], ["f", "z"], ["é"]]
    table = DocumentTable(store)
    table.insert("T", "b", {}, NOW)  # pending: merged into the stored rows in the same order
    pages_seen = pages(table, "T", max_rows=4)
    assert [[d["id"].rsplit("/", 1)[1] for d in page.documents] for page in pages_seen] == [
        ["B", "Z", "_", "a"], ["a0", "b", "e", "f", "z"], ["é"]]
    store.close()


def test_ids_with_nul_are_stored_and_ordered_as_any_other(store_settings):
    """PostgreSQL text cannot hold NUL (an object key may be ``a%00``): such an id must neither fail
    the batch nor meet, or sort differently from, another id."""
    store = open_document_store(store_settings)
    keys = ["a\x01", "a", "a\x00\x01", "a\x02", "a\x00", "a\x01\x01", "a\x01\x02", "b"]
    store.save([(f"/db/T/{key}", "T", body(f"/db/T/{key}", index)) for index, key in enumerate(keys)])
    ordered = sorted(f"/db/T/{key}" for key in keys)
    assert ordered[:5] == ["/db/T/a", "/db/T/a\x00", "/db/T/a\x00\x01", "/db/T/a\x01", "/db/T/a\x01\x01"]
    assert [oid for oid, _ in store.rows("T", None, 100)] == ordered
    assert [oid for oid, _ in store.rows("T", "/db/T/a\x00", 2)] == ["/db/T/a\x00\x01", "/db/T/a\x01"]
    assert [store.load(f"/db/T/{key}")["n"] for key in keys] == list(range(len(keys)))
    store.save([("/db/T/a\x00", "T", None)])
    assert store.load("/db/T/a\x00") is None and store.load("/db/T/a")["n"] == 1
    store.close()


def test_a_page_sees_writes_not_yet_committed_within_its_range():
    table = DocumentTable(MemoryDocumentStore())
    for index in range(6):
        table.insert("T", f"k{index}", {"n": index}, NOW)
    table.commit()
    table.delete("T", "k1", None)
    table.update("T", "k2", {"$set": {"n": 20}}, None, LATER)
    table.insert("T", "k25", {"n": 25}, NOW)  # between k2 and k3
    table.insert("T", "k9", {"n": 9}, NOW)  # past the first page
    first = table.scan("T", after=None, max_rows=3)  # stored rows k0 k1 k2: k1 deleted, k2 changed
    assert ([d["n"] for d in first.documents], first.upto) == ([0, 20], "/db/T/k2")
    second = table.scan("T", after=first.upto, max_rows=3)  # k3 k4 k5, and k25 in that range
    assert ([d["n"] for d in second.documents], second.upto) == ([25, 3, 4, 5], "/db/T/k5")
    third = table.scan("T", after=second.upto, max_rows=3)  # the store is done; k9 is still pending
    assert ([d["n"] for d in third.documents], third.upto) == ([9], None)


def test_iso_timestamps_have_milliseconds():
    assert iso_now(1_502_946_165_540) == "2017-08-17T05:02:45.540Z"
    # the second's text is kept from one call to the next: each call still gets its own second
    assert [iso_now(ms) for ms in (1_502_946_165_999, 1_502_946_166_000, 1_502_946_165_001, 0, 59_999)] == [
        "2017-08-17T05:02:45.999Z", "2017-08-17T05:02:46.000Z", "2017-08-17T05:02:45.001Z",
        "1970-01-01T00:00:00.000Z", "1970-01-01T00:00:59.999Z"]
    # and the millisecond's text: the same millisecond twice, then others of its second and back
    assert [iso_now(ms) for ms in (1_502_946_165_540, 1_502_946_165_540, 1_502_946_165_541, 1_502_946_166_540,
                                   1_502_946_165_540)] == [
        "2017-08-17T05:02:45.540Z", "2017-08-17T05:02:45.540Z", "2017-08-17T05:02:45.541Z",
        "2017-08-17T05:02:46.540Z", "2017-08-17T05:02:45.540Z"]


def test_a_scan_answers_the_included_ids_that_do_not_match_in_its_range():
    """A live query registered again needs the current image of what its client holds, matching or not."""
    table = DocumentTable(MemoryDocumentStore())
    for index in range(6):
        table.insert("T", f"k{index}", {"n": index}, NOW)
    table.commit()
    include = frozenset({"/db/T/k1", "/db/T/k2", "/db/T/k4", "/db/T/gone"})
    first = table.scan("T", lambda d: d["n"] >= 2, None, max_rows=3, include=include)
    assert ([d["n"] for d in first.documents], [d["n"] for d in first.others]) == ([2], [1])  # k2 matches
    second = table.scan("T", lambda d: d["n"] >= 5, first.upto, max_rows=3, include=include)
    assert ([d["n"] for d in second.documents], [d["n"] for d in second.others]) == ([5], [4])
    assert table.scan("T", lambda d: True, None).others == ()  # nothing asked for


def test_the_included_documents_count_against_a_pages_byte_bound():
    table = DocumentTable(MemoryDocumentStore())
    for index in range(4):
        table.insert("T", f"k{index}", {"n": index}, NOW)
    table.commit()
    size = len(orjson.dumps(table.get("/db/T/k0")))
    include = frozenset({"/db/T/k0", "/db/T/k1"})
    first = table.scan("T", lambda d: d["n"] >= 2, None, max_bytes=2 * size, include=include)
    assert ([d["n"] for d in first.others], first.documents, first.nbytes, first.upto) == ([0, 1], [], 0, "/db/T/k1")
    second = table.scan("T", lambda d: d["n"] >= 2, first.upto, max_bytes=2 * size, include=include)
    assert ([d["n"] for d in second.documents], second.others, second.upto) == ([2, 3], (), None)


def test_one_reader_for_the_same_principals_kept_while_held(monkeypatch):
    import gc
    import weakref

    from actors.baqend import documents

    monkeypatch.setattr(documents, "_readers", weakref.WeakValueDictionary())
    anonymous, user = documents.reader(frozenset()), documents.reader(frozenset({"/db/User/u1"}))
    assert documents.reader(frozenset()) is anonymous and documents.reader(frozenset({"/db/User/u1"})) is user
    assert documents.reader({"/db/User/u1"}) is user  # any set of the same principals
    assert documents.reader(frozenset({"/db/User/u2"})) is not user
    private = {"id": "/db/Todo/a", "acl": {"read": {"/db/User/u1": "allow"}}}
    assert user(private) and not anonymous(private)
    del anonymous, user
    gc.collect()
    assert len(documents._readers) == 0
