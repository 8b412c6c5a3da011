"""actors/rtquery.py: results and match events of one real-time query (baqend-realtime-queries.md,
baqend-notes.md "Sorted windows", and the event semantics of the Baqend guide)."""

from __future__ import annotations

import functools
import pickle
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sortedcontainers import SortedList

from actors.baqend import rtquery
from actors.baqend.rtquery import Event, RealtimeQuery, SubscriptionError


def obj(key: str, version: int = 1, **fields: Any) -> dict[str, Any]:
    return {"id": f"/db/Todo/{key}", "version": version, **fields}


def key_of(document: dict[str, Any]) -> str:
    return document["id"].rsplit("/", 1)[1]


def brief(events: list[Event]) -> list[tuple]:
    """(matchType, operation, key, index) of each event; index None when the message omits it."""
    return [(e.match_type, e.operation, key_of(e.data), e.fields().get("index")) for e in events]


def keys(documents: list[dict[str, Any]]) -> list[str]:
    return [key_of(document) for document in documents]


# -- subscribe fields: validation and errors ----------------------------------------------------


def refused(**fields: Any) -> SubscriptionError:
    with pytest.raises(SubscriptionError) as caught:
        RealtimeQuery(**fields)
    return caught.value


def test_offset_beyond_499_is_not_supported():
    error = refused(query="{}", sort='{"name": 1}', offset=500)
    assert error.error == {
        "message": "Offset + limit may not exceed 500, but offset already was 500.",
        "status": 400,
        "reason": "Query Not Supported",
    }


def test_missing_limit_is_500_minus_offset_and_larger_limits_are_capped():
    assert RealtimeQuery(sort={"name": 1}, offset=5).limit == 495
    assert RealtimeQuery(sort={"name": 1}, offset=5, limit=495).limit == 495
    assert RealtimeQuery(sort={"name": 1}, offset=5, limit=500).limit == 495
    assert RealtimeQuery(sort={"name": 1}, offset=499, limit=10).limit == 1
    assert RealtimeQuery(sort={"name": 1}, limit=10).limit == 10


def test_a_query_is_sorted_when_it_has_sort_limit_or_offset():
    assert RealtimeQuery().is_sorted is False
    assert RealtimeQuery().limit is None
    assert RealtimeQuery(sort="{}", limit=0, offset=0).is_sorted is False  # 0 = not given
    assert RealtimeQuery(sort='{"a": -1}').is_sorted is True
    assert RealtimeQuery(limit=3).is_sorted is True
    assert RealtimeQuery(offset=3).is_sorted is True


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"offset": -1}, "offset must be a non-negative integer"),
        ({"offset": "5"}, "offset must be a non-negative integer"),
        ({"offset": 1.5}, "offset must be a non-negative integer"),
        ({"limit": -2}, "limit must be a non-negative integer"),
        ({"limit": True}, "limit must be a non-negative integer"),
        ({"query": "{name:"}, "query is not valid JSON"),
        ({"query": "[1]"}, "a query must be a JSON object, not an array"),
        ({"query": {"name": {"$regex": 5}}}, "\\$regex needs a string"),
        ({"sort": '{"name": 2}'}, "the sort direction of 'name' must be 1 or -1"),
        ({"sort": "{"}, "sort is not valid JSON"),
        ({"match_types": ["banana"]},
         "banana not allowed for match types! \\(permitted: add,change,changeIndex,match,remove.\\)"),
        ({"operations": "upsert"}, "upsert not allowed for operations! \\(permitted: delete,insert,none,update.\\)"),
        ({"match_types": 5}, "match types must be a list of strings"),
        ({"match_types": ["match"], "operations": ["insert"]},
         "Only subscriptions for either operations or matchTypes are allowed"),
        ({"match_types": "remove", "operations": "update"}, "matchTypes and operations at the same time"),
    ],
)
def test_invalid_subscriptions_are_bad_requests(fields, message):
    error = refused(**fields)
    assert error.status == 400
    assert error.reason == "Bad Request"
    with pytest.raises(SubscriptionError, match=message):
        RealtimeQuery(**fields)


