"""actors/mongoquery.py and actors/sortkey.py: the MongoDB filters and sort order of real-time queries."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from actors.baqend.mongoquery import (
    MISSING,
    QueryError,
    UnsupportedQueryError,
    bson_key,
    bson_type,
    compile_query,
    resolve_path,
)
from actors.baqend.sortkey import _Descending, descending, parse_sort, sort_key


def matches(query: dict, document: dict) -> bool:
    return compile_query(query)(document)


def which(query: dict, documents: list[dict]) -> list[int]:
    """The positions of the documents the query matches."""
    predicate = compile_query(query)
    return [i for i, document in enumerate(documents) if predicate(document)]


# -- equality ----------------------------------------------------------------------------------

VALUES = [
    {"a": 1},  # 0
    {"a": 1.0},  # 1
    {"a": "1"},  # 2
    {"a": True},  # 3
    {"a": None},  # 4
    {},  # 5
    {"a": [1, 2]},  # 6
    {"a": [[1, 2], 3]},  # 7
    {"a": {"b": 1}},  # 8
    {"a": [{"b": 1}]},  # 9
]


def test_empty_query_matches_everything():
    assert which({}, VALUES) == list(range(len(VALUES)))


def test_number_equality_ignores_int_and_float_but_not_strings_or_booleans():
    assert which({"a": 1}, VALUES) == [0, 1, 6]
    assert which({"a": 1.0}, VALUES) == [0, 1, 6]
    assert which({"a": {"$eq": 1}}, VALUES) == [0, 1, 6]
    assert which({"a": True}, VALUES) == [3]
    assert which({"a": "1"}, VALUES) == [2]


def test_null_matches_null_and_missing():
    assert which({"a": None}, VALUES) == [4, 5]
    assert which({"a": {"$eq": None}}, VALUES) == [4, 5]
    assert matches({"a": None}, {"a": [1, None]})
    assert not matches({"a": None}, {"a": []})


def test_array_field_matches_an_element_or_the_whole_array():
    assert which({"a": 2}, VALUES) == [6]
    assert which({"a": [1, 2]}, VALUES) == [6, 7]  # whole array; element of the nested array
    assert which({"a": [2, 1]}, VALUES) == []  # order matters
    assert which({"a": 3}, VALUES) == [7]
    assert which({"a": [[1, 2], 3]}, VALUES) == [7]


def test_subdocument_equality_is_exact_and_field_order_sensitive():
    assert which({"a": {"b": 1}}, VALUES) == [8, 9]
    assert matches({"a": {"b": 1.0}}, {"a": {"b": 1}})
    assert not matches({"a": {"b": 1}}, {"a": {"b": 1, "c": 2}})
    assert not matches({"a": {"b": 1, "c": 2}}, {"a": {"c": 2, "b": 1}})
    assert matches({"a": {}}, {"a": {}})
    assert not matches({"a": {}}, {"a": {"b": 1}})


def test_several_fields_must_all_match():
    document = {"name": "Al", "age": 49}
    assert matches({"name": "Al", "age": 49}, document)
    assert not matches({"name": "Al", "age": 50}, document)


# -- comparison and type bracketing ------------------------------------------------------------

MIXED = [
    {"v": 5},  # 0
    {"v": 10.5},  # 1
    {"v": "5"},  # 2
    {"v": "abc"},  # 3
    {"v": None},  # 4
    {},  # 5
    {"v": [1, 20]},  # 6
    {"v": True},  # 7
    {"v": {"x": 1}},  # 8
    {"v": "2017-08-17T05:02:45.54Z"},  # 9: a date
]


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ({"v": {"$gt": 5}}, [1, 6]),
        ({"v": {"$gte": 5}}, [0, 1, 6]),
        ({"v": {"$lt": 5}}, [6]),
        ({"v": {"$lte": 5.0}}, [0, 6]),
        ({"v": {"$gt": 5, "$lt": 11}}, [1, 6]),  # 6: 20 > 5 and 1 < 11 — different elements may satisfy each
        ({"v": {"$gt": "4"}}, [2, 3]),  # strings only; a date string is not a string
        ({"v": {"$lt": "b"}}, [2, 3]),
        ({"v": {"$gte": None}}, [4, 5]),
        ({"v": {"$lte": None}}, [4, 5]),
        ({"v": {"$gt": None}}, []),
        ({"v": {"$lt": None}}, []),
        ({"v": {"$gt": False}}, [7]),
        ({"v": {"$gte": {"x": 0}}}, [8]),
        ({"v": {"$gt": [1, 5]}}, [6]),  # whole-array comparison, element by element
        ({"v": {"$gt": {"$date": "2017-01-01T00:00:00Z"}}}, [9]),
        ({"v": {"$lt": {"$date": "2017-01-01T00:00:00Z"}}}, []),
    ],
)
def test_comparisons_only_within_one_type_class(query, expected):
    assert which(query, MIXED) == expected


def test_comparison_against_array_elements():
    assert matches({"a": {"$gt": 15}}, {"a": [1, 20]})
    assert not matches({"a": {"$gt": 25}}, {"a": [1, 20]})
    assert not matches({"a": {"$gt": 1}}, {"a": [[5]]})  # nested arrays are not searched


def test_string_order_is_by_code_point():
    assert matches({"s": {"$gt": "Z"}}, {"s": "a"})
    assert matches({"s": {"$gt": "z"}}, {"s": "é"})
    assert not matches({"s": {"$gt": "abc"}}, {"s": "ab"})


def test_ne_and_nin_match_missing_fields_and_negate_array_matches():
    assert which({"v": {"$ne": 5}}, MIXED) == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert which({"v": {"$ne": None}}, MIXED) == [0, 1, 2, 3, 6, 7, 8, 9]
    assert not matches({"a": {"$ne": 2}}, {"a": [1, 2]})
    assert matches({"a": {"$ne": 3}}, {"a": [1, 2]})
    assert which({"v": {"$nin": [5, "abc", None]}}, MIXED) == [1, 2, 6, 7, 8, 9]


# -- $in / $nin ---------------------------------------------------------------------------------


def test_in_matches_any_listed_value_with_array_semantics():
    assert which({"v": {"$in": [5, "abc"]}}, MIXED) == [0, 3]
    assert which({"v": {"$in": [20]}}, MIXED) == [6]
    assert which({"v": {"$in": [None]}}, MIXED) == [4, 5]
    assert which({"v": {"$in": [[1, 20]]}}, MIXED) == [6]
    assert which({"v": {"$in": []}}, MIXED) == []
    assert which({"v": {"$nin": []}}, MIXED) == list(range(len(MIXED)))
    assert matches({"v": {"$in": [1.0, True]}}, {"v": 1})
    assert not matches({"v": {"$in": [True]}}, {"v": 1})


def test_in_accepts_regular_expressions_and_dates():
    assert which({"v": {"$in": [{"$regex": "^a"}, 5]}}, MIXED) == [0, 3]
    assert matches({"v": {"$in": [{"$regex": "^A", "$options": "i"}]}}, {"v": ["x", "abc"]})
    assert matches({"d": {"$in": [{"$date": "2020-01-01T00:00:00.000Z"}]}}, {"d": "2020-01-01T00:00:00Z"})


# -- element operators -------------------------------------------------------------------------


def test_exists():
    assert which({"v": {"$exists": True}}, MIXED) == [0, 1, 2, 3, 4, 6, 7, 8, 9]
    assert which({"v": {"$exists": False}}, MIXED) == [5]
    assert which({"v": {"$exists": 1}}, MIXED) == which({"v": {"$exists": True}}, MIXED)
    assert matches({"a.b": {"$exists": True}}, {"a": [{"c": 1}, {"b": None}]})
    assert matches({"a.b": {"$exists": False}}, {"a": [{"c": 1}, 5]})
    assert matches({"a.0": {"$exists": False}}, {"a": []})


@pytest.mark.parametrize(
    ("type_", "expected"),
    [
        ("int", [0, 6]),  # 6: an element is an int
        (16, [0, 6]),
        ("double", [1]),
        (1, [1]),
        ("number", [0, 1, 6]),
        ("string", [2, 3]),
        ("null", [4]),
        (10, [4]),
        ("array", [6]),
        ("bool", [7]),
        ("object", [8]),
        ("date", [9]),
        (["string", "bool"], [2, 3, 7]),
        ("objectId", []),
    ],
)
def test_type(type_, expected):
    assert which({"v": {"$type": type_}}, MIXED) == expected


def test_type_of_large_integers_is_long():
    assert matches({"v": {"$type": "long"}}, {"v": 2**40})
    assert not matches({"v": {"$type": "int"}}, {"v": 2**40})
    assert matches({"v": {"$type": "date"}}, {"v": {"$date": "2017-08-17T05:02:45.540Z"}})


# -- $regex ------------------------------------------------------------------------------------


def test_regex_searches_strings_with_anchors_and_options():
    names = [{"name": "My Todo 1"}, {"name": "my todo"}, {"name": "Your Todo"}, {"name": 5}, {"name": ["x", "My"]}]
    assert which({"name": {"$regex": "^My Todo"}}, names) == [0]
    assert which({"name": {"$regex": "^my", "$options": "i"}}, names) == [0, 1, 4]
    assert which({"name": {"$regex": "Todo$"}}, names) == [2]
    assert which({"name": {"$regex": "odo"}}, names) == [0, 1, 2]
    assert which({"name": {"$not": {"$regex": "^My"}}}, names) == [1, 2, 3]


def test_regex_multiline_and_dotall_options():
    text = {"t": "first\nsecond"}
    assert not matches({"t": {"$regex": "^second"}}, text)
    assert matches({"t": {"$regex": "^second", "$options": "m"}}, text)
    assert not matches({"t": {"$regex": "first.second"}}, text)
    assert matches({"t": {"$regex": "first.second", "$options": "s"}}, text)


def test_regex_is_bounded_and_linear_time():
    with pytest.raises(QueryError, match="513 characters; the limit is 512"):
        compile_query({"a": {"$regex": "a" * 513}})
    with pytest.raises(QueryError, match="invalid \\$regex"):
        compile_query({"a": {"$regex": "(?=lookahead)"}})  # not expressible in linear time
    with pytest.raises(QueryError, match="invalid \\$regex"):
        compile_query({"a": {"$regex": "("}})
    assert matches({"a": {"$regex": "(a+)+$"}}, {"a": "a" * 5000 + "!"}) is False


# -- arrays ------------------------------------------------------------------------------------


def test_size():
    docs = [{"a": []}, {"a": [1, 2]}, {"a": [[1, 2]]}, {"a": "ab"}, {}]
    assert which({"a": {"$size": 0}}, docs) == [0]
    assert which({"a": {"$size": 2}}, docs) == [1]
    assert which({"a": {"$size": 1}}, docs) == [2]
    assert which({"a": {"$size": 2.0}}, docs) == [1]
    assert which({"a": {"$not": {"$size": 2}}}, docs) == [0, 2, 3, 4]


def test_all():
    docs = [{"a": [1, 2, 3]}, {"a": [1]}, {"a": 1}, {"a": [[1, 2]]}, {}]
    assert which({"a": {"$all": [1, 2]}}, docs) == [0]
    assert which({"a": {"$all": [1]}}, docs) == [0, 1, 2]
    assert which({"a": {"$all": [[1, 2]]}}, docs) == [3]
    assert which({"a": {"$all": []}}, docs) == []
    people = [{"p": [{"n": "a", "age": 3}, {"n": "b", "age": 9}]}, {"p": [{"n": "a", "age": 9}]}]
    query = {"p": {"$all": [{"$elemMatch": {"n": "a"}}, {"$elemMatch": {"age": {"$gt": 5}}}]}}
    assert which(query, people) == [0, 1]


def test_elem_match_on_values_needs_one_element_to_satisfy_every_condition():
    docs = [{"s": [82, 90]}, {"s": [70, 90]}, {"s": 82}, {"s": [[82]]}]
    assert which({"s": {"$elemMatch": {"$gte": 80, "$lt": 85}}}, docs) == [0]
    assert which({"s": {"$gte": 80, "$lt": 85}}, docs) == [0, 1, 2]  # without it, any elements


def test_elem_match_on_subdocuments():
    docs = [
        {"r": [{"p": "x", "q": 10}, {"p": "y", "q": 1}]},
        {"r": [{"p": "x", "q": 1}, {"p": "y", "q": 10}]},
        {"r": {"p": "x", "q": 10}},
    ]
    assert which({"r": {"$elemMatch": {"p": "x", "q": {"$gt": 5}}}}, docs) == [0]
    assert which({"r.p": "x", "r.q": {"$gt": 5}}, docs) == [0, 1, 2]
    assert which({"r": {"$elemMatch": {"$or": [{"q": 10}, {"p": "z"}]}}}, docs) == [0, 1]


# -- logical -----------------------------------------------------------------------------------

PEOPLE = [
    {"name": "Al", "age": 49, "active": True},  # 0
    {"name": "Bob", "age": 50},  # 1
    {"name": "Carl", "age": 20, "active": False},  # 2
]


def test_and_or_nor():
    assert which({"$and": [{"age": {"$gt": 30}}, {"active": True}]}, PEOPLE) == [0]
    assert which({"$or": [{"name": "Bob"}, {"active": False}]}, PEOPLE) == [1, 2]
    assert which({"$nor": [{"name": "Bob"}, {"active": False}]}, PEOPLE) == [0]
    assert which({"$or": [{"age": 20}], "name": "Carl"}, PEOPLE) == [2]


def test_not_negates_including_missing_fields():
    assert which({"age": {"$not": {"$gt": 30}}}, PEOPLE) == [2]
    assert which({"active": {"$not": {"$eq": True}}}, PEOPLE) == [1, 2]


def test_mod():
    docs = [{"n": 4}, {"n": 5}, {"n": -5}, {"n": 5.9}, {"n": "5"}]
    assert which({"n": {"$mod": [2, 1]}}, docs) == [1, 3]
    assert which({"n": {"$mod": [2, -1]}}, docs) == [2]
    assert which({"n": {"$mod": [2, 0]}}, docs) == [0]


# -- dotted paths ------------------------------------------------------------------------------


def test_paths_descend_into_subdocuments_and_index_arrays():
    document = {"a": {"b": {"c": 7}}, "items": [{"name": "x", "tags": ["t1"]}, {"name": "y"}], "m": [[1, 2], [3]]}
    assert matches({"a.b.c": 7}, document)
    assert matches({"a.b": {"c": 7}}, document)
    assert not matches({"a.c": 7}, document)
    assert matches({"items.0.name": "x"}, document)
    assert matches({"items.1.name": "y"}, document)
    assert not matches({"items.1.name": "x"}, document)
    assert matches({"items.name": "y"}, document)
    assert matches({"items.tags": "t1"}, document)
    assert matches({"items.tags": None}, document)  # the second item lacks tags
    assert matches({"m.1": [3]}, document)
    assert matches({"m.0.1": 2}, document)
    assert matches({"items.5.name": None}, document)
    assert not matches({"items.5.name": {"$exists": True}}, document)


def test_paths_do_not_search_arrays_of_arrays():
    assert not matches({"a.b": 1}, {"a": [[{"b": 1}]]})
    assert matches({"a.0.0.b": 1}, {"a": [[{"b": 1}]]})


def test_numeric_path_part_also_names_a_field_of_subdocuments():
    assert matches({"a.0": 5}, {"a": [{"0": 5}]})
    assert matches({"a.0": 5}, {"a": {"0": 5}})


def test_resolve_path_reports_missing():
    assert resolve_path({"a": 1}, ("b",)) == [MISSING]
    assert resolve_path({"a": [{"b": 1}, {"c": 2}, 3]}, ("a", "b")) == [1, MISSING]
    assert resolve_path({"a": []}, ("a", "b")) == [MISSING]
    assert resolve_path({"a": 1}, ("a", "b")) == [MISSING]


# -- dates -------------------------------------------------------------------------------------

DATES = [
    {"d": "2017-08-17T05:02:45.54Z"},  # 0: REST form, two fraction digits
    {"d": "2017-08-17T05:02:45.540Z"},  # 1: the same instant, as JavaScript writes it
    {"d": "2017-08-17T07:02:45.540+02:00"},  # 2: the same instant, another zone
    {"d": {"$date": "2017-08-17T05:02:45.540Z"}},  # 3: extended JSON
    {"d": "2018-01-01T00:00:00Z"},  # 4
    {"d": "2017-08-17"},  # 5: no time: a string, not a date
    {"d": 1502946165540},  # 6: a number, not a date
]


def test_dates_compare_as_instants_across_representations():
    instant = {"$date": "2017-08-17T05:02:45.540Z"}
    assert which({"d": instant}, DATES) == [0, 1, 2, 3]
    assert which({"d": {"$date": 1502946165540}}, DATES) == [0, 1, 2, 3]
    assert which({"d": {"$date": {"$numberLong": "1502946165540"}}}, DATES) == [0, 1, 2, 3]
    assert which({"d": {"$gt": instant}}, DATES) == [4]
    assert which({"d": {"$gte": {"$date": "2017-08-17"}}}, DATES) == [0, 1, 2, 3, 4]
    assert which({"d": {"$lt": {"$date": "2017-08-17T05:02:45.541Z"}}}, DATES) == [0, 1, 2, 3]
    assert which({"d": {"$type": "date"}}, DATES) == [0, 1, 2, 3, 4]


def test_dates_never_equal_strings_or_numbers():
    assert which({"d": "2017-08-17"}, DATES) == [5]
    assert which({"d": {"$gt": "2000"}}, DATES) == [5]
    assert which({"d": {"$gt": 0}}, DATES) == [6]
    assert which({"d": {"$regex": "^2017-08-17T05"}}, DATES) == [0, 1]  # a regex reads the raw text


def test_bson_key_of_dates():
    assert bson_key("2017-08-17T05:02:45.54Z") == bson_key({"$date": "2017-08-17T05:02:45.540Z"})
    assert bson_type("2017-08-17T05:02:45Z") == "date"
    assert bson_type("2017-13-17T05:02:45Z") == "string"  # not a valid date
    assert bson_type({"$date": "garbage"}) == "object"


# -- invalid queries ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ([], "a query must be a JSON object, not an array"),
        ("name", "a query must be a JSON object, not a string"),
        ({"$foo": 1}, "unknown top-level operator: \\$foo"),
        ({"a": {"$foo": 1}}, "unknown operator: \\$foo"),
        ({"a": {"$gt": 1, "b": 2}}, "mixes operators and field names"),
        ({"a": {"$regex": 5}}, "\\$regex needs a string"),
        ({"a": {"$regex": "x", "$options": 1}}, "\\$options needs a string"),
        ({"a": {"$regex": "x", "$options": "q"}}, "unknown \\$options flag\\(s\\): q"),
        ({"a": {"$options": "i"}}, "\\$options needs a \\$regex"),
        ({"a": {"$size": "2"}}, "\\$size needs a non-negative integer"),
        ({"a": {"$size": 1.5}}, "\\$size needs a non-negative integer"),
        ({"a": {"$size": -1}}, "\\$size needs a non-negative integer"),
        ({"a": {"$size": True}}, "\\$size needs a non-negative integer"),
        ({"a": {"$in": 1}}, "\\$in needs an array"),
        ({"a": {"$nin": "x"}}, "\\$nin needs an array"),
        ({"a": {"$in": [{"$gt": 1}]}}, "\\$in takes values, not operators"),
        ({"a": {"$all": 1}}, "\\$all needs an array"),
        ({"a": {"$all": [{"$gt": 1}]}}, "\\$all takes values"),
        ({"a": {"$elemMatch": 1}}, "\\$elemMatch needs an object"),
        ({"a": {"$elemMatch": {"$gt": 1, "b": 1}}}, "\\$elemMatch takes either operators"),
        ({"a": {"$not": 1}}, "\\$not needs an operator document"),
        ({"a": {"$not": {}}}, "\\$not needs a non-empty operator document"),
        ({"a": {"$not": {"b": 1}}}, "\\$not needs an operator document"),
        ({"a": {"$exists": "yes"}}, "\\$exists needs true or false"),
        ({"a": {"$type": "banana"}}, "unknown \\$type: 'banana'"),
        ({"a": {"$type": []}}, "\\$type needs a type name"),
        ({"a": {"$mod": [0, 1]}}, "divisor other than 0"),
        ({"a": {"$mod": [2]}}, "\\$mod needs an array \\[divisor, remainder\\]"),
        ({"$and": []}, "\\$and needs a non-empty array"),
        ({"$or": {"a": 1}}, "\\$or needs a non-empty array"),
        ({"$nor": [1]}, "a query must be a JSON object, not a number"),
        ({"a": {"$or": [{"b": 1}]}}, "\\$or belongs at the top level"),
        ({"a..b": 1}, "invalid field path 'a..b'"),
        ({"a": {"$gt": {"$date": "yesterday"}}}, "invalid \\$date in \\$gt"),
        ({"a": {"$eq": {"$date": None}}}, "invalid \\$date"),
    ],
)
def test_invalid_queries_raise_query_error(query, message):
    with pytest.raises(QueryError, match=message):
        compile_query(query)


@pytest.mark.parametrize(
    "query",
    [
        {"$where": "this.a > 1"},
        {"$text": {"$search": "x"}},
        {"$expr": {"$gt": ["$a", 1]}},
        {"loc": {"$nearSphere": [0, 0]}},
        {"loc": {"$geoWithin": {"$box": [[0, 0], [1, 1]]}}},
        {"a": {"$regex": "x", "$options": "x"}},
    ],
)
def test_unsupported_features_say_so(query):
    with pytest.raises(UnsupportedQueryError, match="not supported"):
        compile_query(query)


def test_nesting_is_bounded():
    query: dict = {"a": 1}
    for _ in range(40):
        query = {"$and": [query]}
    with pytest.raises(QueryError, match="nested more than 32 levels"):
        compile_query(query)


def test_comment_is_ignored():
    assert matches({"$comment": "why", "a": 1}, {"a": 1})


# -- sort order --------------------------------------------------------------------------------


def ordered(spec, documents):
    return [document["id"] for document in sorted(documents, key=sort_key(parse_sort(spec)))]


def test_sort_follows_bson_type_order_with_missing_first():
    documents = [
        {"id": "date", "v": "2017-08-17T05:02:45Z"},
        {"id": "bool", "v": False},
        {"id": "array", "v": []},
        {"id": "object", "v": {"a": 1}},
        {"id": "string", "v": "a"},
        {"id": "float", "v": 1.5},
        {"id": "int", "v": 1},
        {"id": "null", "v": None},
        {"id": "missing"},
    ]
    assert ordered({"v": 1}, documents) == [
        "array", "missing", "null", "int", "float", "string", "object", "bool", "date",
    ]
    assert ordered({"v": -1}, documents) == [
        "date", "bool", "object", "string", "float", "int", "missing", "null", "array",
    ]


def test_sort_ties_break_by_ascending_id_in_both_directions():
    documents = [{"id": "c", "v": 1}, {"id": "a", "v": 1}, {"id": "b", "v": 0}]
    assert ordered({"v": 1}, documents) == ["b", "a", "c"]
    assert ordered({"v": -1}, documents) == ["a", "c", "b"]
    assert ordered(None, documents) == ["a", "b", "c"]


def test_sort_by_several_fields_with_mixed_directions():
    documents = [
        {"id": "1", "deadline": 2, "name": "x", "active": True},
        {"id": "2", "deadline": 1, "name": "y", "active": False},
        {"id": "3", "deadline": 1, "name": "y", "active": True},
        {"id": "4", "deadline": 1, "name": "a", "active": False},
    ]
    spec = {"deadline": 1, "name": 1, "active": -1}
    assert ordered(spec, documents) == ["4", "3", "2", "1"]
    assert ordered([("name", -1), ("deadline", 1)], documents) == ["2", "3", "1", "4"]


def test_arrays_sort_by_smallest_element_ascending_and_largest_descending():
    documents = [{"id": "a", "v": [1, 9]}, {"id": "b", "v": [5]}, {"id": "c", "v": 3}]
    assert ordered({"v": 1}, documents) == ["a", "c", "b"]
    assert ordered({"v": -1}, documents) == ["a", "b", "c"]


def test_sort_on_dotted_paths_and_dates():
    documents = [
        {"id": "a", "meta": {"at": "2017-08-17T05:02:45.54Z"}},  # .540
        {"id": "b", "meta": {"at": "2017-08-17T05:02:45.5Z"}},  # .500: earlier, though it sorts later as text
        {"id": "c", "meta": {"at": {"$date": "2017-08-17T05:02:46Z"}}},
    ]
    assert ordered({"meta.at": 1}, documents) == ["b", "a", "c"]


# Values of every BSON class a JSON document holds, with the cases an inverted key could get wrong:
# a string and its prefixes, NUL, characters of 1 to 4 UTF-8 bytes, a lone surrogate, dates as
# text and as {"$date"}, -0.0, large integers, booleans, nested objects and arrays.
_JSON_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False), st.sampled_from([0, -0.0, 1, 1.0, 2**53 + 1]),
    st.text(alphabet=st.sampled_from(["a", "b", "\x00", "\x7f", "\xe9", "\u20ac", "\ud800", "\U0001f600"]),
            max_size=4),
    st.sampled_from(["2017-08-17T05:02:45Z", "2017-08-17T05:02:45.5Z", "2017-08-17T07:02:45+02:00",
                     {"$date": "2017-08-17T05:02:46Z"}, {"$date": 1502946165000}]),
)
_JSON_VALUES = st.recursive(_JSON_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(["a", "b"]), inner, max_size=2)), max_leaves=6)


@given(_JSON_VALUES, _JSON_VALUES)
@example("a", "a\x00")
@example("ab", "a")
@example("\U0001f600", "\ud800")
@settings(max_examples=2000, deadline=None)
def test_a_descending_key_inverts_the_bson_order_exactly(a, b):
    """Before: every descending key was a _Descending object, compared in Python on each step of a
    sorted window's search (half of a query shard's time matching writes to sorted queries)."""
    ka, kb = bson_key(a), bson_key(b)
    da, db = descending(ka), descending(kb)
    assert (da < db) == (kb < ka) and (da == db) == (ka == kb) and (db < da) == (ka < kb), (ka, kb, da, db)


def test_descending_keys_of_scalars_are_built_in_values():
    for value in (None, True, 3, 2.5, "text", "2017-08-17T05:02:45Z", []):
        key = descending(bson_key(value)) if value != [] else descending((0, 0))
        assert not any(isinstance(part, _Descending) for part in key), key
    assert isinstance(descending(bson_key({"a": 1}))[1], _Descending)
    assert isinstance(descending(bson_key([1, 2]))[1], _Descending)


def test_sort_keys_survive_pickling():
    key = sort_key(parse_sort({"v": -1}))({"id": "x", "v": 3})
    assert pickle.loads(pickle.dumps(key)) == key


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"v": 2}, "direction of 'v' must be 1 or -1"),
        ({"v": "asc"}, "direction of 'v' must be 1 or -1"),
        ({"v": True}, "direction of 'v' must be 1 or -1"),
        ([("v", 1), ("v", -1)], "'v' appears twice"),
        ({"$natural": 1}, "cannot sort by '\\$natural'"),
        ({"": 1}, "invalid field path"),
        ("name", "a sort must be an object"),
    ],
)
def test_invalid_sorts(spec, message):
    with pytest.raises(QueryError, match=message):
        parse_sort(spec)


# -- properties ----------------------------------------------------------------------------------

scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from([0.5, 2.0]), st.sampled_from("ab"))
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from("ab"), inner, max_size=2),
    max_leaves=6,
)
documents = st.dictionaries(st.sampled_from(["a", "b"]), values, max_size=2)
conditions = st.one_of(
    values.map(lambda v: {"$eq": v}),
    st.tuples(st.sampled_from(["$gt", "$gte", "$lt", "$lte"]), scalars).map(lambda p: {p[0]: p[1]}),
    st.lists(scalars, max_size=3).map(lambda vs: {"$in": vs}),
    st.booleans().map(lambda b: {"$exists": b}),
    st.integers(0, 2).map(lambda n: {"$size": n}),
)
field_queries = st.tuples(st.sampled_from(["a", "b", "a.a", "a.0"]), conditions).map(lambda p: {p[0]: p[1]})


@settings(max_examples=300, deadline=None)
@given(field_queries, documents)
def test_negations_are_exact_complements(query, document):
    ((path, condition),) = query.items()
    positive = matches(query, document)
    assert matches({"$nor": [query]}, document) is not positive
    assert matches({path: {"$not": condition}}, document) is not positive
    if "$eq" in condition:
        assert matches({path: {"$ne": condition["$eq"]}}, document) is not positive
    if "$in" in condition:
        assert matches({path: {"$nin": condition["$in"]}}, document) is not positive


@settings(max_examples=300, deadline=None)
@given(values, values)
def test_bson_key_is_a_consistent_total_order(left, right):
    a, b = bson_key(left), bson_key(right)
    assert (a < b) + (a == b) + (a > b) == 1
    assert (a == b) == matches({"v": {"$eq": right}}, {"v": left}) or isinstance(left, list)
