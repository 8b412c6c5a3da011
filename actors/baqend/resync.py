"""The events that bring a client's result up to date after its live query was rebuilt.

A query shard that restarts has lost its live queries (soft state); the gateways register them
again, each with what its client holds (:class:`~actors.baqend.contract.Known`: the ids and tags of
its result, in the client's order, and the time of its last message), and the rebuilt query is
loaded from the documents as they are now. Instead of a second result, the client then gets the
match events that turn what it holds into the fresh result, in the protocol's own shapes:

- a document it holds that is no longer in the result: ``remove``, with the operation ``delete``
  when the document is gone (its data is only ``{"id"}``: no version, as the SDK expects of a
  deleted object, the last image is not kept anywhere), ``update`` when it was written (its data
  the current image, or ``{"id"}`` when the subscriber may no longer read it), ``none`` when it is
  unchanged (pushed out of a window by other writes);
- a document it holds whose tag changed: ``change`` (same place), or for a sorted query
  ``changeIndex`` when it moved relative to the others;
- a document it does not hold: ``add``, with ``insert`` when it was created after the client's
  last message, ``update`` when it was written after it, else ``none`` (pushed into a window).

Removes come first (clients apply events in order, and an index is that of the window after the
events before it). For a sorted query the documents that keep their order stay where they are;
every ``add`` and ``changeIndex`` is placed right after its predecessor in the fresh window, at
the index the client's list has at that moment, and ``change`` comes last, at the final index.
Pure: no I/O, no Ray.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from actors.baqend.contract import tag
from actors.baqend.rtquery import Event

Document = Mapping[str, Any]
# The current image of a document the client holds that is not in the fresh result, and whether
# the subscriber may read it: (None, False) when it is gone.
Lookup = Callable[[str], tuple[Document | None, bool]]


def resync(entries: list[tuple[str, tuple]], since: str, fresh: list[Document], is_sorted: bool,
           lookup: Lookup) -> list[Event]:
    """The events, most specific types, unfiltered, from ``entries`` (what the client holds) to
    ``fresh`` (the result now: the window, in order, for a sorted query)."""
    held = dict(entries)
    now = {document["id"]: document for document in fresh}
    order = [oid for oid, _ in entries] if is_sorted else sorted(held)
    events = [_removed(oid, held[oid], lookup(oid)) for oid in order if oid not in now]
    if not is_sorted:
        for oid in sorted(now):
            document = now[oid]
            if oid not in held:
                events.append(Event("add", _written(document, since), document))
            elif held[oid] != tag(document):
                events.append(Event("change", "update", document))
        return events
    return events + _window(order, held, fresh, since)


def _window(order: list[str], held: dict[str, tuple], fresh: list[Document], since: str) -> list[Event]:
    target = [document["id"] for document in fresh]
    position = {oid: index for index, oid in enumerate(target)}
    current = [oid for oid in order if oid in position]  # the client's window after the removes
    changed = {oid for oid in current if held[oid] != tag(fresh[position[oid]])}
    staying = _in_order(current, position, changed)
    events = []
    for index, oid in enumerate(target):
        if oid in staying:
            continue
        document = fresh[index]
        if oid in held:
            current.remove(oid)
            kind, operation = "changeIndex", "update"
        else:
            kind, operation = "add", _written(document, since)
        place = current.index(target[index - 1]) + 1 if index else 0
        current.insert(place, oid)
        events.append(Event(kind, operation, document, place))
    events += [Event("change", "update", fresh[index], index) for index, oid in enumerate(target)
               if oid in staying and oid in changed]
    return events


def _in_order(current: list[str], position: dict[str, int], changed: set[str]) -> set[str]:
    """The largest set of ``current`` whose order the fresh window keeps, every unchanged document
    first (their sort keys did not change, so they never cross each other)."""
    places = [position[oid] for oid in current]
    if all(a < b for a, b in zip(places, places[1:])):
        return set(current)
    # the heaviest increasing subsequence; an unchanged document outweighs all changed ones
    heavy = len(current) + 1
    weights = [1 if oid in changed else heavy for oid in current]
    best, previous = list(weights), [-1] * len(current)
    for i in range(len(current)):
        for j in range(i):
            if places[j] < places[i] and best[j] + weights[i] > best[i]:
                best[i], previous[i] = best[j] + weights[i], j
    kept, i = set(), max(range(len(current)), key=best.__getitem__)
    while i >= 0:
        kept.add(current[i])
        i = previous[i]
    return kept


def _removed(oid: str, held: tuple, found: tuple[Document | None, bool]) -> Event:
    document, readable = found
    if document is None:
        return Event("remove", "delete", {"id": oid})
    if not readable:
        return Event("remove", "update", {"id": oid})
    return Event("remove", "none" if tag(document) == held else "update", document)


def _written(document: Document, since: str) -> str:
    """What an added document's own writes were, as far as a client that heard last at ``since``
    knows (Baqend's timestamps compare as strings)."""
    if (document.get("createdAt") or "") > since:
        return "insert"
    if (document.get("updatedAt") or "") > since:
        return "update"
    return "none"