def test_unsupported_query_features_are_reported_as_such():
    error = refused(query='{"$where": "true"}')
    assert (error.status, error.reason) == (400, "Query Not Supported")


def test_wildcards_win_as_the_sdk_normalises_them():
    query = RealtimeQuery(match_types=["all", "add"], operations=["any", "insert"])
    assert (query.match_types, query.operations) == (None, None)
    assert RealtimeQuery(match_types=["match"], operations=["any"]).match_types == frozenset({"match"})
    assert RealtimeQuery(match_types=[], operations=None).match_types is None


def test_subscription_errors_survive_pickling():
    error = refused(offset=600)
    copy = pickle.loads(pickle.dumps(error))
    assert copy.error == error.error


# -- initial result ----------------------------------------------------------------------------

BUCKET = [
    obj("c", name="Carl", age=49),
    obj("a", name="Al", age=49),
    obj("x", name="Xaver", age=12),
    obj("d", name="Dave", age=49),
    obj("b", name="Bob", age=49),
]


def test_unsorted_result_holds_every_match_in_arrival_order():
    query = RealtimeQuery('{"age": 49}', documents=BUCKET)
    assert keys(query.result()) == ["c", "a", "d", "b"]
    assert len(query) == 4


def test_sorted_result_is_the_window():
    query = RealtimeQuery('{"age": 49}', '{"name": 1}', offset=1, limit=2, documents=BUCKET)
    assert keys(query.result()) == ["b", "c"]
    assert len(query) == 4  # the items outside the window are kept too


def test_limit_without_sort_orders_by_id():
    query = RealtimeQuery({"age": 49}, limit=3, documents=BUCKET)
    assert keys(query.result()) == ["a", "b", "c"]


def test_descending_sort_with_ties_ordered_by_id():
    query = RealtimeQuery({}, {"age": -1}, documents=BUCKET)
    assert keys(query.result()) == ["a", "b", "c", "d", "x"]


# -- unsorted queries: one event per relevant write --------------------------------------------


@pytest.fixture
def filtered() -> RealtimeQuery:
    return RealtimeQuery('{"age": 49}', documents=[obj("a", name="Al", age=49), obj("z", age=1)])


def test_unsorted_insert_update_delete(filtered):
    assert brief(filtered.apply(None, obj("b", age=49), "insert")) == [("add", "insert", "b", None)]
    assert brief(filtered.apply(None, obj("y", age=2), "insert")) == []
    assert brief(filtered.apply(obj("b", age=49), obj("b", 2, age=49, name="B"), "update")) == [
        ("change", "update", "b", None)
    ]
    assert brief(filtered.apply(obj("z", age=1), obj("z", 2, age=49), "update")) == [("add", "update", "z", None)]
    assert brief(filtered.apply(obj("z", 2, age=49), obj("z", 3, age=50), "update")) == [
        ("remove", "update", "z", None)
    ]
    assert brief(filtered.apply(obj("y", age=2), obj("y", 2, age=3), "update")) == []
    assert brief(filtered.apply(obj("y", 2, age=3), None, "delete")) == []
    assert keys(filtered.result()) == ["a", "b"]


def test_remove_data_is_the_new_image_on_update_and_versionless_on_delete(filtered):
    (removed,) = filtered.apply(obj("a", name="Al", age=49), obj("a", 2, name="Al", age=50), "update")
    assert removed.data == obj("a", 2, name="Al", age=50)  # the SDK keeps the object: it has a version
    filtered.apply(None, obj("b", 1, name="Bob", age=49), "insert")
    (deleted,) = filtered.apply(obj("b", 1, name="Bob", age=49), None, "delete")
    assert deleted.fields() == {
        "matchType": "remove",
        "operation": "delete",
        "data": {"id": "/db/Todo/b", "name": "Bob", "age": 49},  # no version: the SDK marks it deleted
    }


