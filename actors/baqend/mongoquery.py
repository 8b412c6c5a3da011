"""MongoDB filter documents as predicates over JSON documents (baqend-realtime-queries.md).

A real-time query is matched against every write to its bucket, so a filter is compiled once, at
subscription, into a predicate: operators, operand types and regular expressions are checked then,
and an invalid query raises one :class:`QueryError` naming the problem. Pure: no I/O, no Ray.

Semantics are MongoDB's for JSON values:

- comparisons happen only within one BSON type class (numbers, int and float together; strings;
  objects; arrays; booleans; dates; null), ordered by :func:`bson_key`, which sorting shares;
- a field holding an array matches when the array itself or any element does, so ``{"tags": "a"}``
  finds ``["a", "b"]`` and ``{"tags": ["a", "b"]}`` finds the whole array;
- dotted paths descend into subdocuments, index arrays (``"items.0.name"``) and fan out over
  arrays of subdocuments (``"items.name"``); a path that leads nowhere is *missing*, which only
  ``null``, ``$exists: false`` and the negations match;
- dates: a value is a date when it is ``{"$date": <ISO-8601 or epoch ms>}`` (what the SDK sends
  in queries) or a string in ISO-8601 date-time form with a zone, such as ``createdAt``
  ``"2017-08-17T05:02:45.54Z"`` (how the REST API stores and returns dates). Dates compare as
  instants with each other and with nothing else;
- ``$regex`` runs on RE2 (linear time, bounded length and memory): patterns come from clients.
"""

from __future__ import annotations

import math
import operator
import re
from datetime import datetime, timedelta, timezone
from functools import lru_cache
from typing import Any, Callable, Mapping

from router.patterns import PatternError, compile_pattern

MAX_REGEX_LENGTH = 512  # characters of one $regex pattern
MAX_DEPTH = 32  # nesting of $and/$or/$not/$elemMatch: a query is untrusted input

Predicate = Callable[[Any], bool]  # document -> matches
_Test = Callable[[list], bool]  # values found at a path -> matches


class QueryError(ValueError):
    """The filter is not a valid query: unknown operator, operand of the wrong type, bad pattern."""


class UnsupportedQueryError(QueryError):
    """A valid MongoDB query that this matcher does not evaluate ($where, geo, text search, ...)."""


