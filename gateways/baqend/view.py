"""What one client holds of a live query's result, as its gateway tracks it.

The query shard that computes a live query keeps it in memory only; when it restarts, the
gateway's copy of what the client was told is the one record left, and the query is registered
again with it (:class:`~actors.baqend.contract.Known`) so that the client gets only what changed.
Tracked: the id and tag (version, updatedAt) of each document, and for a sorted query the order
of the visible window, applied from the result and every change the query reports, the same way
the SDK's resultStream applies match events. Pure.
"""

from __future__ import annotations

from typing import Any, Iterable

from actors.baqend.contract import tag


class ResultView:
    __slots__ = ("tags", "order")

    def __init__(self, entries: Iterable[tuple[str, tuple]], ordered: bool) -> None:
        self.tags: dict[str, tuple] = dict(entries)  # id -> tag
        self.order: list[str] | None = list(self.tags) if ordered else None  # the window, sorted queries

    @classmethod
    def of(cls, documents: list[dict[str, Any]], ordered: bool) -> "ResultView":
        return cls([(document["id"], tag(document)) for document in documents], ordered)

    def __len__(self) -> int:
        return len(self.tags)

    def entries(self) -> list[tuple[str, tuple]]:
        """(id, tag) in the client's order (the window's for a sorted query)."""
        tags = self.tags
        if self.order is None:
            return list(tags.items())
        return [(oid, tags[oid]) for oid in self.order]

    def apply_events(self, events: list[dict[str, Any]]) -> None:
        """Match events' fields, every one the query reported (unfiltered)."""
        for fields in events:
            data = fields["data"]
            match_type = fields["matchType"]
            self.apply(match_type, data["id"], None if match_type == "remove" else tag(data), fields.get("index"))

    def apply(self, match_type: str, oid: str, document_tag: tuple | None, index: int | None) -> None:
        order = self.order
        if match_type == "remove":
            if self.tags.pop(oid, None) is not None and order is not None:
                order.remove(oid)
            return
        moved = match_type in ("add", "changeIndex") and order is not None
        if moved and oid in self.tags:
            order.remove(oid)
        self.tags[oid] = document_tag
        if moved:
            order.insert(index, oid)