def test_change_data_is_the_new_image_and_unsorted_events_carry_no_index(filtered):
    (event,) = filtered.apply(obj("a", name="Al", age=49), obj("a", 2, name="Alvin", age=49), "update")
    assert event.fields() == {"matchType": "change", "operation": "update", "data": obj("a", 2, name="Alvin", age=49)}
    assert filtered.result() == [obj("a", 2, name="Alvin", age=49)]


def test_writes_must_be_well_formed(filtered):
    with pytest.raises(ValueError, match="operation must be insert, update or delete"):
        filtered.apply(None, obj("q"), "upsert")
    with pytest.raises(ValueError, match="a delete needs a before image"):
        filtered.apply(None, None, "delete")
    with pytest.raises(ValueError, match="an update needs an after image"):
        filtered.apply(obj("a"), None, "update")
    with pytest.raises(ValueError, match="a document needs an 'id'"):
        filtered.apply(None, {"age": 49}, "insert")


# -- sorted windows: the table of baqend-notes.md ----------------------------------------------
#
# offset 2, limit 3, sorted by n:   a b | c d e | f g     (n = 10, 20, ..., 70)
#                              offset zone  window  past limit

INITIAL = {key: 10 * (i + 1) for i, key in enumerate("abcdefg")}


def window_query(**fields: Any) -> RealtimeQuery:
    documents = [obj(key, n=n) for key, n in INITIAL.items()]
    return RealtimeQuery({"n": {"$gte": 0}}, {"n": 1}, offset=2, limit=3, documents=documents, **fields)


def update(key: str, n: int | None) -> tuple:
    after = obj(key, 2, n=n) if n is not None else obj(key, 2, other=True)
    return obj(key, n=INITIAL[key]), after, "update"


def delete(key: str) -> tuple:
    return obj(key, n=INITIAL[key]), None, "delete"


def insert(key: str, n: int) -> tuple:
    return None, obj(key, n=n), "insert"


WINDOW_TABLE = [
    ("insert landing in window", insert("x", 35),
     [("remove", "none", "e", None), ("add", "insert", "x", 1)], "cxd"),
    ("insert landing in offset zone", insert("x", 15),
     [("remove", "none", "e", None), ("add", "none", "b", 0)], "bcd"),
    ("update inside window, moves", update("c", 45),
     [("changeIndex", "update", "c", 1)], "dce"),
    ("update inside window, same place", update("d", 41),
     [("change", "update", "d", 1)], "cde"),
    ("window -> offset zone", update("d", 5),
     [("remove", "update", "d", None), ("add", "none", "b", 0)], "bce"),
    ("offset zone -> window", update("a", 45),
     [("remove", "none", "c", None), ("add", "update", "a", 1)], "dae"),
    ("window -> past limit", update("c", 65),
     [("remove", "update", "c", None), ("add", "none", "f", 2)], "def"),
    ("past limit -> window", update("g", 35),
     [("remove", "none", "e", None), ("add", "update", "g", 1)], "cgd"),
    ("window -> non-match", update("d", -1),
     [("remove", "update", "d", None), ("add", "none", "f", 2)], "cef"),
    ("window -> no longer has the field", update("d", None),
     [("remove", "update", "d", None), ("add", "none", "f", 2)], "cef"),
    ("delete in window", delete("d"),
     [("remove", "delete", "d", None), ("add", "none", "f", 2)], "cef"),
    ("offset zone -> non-match", update("a", -1),
     [("remove", "none", "c", None), ("add", "none", "f", 2)], "def"),
    ("offset zone delete", delete("b"),
     [("remove", "none", "c", None), ("add", "none", "f", 2)], "def"),
    ("offset zone -> past limit", update("a", 65),
     [("remove", "none", "c", None), ("add", "none", "f", 2)], "def"),
    ("past limit -> offset zone", update("g", 5),
     [("remove", "none", "e", None), ("add", "none", "b", 0)], "bcd"),
    ("change entirely in offset zone", update("a", 15), [], "cde"),
    ("change entirely past limit", update("f", 75), [], "cde"),
    ("past limit -> non-match", update("g", -1), [], "cde"),
    ("delete past limit", delete("f"), [], "cde"),
    ("insert past limit", insert("x", 99), [], "cde"),
    ("insert of a non-match", insert("x", -5), [], "cde"),
]