class _Missing:
    """The value at a path that leads nowhere (distinct from an explicit null)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"

    def __reduce__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()

# Canonical BSON type order; the first element of every key from bson_key.
NULL, NUMBER, STRING, OBJECT, ARRAY, BOOL, DATE = 1, 2, 3, 4, 5, 6, 7
_NULL_KEY = (NULL, 0)

# -- dates -------------------------------------------------------------------------------------

_ISO_DATETIME = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})(?:T(\d{2}):(\d{2})(?::(\d{2})(?:\.(\d{1,9}))?)?)?(Z|[+-]\d{2}:\d{2})?"
)
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


@lru_cache(maxsize=16384)
def _parse_iso(text: str, stored: bool) -> datetime | None:
    """An aware datetime, or None. A stored string must carry time and zone to count as a date."""
    match = _ISO_DATETIME.fullmatch(text)
    if match is None:
        return None
    year, month, day, hour, minute, second, fraction, zone = match.groups()
    if stored and (hour is None or zone is None):
        return None
    try:
        if zone is None or zone == "Z":
            tz = timezone.utc
        else:
            offset = timedelta(hours=int(zone[1:3]), minutes=int(zone[4:6]))
            tz = timezone(-offset if zone[0] == "-" else offset)
        micros = int((fraction or "0")[:6].ljust(6, "0"))
        return datetime(int(year), int(month), int(day), int(hour or 0), int(minute or 0), int(second or 0),
                        micros, tzinfo=tz)
    except ValueError:
        return None


def _string_date(text: str) -> datetime | None:
    # Cheap shape test first: most strings are not dates and must not pay for the regex.
    if not 17 <= len(text) <= 40 or text[10] != "T" or text[4] != "-":
        return None
    return _parse_iso(text, True)


def parse_date(value: Any) -> datetime | None:
    """The instant of a ``$date`` operand: ISO-8601 (zone optional: UTC), epoch ms, or ``$numberLong``."""
    if isinstance(value, dict) and len(value) == 1 and isinstance(value.get("$numberLong"), str):
        try:
            value = int(value["$numberLong"])
        except ValueError:
            return None
    if isinstance(value, str):
        return _parse_iso(value, False)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return EPOCH + timedelta(milliseconds=value)
        except (OverflowError, ValueError):
            return None
    return None


def _dict_date(value: dict) -> datetime | None:
    if len(value) == 1 and "$date" in value:
        return parse_date(value["$date"])
    return None


# -- BSON order and types ----------------------------------------------------------------------


def bson_key(value: Any) -> tuple:
    """A key that orders JSON values as MongoDB orders BSON: type class first, then value.

    Equal keys mean equal values for MongoDB (``1 == 1.0``; objects compare field by field, in
    order; a missing value is null). Keys are hashable, so ``$in`` can use a set.
    """
    if value is None or value is MISSING:
        return _NULL_KEY
    kind = type(value)
    if kind is bool:
        return (BOOL, value)
    if kind is int or kind is float:
        return (NUMBER, value)
    if kind is str:
        date = _string_date(value)
        return (STRING, value) if date is None else (DATE, date)
    if isinstance(value, dict):
        date = _dict_date(value)
        if date is not None:
            return (DATE, date)
        fields = []
        for name, item in value.items():
            rank, norm = bson_key(item)
            fields.append((rank, name, norm))
        return (OBJECT, tuple(fields))
    if isinstance(value, (list, tuple)):
        return (ARRAY, tuple(bson_key(item) for item in value))
    # Subclasses (an IntEnum, a str subclass) after the exact types of decoded JSON above.
    if isinstance(value, bool):
        return (BOOL, bool(value))
    if isinstance(value, (int, float)):
        return (NUMBER, value)
    if isinstance(value, str):
        return bson_key(str(value))
    if isinstance(value, datetime):
        return (DATE, value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc))
    raise TypeError(f"not a JSON value: {type(value).__name__}")


# $type codes (MongoDB's numbers and aliases); JSON holds only some of them, the rest never match.
_TYPE_CODES = {
    "double": 1, "string": 2, "object": 3, "array": 4, "binData": 5, "undefined": 6, "objectId": 7,
    "bool": 8, "date": 9, "null": 10, "regex": 11, "dbPointer": 12, "javascript": 13, "symbol": 14,
    "javascriptWithScope": 15, "int": 16, "timestamp": 17, "long": 18, "decimal": 19,
    "minKey": -1, "maxKey": 127,
}
_NUMBER_CODES = frozenset({1, 16, 18, 19})
_INT32 = range(-(2**31), 2**31)


def bson_type(value: Any) -> str | None:
    """The BSON type name a JSON value is stored as (None when missing)."""
    if value is MISSING:
        return None
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int" if value in _INT32 else "long"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "string" if _string_date(value) is None else "date"
    if isinstance(value, dict):
        return "object" if _dict_date(value) is None else "date"
    if isinstance(value, (list, tuple)):
        return "array"
    return None


# -- paths -------------------------------------------------------------------------------------


def split_path(path: Any) -> tuple[str, ...]:
    if not isinstance(path, str) or not path or any(not part for part in path.split(".")):
        raise QueryError(f"invalid field path {path!r}: use names separated by single dots")
    return tuple(path.split("."))


def resolve_path(document: Any, parts: tuple[str, ...]) -> list:
    """Every value a dotted path reaches (MISSING where it reaches nothing); never empty."""
    if len(parts) == 1 and isinstance(document, dict):
        return [document.get(parts[0], MISSING)]
    found: list = []
    _resolve(document, parts, 0, found)
    return found


def _resolve(value: Any, parts: tuple[str, ...], i: int, found: list) -> None:
    if i == len(parts):
        found.append(value)
        return
    part = parts[i]
    if isinstance(value, dict):
        child = value.get(part, MISSING)
        if child is MISSING:
            found.append(MISSING)
        else:
            _resolve(child, parts, i + 1, found)
    elif isinstance(value, list):
        before = len(found)
        numeric = part.isascii() and part.isdigit()
        if numeric and int(part) < len(value):
            _resolve(value[int(part)], parts, i + 1, found)
        for element in value:
            # A name applies to every subdocument of the array (each one lacking it adds a
            # MISSING, as in MongoDB); a number indexes the array, or names a field "0".
            if isinstance(element, dict) and (not numeric or part in element):
                _resolve(element, parts, i, found)
        if len(found) == before:
            found.append(MISSING)
    else:
        found.append(MISSING)


# -- compilation -------------------------------------------------------------------------------

_LOGICAL = frozenset({"$and", "$or", "$nor"})
_UNSUPPORTED_TOP = frozenset({"$where", "$expr", "$text", "$jsonSchema", "$sampleRate"})
_UNSUPPORTED_FIELD = frozenset({
    "$near", "$nearSphere", "$geoWithin", "$geoIntersects", "$within", "$box", "$center",
    "$centerSphere", "$polygon", "$geometry", "$maxDistance", "$minDistance",
    "$bitsAllSet", "$bitsAnySet", "$bitsAllClear", "$bitsAnyClear",
})
_COMPARISONS = {"$gt": operator.gt, "$gte": operator.ge, "$lt": operator.lt, "$lte": operator.le}


def compile_query(query: Any, *, max_regex_length: int = MAX_REGEX_LENGTH) -> Predicate:
    """Compile a filter document into ``predicate(document) -> bool``; raises :class:`QueryError`."""
    return _Compiler(max_regex_length).document(query, 0)


def _is_operator_document(value: Any) -> bool:
    """``{"$gt": 1}`` is a condition; ``{"a": 1}`` and ``{"$date": ...}`` are values to equal."""
    if not isinstance(value, dict) or not value:
        return False
    dollar = [name.startswith("$") for name in value]
    if all(dollar):
        return _dict_date(value) is None
    if any(dollar):
        raise QueryError(f"a condition mixes operators and field names: {sorted(value)!r}")
    return False


def _any_value(test: Callable[[Any], bool], expand: bool) -> _Test:
    """A test that holds if any value found, or (expanding arrays) any element of one, passes."""
    if not expand:
        return lambda values: any(test(value) for value in values)

    def run(values: list) -> bool:
        for value in values:
            if test(value):
                return True
            if type(value) is list:
                for element in value:
                    if test(element):
                        return True
        return False

    return run


def _all_tests(tests: list[_Test]) -> _Test:
    if len(tests) == 1:
        return tests[0]
    return lambda values: all(test(values) for test in tests)


def _integer(value: Any) -> int | None:
    """An integral JSON number (``2`` or ``2.0``) as int, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not value.is_integer():
        return None
    return int(value)


