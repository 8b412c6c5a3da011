"""Sort order of real-time query results: MongoDB's, with the object id as the last tie-breaker.

Baqend orders objects that sort identically by id (baqend-notes.md, "Sorted windows"), which also
makes the order total: a sorted real-time query needs every object to have exactly one position.
Pure: no I/O, no Ray.
"""

from __future__ import annotations

import functools
from datetime import timedelta
from typing import Any, Callable, Mapping

from actors.baqend.mongoquery import (BOOL, DATE, EPOCH, MISSING, NULL, NUMBER, STRING, QueryError, bson_key,
                                      resolve_path, split_path)

SortSpec = tuple[tuple[str, int], ...]  # ((field path, 1 ascending | -1 descending), ...)

_EMPTY_ARRAY_KEY = (0, 0)  # MongoDB sorts [] before null and missing fields


def parse_sort(spec: Any) -> SortSpec:
    """A sort document (``{"name": 1, "age": -1}``) or pair list into a SortSpec; raises QueryError."""
    if spec is None:
        return ()
    if isinstance(spec, Mapping):
        pairs = list(spec.items())
    elif isinstance(spec, (list, tuple)) and all(isinstance(p, (list, tuple)) and len(p) == 2 for p in spec):
        pairs = [tuple(p) for p in spec]
    else:
        raise QueryError("a sort must be an object such as {\"name\": 1, \"age\": -1}")
    seen: set[str] = set()
    parsed = []
    for field, direction in pairs:
        split_path(field)
        if field.startswith("$"):
            raise QueryError(f"cannot sort by {field!r}")
        if field in seen:
            raise QueryError(f"{field!r} appears twice in the sort")
        seen.add(field)
        if isinstance(direction, bool) or direction not in (1, -1):
            raise QueryError(f"the sort direction of {field!r} must be 1 or -1")
        parsed.append((field, int(direction)))
    return tuple(parsed)


@functools.total_ordering
class _Descending:
    """Inverts the order of a key inside a tuple, so one tuple sorts mixed directions (the
    structured keys only, objects and arrays: :func:`descending` inverts the others in kind)."""

    __slots__ = ("key",)

    def __init__(self, key: tuple) -> None:
        self.key = key

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Descending) and self.key == other.key

    def __lt__(self, other: _Descending) -> bool:
        return other.key < self.key

    def __hash__(self) -> int:
        return hash(self.key)

    def __repr__(self) -> str:
        return f"_Descending({self.key!r})"

    def __getstate__(self) -> tuple:
        return (self.key,)

    def __setstate__(self, state: tuple) -> None:
        (self.key,) = state


# UTF-8 bytes are at most 0xF4 (surrogates included): 0xF4 - b inverts them, and a final 0xFF sorts
# after every inverted byte, so a string sorts after the strings it is a prefix of.
_INVERT = bytes(0xF4 - b if b <= 0xF4 else 0 for b in range(256))
_MICROSECOND = timedelta(microseconds=1)
_NEGATED = frozenset({NULL, NUMBER, BOOL, _EMPTY_ARRAY_KEY[0]})


def descending(key: tuple) -> tuple:
    """A :func:`bson_key` whose order is inverted, made of built-in values where it can be (numbers,
    booleans, strings and dates: a sorted window compares keys on every write, and comparing
    built-ins is done in C): the rank negated, and the value negated, its UTF-8 bytes inverted,
    or its instant in microseconds negated; an object or an array keeps :class:`_Descending`."""
    rank, value = key
    if rank in _NEGATED:
        return (-rank, -value)
    if rank == STRING:
        return (-rank, value.encode("utf-8", "surrogatepass").translate(_INVERT) + b"\xff")
    if rank == DATE:
        return (-rank, -((value - EPOCH) // _MICROSECOND))
    return (-rank, _Descending(value))


def field_key(document: Any, parts: tuple[str, ...], direction: int) -> tuple:
    """The key of one sort field: an array sorts by its smallest element ascending, largest descending."""
    keys = []
    for value in resolve_path(document, parts):
        if type(value) is list:
            if value:
                keys.extend(bson_key(element) for element in value)
            else:
                keys.append(_EMPTY_ARRAY_KEY)
        else:
            keys.append(bson_key(value))  # MISSING sorts as null
    return min(keys) if direction == 1 else max(keys)


@functools.lru_cache(maxsize=1024)
def sort_key(spec: SortSpec, id_field: str = "id") -> Callable[[Mapping[str, Any]], tuple]:
    """``key(document)`` ordering documents as MongoDB's ``sort(spec)``, ties broken by ascending id.

    The key is flat: each field's ``(rank, value)`` pair, then the id's, in one tuple, and last the
    id itself (what a sorted window holds its entries by: :class:`~actors.baqend.rtquery.RealtimeQuery`).
    Every pair has two items, so the flat tuple orders as the tuple of pairs would, and the id's pair
    already tells two documents apart; a sorted window compares keys on every write, and a flat key
    is one object less to reach per comparison. One key function for each sort (cached): the
    queries of one sort share it, so a write reaches the same few objects whichever query it meets."""
    fields = [(split_path(field), direction) for field, direction in spec]

    def key(document: Mapping[str, Any]) -> tuple:
        parts: list = []
        for path, direction in fields:
            value = field_key(document, path, direction)
            parts += value if direction == 1 else descending(value)
        object_id = document.get(id_field, MISSING)
        parts += bson_key(object_id)
        parts.append(object_id)
        return tuple(parts)

    return key