@pytest.mark.parametrize(("write", "expected", "window"), [row[1:] for row in WINDOW_TABLE],
                         ids=[row[0] for row in WINDOW_TABLE])
def test_window_table(write, expected, window):
    query = window_query()
    assert keys(query.result()) == ["c", "d", "e"]
    assert brief(query.apply(*write)) == expected
    assert keys(query.result()) == list(window)


def test_non_matching_update_never_matched_causes_nothing():
    query = window_query()
    query.apply(None, obj("q", n=-3), "insert")
    assert query.apply(obj("q", n=-3), obj("q", 2, n=-4), "update") == []
    assert query.apply(obj("q", 2, n=-4), None, "delete") == []


def test_window_that_is_not_full_only_adds_and_removes():
    query = RealtimeQuery({}, {"n": 1}, limit=3, documents=[obj("a", n=1)])
    assert brief(query.apply(None, obj("b", n=0), "insert")) == [("add", "insert", "b", 0)]
    assert brief(query.apply(obj("a", n=1), None, "delete")) == [("remove", "delete", "a", None)]
    assert brief(query.apply(obj("b", n=0), obj("b", 2, n=5), "update")) == [("change", "update", "b", 0)]
    assert keys(query.result()) == ["b"]


def test_offset_zone_refills_an_empty_window():
    query = RealtimeQuery({}, {"n": 1}, offset=2, documents=[obj("a", n=1), obj("b", n=2)])
    assert query.result() == []
    assert brief(query.apply(None, obj("c", n=0), "insert")) == [("add", "none", "b", 0)]
    assert brief(query.apply(obj("c", n=0), None, "delete")) == [("remove", "none", "b", None)]


def test_window_of_one():
    query = RealtimeQuery({}, {"n": 1}, offset=1, limit=1, documents=[obj(k, n=n) for k, n in zip("abc", (1, 2, 3))])
    assert brief(query.apply(obj("b", n=2), obj("b", 2, n=2.5), "update")) == [("change", "update", "b", 0)]
    assert brief(query.apply(obj("c", n=3), obj("c", 2, n=0), "update")) == [
        ("remove", "none", "b", None), ("add", "none", "a", 0)]
    assert keys(query.result()) == ["a"]


def test_sorted_events_carry_index_except_remove():
    query = window_query()
    removed, added = query.apply(*insert("x", 35))
    assert removed.fields() == {"matchType": "remove", "operation": "none", "data": obj("e", n=50)}
    assert added.fields() == {"matchType": "add", "operation": "insert", "data": obj("x", n=35), "index": 1}


def test_items_pushed_into_the_window_carry_their_current_image():
    query = window_query()
    query.apply(obj("f", n=60), obj("f", 2, n=61, note="moved"), "update")  # past limit: no event
    (_, added) = query.apply(*delete("c"))
    assert added.data == obj("f", 2, n=61, note="moved")


# -- the guide's example ("Example: Subscription and Events") -----------------------------------


def test_guide_example_timestamps_1_to_14():
    todo1 = obj("1", name="My Todo 1")
    query = RealtimeQuery('{"name": {"$regex": "^My Todo"}}', '{"name": 1, "active": -1}', limit=3,
                          documents=[todo1])
    assert query.result() == [todo1]  # the SDK turns it into add/none at index 0

    todo2, todo3 = obj("2", name="My Todo 2"), obj("3", name="My Todo 3")
    assert brief(query.apply(None, todo2, "insert")) == [("add", "insert", "2", 1)]
    assert brief(query.apply(None, todo3, "insert")) == [("add", "insert", "3", 2)]
    todo3b = obj("3", 2, name="My Todo 1b (former 3)")
    assert brief(query.apply(todo3, todo3b, "update")) == [("changeIndex", "update", "3", 1)]
    todo0 = obj("0", name="My Todo 0")
    assert brief(query.apply(None, todo0, "insert")) == [("remove", "none", "2", None), ("add", "insert", "0", 0)]
    todo3c = obj("3", 3, name="My Todo 3")
    assert brief(query.apply(todo3b, todo3c, "update")) == [
        ("remove", "update", "3", None), ("add", "none", "2", 2)]
    assert query.apply(todo3c, None, "delete") == []
    assert keys(query.result()) == ["0", "1", "2"]


