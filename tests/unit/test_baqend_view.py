"""gateways/baqend/view.py: what a client holds of a live query, tracked by its gateway from the
result and every change, as the SDK's resultStream applies them."""

from __future__ import annotations

from gateways.baqend.view import ResultView

T = "2026-01-01T00:00:00.000Z"


def doc(key: str, version: int = 1) -> dict:
    return {"id": f"/db/T/{key}", "version": version, "updatedAt": T}


def match(match_type: str, key: str, version: int = 1, index: int | None = None) -> dict:
    fields = {"matchType": match_type, "operation": "update", "data": doc(key, version)}
    if index is not None:
        fields["index"] = index
    return fields


def test_a_sorted_window_follows_adds_removes_and_moves():
    view = ResultView.of([doc("a"), doc("b"), doc("c")], ordered=True)
    view.apply_events([match("remove", "c"), match("add", "d", 1, 0), match("changeIndex", "a", 2, 2),
                       match("change", "b", 3, 1)])
    assert view.entries() == [("/db/T/d", (1, T)), ("/db/T/b", (3, T)), ("/db/T/a", (2, T))]


def test_a_plain_result_keeps_ids_and_tags():
    view = ResultView.of([doc("a"), doc("b")], ordered=False)
    view.apply_events([match("remove", "a"), match("add", "c"), match("change", "b", 2)])
    assert sorted(view.entries()) == [("/db/T/b", (2, T)), ("/db/T/c", (1, T))]
    view.apply("remove", "/db/T/missing", None, None)  # nothing held: nothing to forget
    assert len(view) == 2


def test_the_changes_of_a_filtered_query_come_as_entries():
    view = ResultView([("/db/T/a", (1, T))], ordered=True)
    view.apply("add", "/db/T/b", (1, T), 0)
    view.apply("remove", "/db/T/a", None, None)
    assert view.entries() == [("/db/T/b", (1, T))]
