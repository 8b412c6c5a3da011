"""actors/baqend/resync.py: the events that bring what a client holds to a rebuilt live query's
fresh result, for plain and sorted queries, and the property that applying them as the SDK does
always ends at the fresh window."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from actors.baqend.contract import tag
from actors.baqend.resync import resync

BEFORE = "2026-01-01T00:00:00.000Z"  # the documents' times before the client's last message
SINCE = "2026-01-01T00:00:01.000Z"  # its last message
AFTER = "2026-01-01T00:00:02.000Z"  # written while its query shard was down


def doc(key: str, version: int = 1, created: str = BEFORE, updated: str | None = None, **fields) -> dict:
    return {"id": f"/db/T/{key}", "version": version, "createdAt": created, "updatedAt": updated or created, **fields}


def held(*documents: dict) -> list[tuple[str, tuple]]:
    return [(document["id"], tag(document)) for document in documents]


def gone(oid: str):
    return None, False


def brief(events) -> list[tuple]:
    return [(e.match_type, e.operation, e.data["id"].rsplit("/", 1)[1], e.index) for e in events]


def test_a_plain_query_gets_removes_then_adds_and_changes_each_with_what_happened_to_it():
    a, b, c, d = doc("a"), doc("b"), doc("c"), doc("d")
    b_now = doc("b", 2, updated=AFTER, on=False)  # written: no longer matches
    c_now = doc("c", 2, updated=AFTER)
    e_new = doc("e", created=AFTER)  # created while the shard was down
    f_now = doc("f", 3, updated=AFTER)  # written into the result
    images = {b["id"]: (b_now, True)}
    events = resync(held(d, c, b, a), SINCE, [f_now, a, e_new, c_now], False, lambda oid: images.get(oid, gone(oid)))
    assert brief(events) == [("remove", "update", "b", None), ("remove", "delete", "d", None),
                             ("change", "update", "c", None), ("add", "insert", "e", None),
                             ("add", "update", "f", None)]
    assert events[0].data == b_now and events[1].data == {"id": "/db/T/d"}  # deleted: no version
    assert events[2].data == c_now and events[3].data == e_new


def test_nothing_changed_means_no_event():
    documents = [doc("a"), doc("b", 4)]
    assert resync(held(*documents), SINCE, documents, False, gone) == []
    assert resync(held(*documents), SINCE, documents, True, gone) == []


def test_a_document_the_subscriber_may_no_longer_read_leaves_with_its_id_only():
    a = doc("a")
    hidden = doc("a", 2, updated=AFTER, acl={"read": {"/db/User/x": "allow"}})
    events = resync(held(a), SINCE, [], False, lambda oid: (hidden, False))
    assert brief(events) == [("remove", "update", "a", None)] and events[0].data == {"id": "/db/T/a"}


def test_a_window_pushed_by_others_gets_none_and_its_own_writes_get_update():
    # [d30 d40 d50] offset 2, limit 3: d35 inserted, d50 deleted, d60 renamed past the limit, d20
    # (offset zone) left the result: now [d35 d40 d60]; d30 is in the offset zone, unchanged
    d30, d40, d50 = doc("d30", n=30), doc("d40", n=40), doc("d50", n=50)
    d35, d60 = doc("d35", created=AFTER, n=35), doc("d60", 2, updated=AFTER, n=60)
    images = {d30["id"]: (d30, True)}
    events = resync(held(d30, d40, d50), SINCE, [d35, d40, d60], True, lambda oid: images.get(oid, gone(oid)))
    assert brief(events) == [("remove", "none", "d30", None), ("remove", "delete", "d50", None),
                             ("add", "insert", "d35", 0), ("add", "update", "d60", 2)]


def test_a_window_document_that_moved_gets_change_index_and_one_that_stayed_gets_change():
    a, b, c = doc("a", n=1), doc("b", n=2), doc("c", n=3)
    a_moved = doc("a", 2, updated=AFTER, n=5)  # a moved to the end
    b_renamed = doc("b", 2, updated=AFTER, n=2, name="x")
    events = resync(held(a, b, c), SINCE, [b_renamed, c, a_moved], True, gone)
    assert brief(events) == [("changeIndex", "update", "a", 2), ("change", "update", "b", 0)]


def test_documents_that_kept_their_order_stay_and_the_changed_ones_move():
    a, b, c, d = (doc(k) for k in "abcd")
    b2, c2 = doc("b", 2, updated=AFTER), doc("c", 2, updated=AFTER)
    # b and c swapped places around the unchanged a and d
    events = resync(held(a, b, c, d), SINCE, [c2, a, d, b2], True, gone)
    assert brief(events) == [("changeIndex", "update", "c", 0), ("changeIndex", "update", "b", 3)]


def sdk_apply(window: list[str], events) -> list[str]:
    """What the SDK's resultStream does with the events of a sorted query."""
    window = list(window)
    for event in events:
        oid = event.data["id"]
        if event.match_type in ("remove", "changeIndex"):
            window.remove(oid)
        if event.match_type in ("add", "changeIndex"):
            assert 0 <= event.index <= len(window), (event, window)
            window.insert(event.index, oid)
    return window


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from("abcdefghij"), unique=True, max_size=8),
       st.lists(st.sampled_from("abcdefghij"), unique=True, max_size=8),
       st.sets(st.sampled_from("abcdefghij")), st.sets(st.sampled_from("abcdefghij")))
def test_applying_the_events_as_the_sdk_does_ends_at_the_fresh_window(before, after, written, deleted):
    """Unchanged documents keep their order (their sort keys did not move), so they never get a
    changeIndex nor a change; every event's index is valid when it is applied."""
    unchanged = [key for key in before if key not in written]
    order = [key for key in after if key in unchanged]
    if order != [key for key in unchanged if key in after]:
        return  # not a real window: unchanged documents cannot cross each other
    old = {key: doc(key) for key in before}
    new = {key: doc(key, 2, updated=AFTER) if key in written else doc(key) for key in after}
    images = {doc(key)["id"]: (None if key in deleted else (doc(key, 2, updated=AFTER) if key in written else
                                                          doc(key)), True) for key in before}
    events = resync(held(*old.values()), SINCE, list(new.values()), True, lambda oid: images[oid])
    assert sdk_apply([old[key]["id"] for key in before], events) == [new[key]["id"] for key in after]
    for event in events:
        key = event.data["id"].rsplit("/", 1)[1]
        if key in unchanged and key in after:
            assert (event.match_type, event.operation) == ("add", "none") and key not in before, event
        if event.match_type in ("change", "changeIndex"):
            assert key in written and key in before