def test_sdk_integration_maintain_offset():
    """streamingquery.spec.js "should maintain offset": offset 1, limit 2, ascending name."""
    query = RealtimeQuery({"testID": "t"}, {"name": 1}, offset=1, limit=2)
    person = {k: obj(k.lower(), name=k, testID="t") for k in ("Al", "Bob", "Carl", "Dave")}
    assert query.apply(None, person["Al"], "insert") == []
    assert brief(query.apply(None, person["Bob"], "insert")) == [("add", "insert", "bob", 0)]
    assert brief(query.apply(None, person["Dave"], "insert")) == [("add", "insert", "dave", 1)]
    assert brief(query.apply(None, person["Carl"], "insert")) == [
        ("remove", "none", "dave", None), ("add", "insert", "carl", 1)]
    alvin = obj("al", 2, name="Alvin", testID="t")
    assert query.apply(person["Al"], alvin, "update") == []  # updated in the offset zone


# -- matchTypes and operations filters -----------------------------------------------------------


def run_scenario(**filters: Any) -> list[tuple]:
    """add, change, changeIndex, remove, and pushed items, on offset 2 / limit 3."""
    query = window_query(**filters)
    events = []
    for write in (insert("x", 35), update("d", 39), update("c", 45), (obj("x", n=35), None, "delete")):
        events += brief(query.apply(*write))
    return events


ALL_EVENTS = [
    ("remove", "none", "e", None), ("add", "insert", "x", 1),  # x lands in the window
    ("change", "update", "d", 2),  # c x d -> d stays at 2
    ("changeIndex", "update", "c", 2),  # x d c
    ("remove", "delete", "x", None), ("add", "none", "e", 2),  # d c e
]


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        ({}, ALL_EVENTS),
        ({"match_types": ["all"]}, ALL_EVENTS),
        ({"operations": "any"}, ALL_EVENTS),
        ({"match_types": "add"}, [ALL_EVENTS[1], ALL_EVENTS[5]]),
        ({"match_types": ["remove"]}, [ALL_EVENTS[0], ALL_EVENTS[4]]),
        ({"match_types": ["change"]}, [ALL_EVENTS[2]]),
        ({"match_types": ["changeIndex"]}, [ALL_EVENTS[3]]),
        ({"match_types": ["add", "remove"]}, [ALL_EVENTS[i] for i in (0, 1, 4, 5)]),
        ({"match_types": ["match"]}, [
            ("match", "insert", "x", 1), ("match", "update", "d", 2), ("match", "update", "c", 2),
            ("match", "none", "e", 2)]),
        ({"match_types": ["match", "remove"]}, [
            ALL_EVENTS[0], ("match", "insert", "x", 1), ("match", "update", "d", 2), ("match", "update", "c", 2),
            ALL_EVENTS[4], ("match", "none", "e", 2)]),
        ({"match_types": ["add", "match"]}, [  # the more specific type wins where it is asked for
            ALL_EVENTS[1], ("match", "update", "d", 2), ("match", "update", "c", 2), ALL_EVENTS[5]]),
        ({"operations": ["insert"]}, [ALL_EVENTS[1]]),
        ({"operations": ["update"]}, [ALL_EVENTS[2], ALL_EVENTS[3]]),
        ({"operations": ["delete"]}, [ALL_EVENTS[4]]),
        ({"operations": ["none"]}, [ALL_EVENTS[0], ALL_EVENTS[5]]),
        ({"operations": ["insert", "delete"]}, [ALL_EVENTS[1], ALL_EVENTS[4]]),
    ],
)
def test_filters(filters, expected):
    assert run_scenario(**filters) == expected