class _Compiler:
    def __init__(self, max_regex_length: int) -> None:
        self.max_regex_length = max_regex_length

    # documents and fields

    def document(self, query: Any, depth: int) -> Predicate:
        if not isinstance(query, Mapping):
            raise QueryError(f"a query must be a JSON object, not {_json_type(query)}")
        if depth > MAX_DEPTH:
            raise QueryError(f"the query is nested more than {MAX_DEPTH} levels deep")
        clauses: list[Predicate] = []
        for name, operand in query.items():
            if not isinstance(name, str):
                raise QueryError(f"field names must be strings: {name!r}")
            if name.startswith("$"):
                if name in _LOGICAL:
                    clauses.append(self.logical(name, operand, depth))
                elif name == "$comment":
                    continue
                elif name in _UNSUPPORTED_TOP:
                    raise UnsupportedQueryError(f"{name} is not supported in real-time queries")
                else:
                    raise QueryError(f"unknown top-level operator: {name}")
            else:
                clauses.append(self.field(name, operand, depth))
        if not clauses:
            return lambda document: True
        if len(clauses) == 1:
            return clauses[0]
        return lambda document: all(clause(document) for clause in clauses)

    def logical(self, name: str, operand: Any, depth: int) -> Predicate:
        if not isinstance(operand, list) or not operand:
            raise QueryError(f"{name} needs a non-empty array of query objects")
        parts = [self.document(item, depth + 1) for item in operand]
        if name == "$and":
            return lambda document: all(part(document) for part in parts)
        if name == "$or":
            return lambda document: any(part(document) for part in parts)
        return lambda document: not any(part(document) for part in parts)

    def field(self, path: str, condition: Any, depth: int) -> Predicate:
        parts = split_path(path)
        if _is_operator_document(condition):
            test = self.conditions(condition, depth, expand=True)
        else:
            test = self.equality(condition, expand=True)
        return lambda document: test(resolve_path(document, parts))

    # operator documents

    def conditions(self, conditions: dict, depth: int, expand: bool) -> _Test:
        if depth > MAX_DEPTH:
            raise QueryError(f"the query is nested more than {MAX_DEPTH} levels deep")
        if "$options" in conditions and "$regex" not in conditions:
            raise QueryError("$options needs a $regex beside it")
        tests: list[_Test] = []
        for name, operand in conditions.items():
            if name == "$options":
                continue
            tests.append(self.condition(name, operand, conditions, depth, expand))
        return _all_tests(tests)

    def condition(self, name: str, operand: Any, conditions: dict, depth: int, expand: bool) -> _Test:
        if name == "$eq":
            return self.equality(operand, expand)
        if name == "$ne":
            equal = self.equality(operand, expand)
            return lambda values: not equal(values)
        if name in _COMPARISONS:
            return self.comparison(name, operand, expand)
        if name == "$in":
            return self.membership(name, operand, expand)
        if name == "$nin":
            member = self.membership(name, operand, expand)
            return lambda values: not member(values)
        if name == "$exists":
            return self.exists(operand)
        if name == "$type":
            return self.type_test(operand, expand)
        if name == "$regex":
            regex = self.regex(operand, conditions.get("$options", ""))
            return _any_value(lambda value: type(value) is str and regex.search(value) is not None, expand)
        if name == "$size":
            return self.size(operand)
        if name == "$all":
            return self.all_of(operand, depth, expand)
        if name == "$elemMatch":
            return self.elem_match(operand, depth)
        if name == "$not":
            if isinstance(operand, dict) and not operand:
                raise QueryError("$not needs a non-empty operator document")
            if not _is_operator_document(operand):
                raise QueryError("$not needs an operator document such as {\"$gt\": 1} or {\"$regex\": \"...\"}")
            inner = self.conditions(operand, depth + 1, expand)
            return lambda values: not inner(values)
        if name == "$mod":
            return self.modulo(operand, expand)
        if name in _UNSUPPORTED_FIELD:
            raise UnsupportedQueryError(f"{name} is not supported in real-time queries")
        if name in _LOGICAL:
            raise QueryError(f"{name} belongs at the top level of a query, not inside a field condition")
        raise QueryError(f"unknown operator: {name}")

    # single operators

    def literal_key(self, operand: Any, name: str = "a value") -> tuple:
        if isinstance(operand, dict) and len(operand) == 1 and "$date" in operand:
            date = parse_date(operand["$date"])
            if date is None:
                raise QueryError(f"invalid $date in {name}: use an ISO-8601 date-time or epoch milliseconds")
            return (DATE, date)
        try:
            return bson_key(operand)
        except TypeError as error:
            raise QueryError(str(error)) from None

    def equality(self, operand: Any, expand: bool) -> _Test:
        key = self.literal_key(operand)
        kind = type(operand)
        if kind is str and key[0] == STRING:
            # A plain string only equals the same string (a date-like string is another type).
            return _any_value(lambda value: value == operand and type(value) is str, expand)
        if kind is int or kind is float:
            return _any_value(lambda value: value == operand and type(value) in (int, float), expand)
        return _any_value(lambda value: bson_key(value) == key, expand)

    def comparison(self, name: str, operand: Any, expand: bool) -> _Test:
        key = self.literal_key(operand, name)
        rank = key[0]
        compare = _COMPARISONS[name]

        def test(value: Any) -> bool:
            found = bson_key(value)
            return found[0] == rank and compare(found, key)

        return _any_value(test, expand)

    def membership(self, name: str, operand: Any, expand: bool) -> _Test:
        if not isinstance(operand, list):
            raise QueryError(f"{name} needs an array")
        keys = set()
        regexes = []
        for item in operand:
            if isinstance(item, dict) and "$regex" in item:
                if set(item) - {"$regex", "$options"}:
                    raise QueryError(f"a regular expression in {name} takes only $regex and $options")
                regexes.append(self.regex(item["$regex"], item.get("$options", "")))
            elif _is_operator_document(item):
                raise QueryError(f"{name} takes values, not operators")
            else:
                keys.add(self.literal_key(item, name))

        def test(value: Any) -> bool:
            if bson_key(value) in keys:
                return True
            return type(value) is str and any(regex.search(value) is not None for regex in regexes)

        return _any_value(test, expand)

    def exists(self, operand: Any) -> _Test:
        if not isinstance(operand, (bool, int, float)):
            raise QueryError("$exists needs true or false")
        if operand:
            return lambda values: any(value is not MISSING for value in values)
        return lambda values: all(value is MISSING for value in values)

    def type_test(self, operand: Any, expand: bool) -> _Test:
        names = operand if isinstance(operand, list) else [operand]
        if not names:
            raise QueryError("$type needs a type name, a type number, or a non-empty array of them")
        codes: set[int] = set()
        for item in names:
            if item == "number":
                codes |= _NUMBER_CODES
            elif isinstance(item, str) and item in _TYPE_CODES:
                codes.add(_TYPE_CODES[item])
            elif _integer(item) is not None and _integer(item) in _TYPE_CODES.values():
                codes.add(_integer(item))
            else:
                raise QueryError(f"unknown $type: {item!r}")
        return _any_value(lambda value: _TYPE_CODES.get(bson_type(value) or "", 0) in codes, expand)

    def regex(self, pattern: Any, options: Any) -> Any:
        if not isinstance(pattern, str):
            raise QueryError("$regex needs a string")
        if not isinstance(options, str):
            raise QueryError("$options needs a string of flags such as \"i\"")
        if len(pattern) > self.max_regex_length:
            raise QueryError(f"$regex is {len(pattern)} characters; the limit is {self.max_regex_length}")
        unknown = set(options) - set("imsux")
        if unknown:
            raise QueryError(f"unknown $options flag(s): {''.join(sorted(unknown))} (use i, m, s)")
        if "x" in options:
            raise UnsupportedQueryError("the $options flag x (extended patterns) is not supported")
        flags = "".join(flag for flag in "ims" if flag in options)
        source = f"(?{flags}){pattern}" if flags else pattern
        try:
            return compile_pattern(source, self.max_regex_length + 6)
        except PatternError as error:
            raise QueryError(f"invalid $regex: {error}") from None

    def size(self, operand: Any) -> _Test:
        length = _integer(operand)
        if length is None or length < 0:
            raise QueryError("$size needs a non-negative integer")
        return lambda values: any(type(value) is list and len(value) == length for value in values)

    def all_of(self, operand: Any, depth: int, expand: bool) -> _Test:
        if not isinstance(operand, list):
            raise QueryError("$all needs an array")
        if not operand:
            return lambda values: False
        tests = []
        for item in operand:
            if isinstance(item, dict) and list(item) == ["$elemMatch"]:
                tests.append(self.elem_match(item["$elemMatch"], depth))
            elif _is_operator_document(item):
                raise QueryError("$all takes values or {\"$elemMatch\": ...} documents")
            else:
                tests.append(self.equality(item, expand))
        return _all_tests(tests)

    def elem_match(self, operand: Any, depth: int) -> _Test:
        if not isinstance(operand, dict):
            raise QueryError("$elemMatch needs an object")
        value_operators = [name for name in operand if name.startswith("$") and name not in _LOGICAL]
        if value_operators and len(value_operators) != len(operand):
            raise QueryError("$elemMatch takes either operators ({\"$gt\": 1}) or a query on subdocuments, not both")
        if value_operators:
            # {"$gte": 80, "$lt": 85}: all conditions hold for one and the same element.
            inner = self.conditions(operand, depth + 1, expand=False)

            def element_matches(element: Any) -> bool:
                return inner([element])
        else:
            query = self.document(operand, depth + 1)

            def element_matches(element: Any) -> bool:
                return isinstance(element, dict) and query(element)

        return lambda values: any(
            type(value) is list and any(element_matches(element) for element in value) for value in values
        )

    def modulo(self, operand: Any, expand: bool) -> _Test:
        if (
            not isinstance(operand, list) or len(operand) != 2
            or any(isinstance(item, bool) or not isinstance(item, (int, float)) or not _finite(item)
                   for item in operand)
        ):
            raise QueryError("$mod needs an array [divisor, remainder] of two numbers")
        divisor, remainder = int(operand[0]), int(operand[1])  # MongoDB truncates both
        if divisor == 0:
            raise QueryError("$mod needs a divisor other than 0")

        def test(value: Any) -> bool:
            if type(value) not in (int, float) or not _finite(value):
                return False
            whole = int(value)  # MongoDB truncates, and the remainder takes the dividend's sign
            rest = abs(whole) % abs(divisor)
            return (-rest if whole < 0 else rest) == remainder

        return _any_value(test, expand)


def _finite(number: int | float) -> bool:
    return isinstance(number, int) or math.isfinite(number)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return type(value).__name__