def test_sdk_integration_none_operation_matches():
    """streamingquery.spec.js "should return 'none'-operation matches": limit 3, ascending name."""
    al = obj("al", name="Al", age=49)
    query = RealtimeQuery({"age": 49}, {"name": 1}, limit=3, operations="none", documents=[al])
    assert keys(query.result()) == ["al"]
    assert query.apply(None, obj("bob", name="Bob", age=50), "insert") == []
    assert query.apply(None, obj("dave", name="Dave", age=49), "insert") == []
    assert query.apply(None, obj("carl", name="Carl", age=49), "insert") == []
    assert brief(query.apply(None, obj("dan", name="Dan", age=49), "insert")) == [("remove", "none", "dave", None)]


def test_unsorted_match_type_filter():
    query = RealtimeQuery({"age": 49}, match_types="match")
    assert brief(query.apply(None, obj("a", age=49), "insert")) == [("match", "insert", "a", None)]
    assert brief(query.apply(obj("a", age=49), obj("a", 2, age=49), "update")) == [("match", "update", "a", None)]
    assert query.apply(obj("a", 2, age=49), None, "delete") == []


def test_changes_are_the_unfiltered_events():
    query = window_query(match_types=["add"])
    assert brief(query.changes(*insert("x", 35))) == ALL_EVENTS[:2]


# -- property: the live window equals the query run from scratch ---------------------------------

KEYS = [f"k{i}" for i in range(8)]
field_values = st.one_of(st.none(), st.integers(0, 5), st.sampled_from(["x", "y"]))
images = st.fixed_dictionaries(
    {},
    optional={
        "n": field_values,
        "s": st.sampled_from(["a", "b", "c"]),
        "tags": st.lists(st.integers(0, 3), max_size=3),
    },
)
writes = st.lists(st.tuples(st.sampled_from(KEYS), st.one_of(st.none(), images)), max_size=40)
FILTERS = [
    {}, {"n": {"$gte": 2}}, {"$or": [{"s": "a"}, {"tags": 1}]}, {"n": {"$type": "number"}}, {"tags": {"$size": 2}},
]
SORTS = [None, {"n": 1}, {"n": -1, "s": 1}, {"s": 1}, {"tags": -1}, {"tags": 1, "n": -1}]


def reference_value(document: dict, field: str, direction: int) -> tuple:
    """MongoDB's order for the values the strategies make, written independently of sortkey.py."""

    def rank(value: Any) -> tuple:
        if value is None:
            return (1,)
        if isinstance(value, int):
            return (2, value)
        return (3, value)

    value = document.get(field)
    if isinstance(value, list):
        if not value:
            return (0,)
        ranks = [rank(v) for v in value]
        return min(ranks) if direction == 1 else max(ranks)
    return rank(value)


def reference_result(query: RealtimeQuery, spec: dict | None, documents: list[dict]) -> list[dict]:
    matching = [document for document in documents if query.matches(document)]
    if not query.is_sorted:
        return matching
    fields = list((spec or {}).items())

    def compare(left: dict, right: dict) -> int:
        for field, direction in fields:
            a, b = reference_value(left, field, direction), reference_value(right, field, direction)
            if a != b:
                return (1 if a > b else -1) * direction
        return (left["id"] > right["id"]) - (left["id"] < right["id"])

    matching.sort(key=functools.cmp_to_key(compare))
    return matching[query.offset:query.offset + query.limit]


def apply_to_client(window: list[dict], events: list[Event], written: str, operation: str, ordered: bool) -> None:
    """What a client does with the events (the SDK's resultStream), checking each as it goes."""
    for event in events:
        fields = event.fields()
        object_id = event.data["id"]
        ids = [document["id"] for document in window]
        assert event.operation == (operation if object_id == written else "none")
        assert ("index" in fields) == (ordered and event.match_type != "remove")
        if event.match_type == "remove":
            window.pop(ids.index(object_id))
        elif event.match_type == "change":
            position = ids.index(object_id)
            assert not ordered or event.index == position
            window[position] = event.data
        elif event.match_type == "changeIndex":
            window.pop(ids.index(object_id))
            window.insert(event.index, event.data)
        else:
            assert event.match_type == "add" and object_id not in ids
            if ordered:
                assert 0 <= event.index <= len(window)
                window.insert(event.index, event.data)
            else:
                window.append(event.data)


@settings(max_examples=400, deadline=None)
@given(
    before=writes,
    after=writes,
    query_index=st.integers(0, len(FILTERS) - 1),
    sort_index=st.integers(0, len(SORTS) - 1),
    offset=st.integers(0, 3),
    limit=st.one_of(st.none(), st.integers(1, 4)),
    list_max=st.sampled_from([rtquery.LIST_MAX, 4]),
)
def test_window_equals_rerunning_the_query_after_any_writes(before, after, query_index, sort_index, offset, limit,
                                                             list_max):
    # list_max 4: the order moves between a plain list and a SortedList as the matches come and go
    with mock.patch.object(rtquery, "LIST_MAX", list_max):
        check_window_after_writes(before, after, query_index, sort_index, offset, limit)


def check_window_after_writes(before, after, query_index, sort_index, offset, limit):
    store: dict[str, dict] = {}
    version = 0

    def write(key: str, image: dict | None) -> tuple | None:
        nonlocal version
        object_id = f"/db/T/{key}"
        previous = store.get(object_id)
        if image is None:
            if previous is None:
                return None
            del store[object_id]
            return previous, None, "delete"
        version += 1
        store[object_id] = {"id": object_id, "version": version, **image}
        return previous, store[object_id], "update" if previous is not None else "insert"

    for key, image in before:
        write(key, image)
    spec = SORTS[sort_index]
    query = RealtimeQuery(FILTERS[query_index], spec, offset=offset, limit=limit, documents=list(store.values()))
    expected = reference_result(query, spec, list(store.values()))
    if query.is_sorted:
        assert query.result() == expected
    else:
        assert sorted(query.result(), key=lambda d: d["id"]) == sorted(expected, key=lambda d: d["id"])
    client = list(query.result())

    for key, image in after:
        change = write(key, image)
        if change is None:
            continue
        events = query.apply(*change)
        written = (change[1] or change[0])["id"]
        apply_to_client(client, events, written, change[2], query.is_sorted)
        for event in events:
            if event.operation == "delete":
                assert event.data == {k: v for k, v in change[0].items() if k != "version"}
        expected = reference_result(query, spec, list(store.values()))
        if query.is_sorted:
            assert query.result() == expected
            assert client == expected
            assert len(events) <= 2
        else:
            by_id = lambda documents: sorted(documents, key=lambda d: d["id"])  # noqa: E731
            assert by_id(query.result()) == by_id(expected)
            assert by_id(client) == by_id(expected)
            assert len(events) <= 1


def test_queries_of_one_text_share_one_predicate_and_the_shared_ones_are_bounded(monkeypatch):
    import gc
    import math
    import weakref

    from actors.baqend import rtquery

    monkeypatch.setattr(rtquery, "_shared", weakref.WeakValueDictionary())
    monkeypatch.setattr(rtquery, "_SHARED_MAX", 3)
    first = RealtimeQuery({"n": 1, "s": {"$gt": "a"}})
    assert RealtimeQuery('{"n": 1, "s": {"$gt": "a"}}').predicate is first.predicate  # the text sent as JSON
    reordered, floats = RealtimeQuery({"s": {"$gt": "a"}, "n": 1}), RealtimeQuery({"n": 1.0, "s": {"$gt": "a"}})
    assert reordered.predicate is not first.predicate and floats.predicate is not first.predicate  # other texts
    hidden = RealtimeQuery({"n": 1, "s": {"$gt": "a"}}, visible=lambda document: False)
    assert hidden.predicate is not first.predicate and not hidden.predicate(obj("a", n=1, s="b"))
    assert first.predicate(obj("a", n=1, s="b"))
    # at most _SHARED_MAX texts are shared at once: past them a query compiles its own
    assert len(rtquery._shared) == 3
    assert RealtimeQuery({"n": 9}).predicate is not RealtimeQuery({"n": 9}).predicate
    # an entry lives as long as a query holds its predicate
    del first, hidden, reordered, floats
    gc.collect()
    assert len(rtquery._shared) == 0
    again = RealtimeQuery({"n": 9})
    assert RealtimeQuery({"n": 9}).predicate is again.predicate
    # a long text, or a query that is not made of JSON's own values, is compiled for its query
    long = {"s": "x" * 2000}
    assert RealtimeQuery(long).predicate is not RealtimeQuery(long).predicate
    huge = {"n": 2 ** 70}
    assert RealtimeQuery(huge).predicate is not RealtimeQuery(huge).predicate
    assert RealtimeQuery(huge).predicate(obj("a", n=2 ** 70))
    # NaN is written as null: it must not share null's predicate (nor a tuple a list's)
    nan, null = RealtimeQuery({"n": math.nan}), RealtimeQuery({"n": None})
    assert nan.predicate is not null.predicate
    assert null.predicate(obj("a")) and not nan.predicate(obj("a"))
    with pytest.raises(SubscriptionError):
        RealtimeQuery({"$or": ({"a": 1},)})  # a tuple is not an array, shared or not
    RealtimeQuery({"$or": [{"a": 1}]})
    with pytest.raises(SubscriptionError):
        RealtimeQuery({"$or": ({"a": 1},)})


def test_a_long_order_moves_to_a_sorted_list_and_back_with_the_same_window():
    query = RealtimeQuery({}, {"n": -1}, limit=3)
    count = rtquery.LIST_MAX + 500
    for n in range(count):
        events = query.apply(None, obj(f"k{n:05d}", n=n), "insert")
        assert [(e.match_type, e.data["n"], e.index) for e in events][-1] == ("add", n, 0)
    assert type(query._order) is SortedList and len(query) == count
    assert [d["n"] for d in query.result()] == [count - 1, count - 2, count - 3]
    # the top leaves: the fourth enters at the last place
    events = query.apply(obj(f"k{count - 1:05d}", n=count - 1), None, "delete")
    assert [(e.match_type, e.operation, e.data["n"], e.index) for e in events] == [
        ("remove", "delete", count - 1, None), ("add", "none", count - 4, 2)]
    for n in range(count - 2, rtquery.LIST_MAX // 2 - 2, -1):  # below half of LIST_MAX: a plain list again
        query.apply(obj(f"k{n:05d}", n=n), None, "delete")
    assert type(query._order) is list and len(query) == rtquery.LIST_MAX // 2 - 1
    assert [d["n"] for d in query.result()] == [rtquery.LIST_MAX // 2 - 2, rtquery.LIST_MAX // 2 - 3,
                                                rtquery.LIST_MAX // 2 - 4]
    # an update moving an entry from the bottom to the top
    events = query.apply(obj("k00000", n=0), obj("k00000", 2, n=10**6), "update")
    assert [(e.match_type, e.data["id"], e.index) for e in events] == [
        ("remove", f"/db/Todo/k{rtquery.LIST_MAX // 2 - 4:05d}", None), ("add", "/db/Todo/k00000", 0)]


def test_queries_of_one_sort_share_one_key_function():
    first, second = RealtimeQuery({"g": 1}, {"n": -1}, limit=3), RealtimeQuery({"g": 2}, '{"n": -1}', limit=5)
    assert first._key is second._key
    assert RealtimeQuery({"g": 1}, {"n": 1}, limit=3)._key is not first._key
