"""The gateway's hand-off of a dialect event for several connections (``Gateway._apply`` →
``_fan_out``): a dialect with ``fan_out`` gets the whole delivery group in one call and counts the
connections that are gone itself; any other gets ``on_event`` per live session, and the gateway
counts the gone ones. Plain objects: a gateway made without its start-up, fake connections."""

from __future__ import annotations

from typing import Any

from gateways.gateway import Gateway
from router.contract import DELIVER_EVENT, DELIVER_EVENTS


class Connection:
    def __init__(self, session: Any) -> None:
        self.session = session


class EventSession:
    """A dialect session without ``fan_out``."""

    def __init__(self) -> None:
        self.events: list[Any] = []

    def on_event(self, payload: Any) -> None:
        self.events.append(payload)


class FanOutSession(EventSession):
    calls: list[tuple] = []

    @staticmethod
    def fan_out(payload: Any, connection_ids: tuple, gateway: Any) -> None:
        FanOutSession.calls.append((payload, connection_ids, gateway))


def gateway(sessions: dict[int, Any]) -> Gateway:
    gw = Gateway.__new__(Gateway)  # only what _apply reads
    gw.connections = {cid: Connection(session) for cid, session in sessions.items()}
    gw.undeliverable = 0
    return gw


def test_a_dialect_with_fan_out_gets_the_whole_group_in_one_call():
    FanOutSession.calls.clear()
    gw = gateway({1: None, 2: FanOutSession(), 3: FanOutSession()})  # 1: upgraded, no session yet
    gw._apply([(DELIVER_EVENT, "event", (9, 1, 2, 3), None)])
    assert FanOutSession.calls == [("event", (9, 1, 2, 3), gw)]
    assert gw.undeliverable == 0  # the dialect counts the gone ones (9 and 1) in its loop


def test_a_dialect_without_fan_out_gets_each_event_and_the_gateway_counts_the_gone_ones():
    first, second = EventSession(), EventSession()
    gw = gateway({1: None, 2: first, 3: second})
    gw._apply([(DELIVER_EVENT, "event", (9, 1, 2, 3), None)])
    assert first.events == ["event"] and second.events == ["event"]
    assert gw.undeliverable == 2


def test_a_group_whose_connections_are_all_gone_is_counted_once_each():
    gw = gateway({1: None})
    gw._apply([(DELIVER_EVENT, "event", (7, 8, 1), None)])
    assert gw.undeliverable == 3


def test_write_since_writes_only_the_connections_corked_after_the_mark():
    """A shard reply's answers leave before its deliveries are applied; what earlier replies of
    the turn corked keeps its place for the turn's one write."""
    written: list[str] = []

    class Corked:
        def __init__(self, name: str) -> None:
            self.name, self.id = name, name

        def flush(self) -> None:
            written.append(self.name)

    gw = Gateway.__new__(Gateway)
    earlier, answered, other = Corked("earlier"), Corked("answered"), Corked("other")
    gw._corked = [earlier]
    mark = gw.corked_count()
    gw._corked += [answered, other]  # corked by the reply's answers
    gw.write_since(mark)
    assert written == ["answered", "other"] and gw._corked == [earlier]
    gw.write_since(gw.corked_count())  # nothing corked since: nothing written
    assert written == ["answered", "other"]


class RunSession(FanOutSession):
    runs: list[tuple] = []

    @staticmethod
    def fan_out_run(payloads: list, connection_ids: tuple, gateway: Any) -> None:
        RunSession.runs.append((payloads, connection_ids))


def test_events_in_a_row_for_the_same_group_go_to_the_dialect_as_one_run_in_order():
    """A run is the items in a row with the same group object (a topic shard's routes, one tuple a
    bundle's pickle keeps as one): an equal tuple, another kind or another group ends it."""
    FanOutSession.calls.clear()
    RunSession.runs.clear()
    gw = gateway({1: RunSession(), 2: RunSession()})
    group, equal = (1, 2), tuple([1, 2])
    assert equal is not group
    gw._apply([(DELIVER_EVENT, "a", group, None), (DELIVER_EVENT, "b", group, None),
               (DELIVER_EVENT, "c", equal, None),  # equal, not the same object: its own
               (DELIVER_EVENT, "d", group, None), (DELIVER_EVENT, "e", group, None), (DELIVER_EVENT, "f", group, None),
               (DELIVER_EVENTS, (["g"],), group, None), (DELIVER_EVENT, "h", group, None)])
    assert RunSession.runs == [(["a", "b"], group), (["d", "e", "f"], group)]
    assert [(payload, ids) for payload, ids, _ in FanOutSession.calls] == [("c", equal), ((["g"],), group),
                                                                          ("h", group)]


def test_a_run_for_a_dialect_without_fan_out_run_goes_event_by_event():
    FanOutSession.calls.clear()
    first, second = EventSession(), EventSession()
    group = (1, 2, 9)
    gw = gateway({1: FanOutSession(), 2: FanOutSession()})
    gw._apply([(DELIVER_EVENT, "a", group, None), (DELIVER_EVENT, "b", group, None)])
    assert [payload for payload, _, _ in FanOutSession.calls] == ["a", "b"]
    gw = gateway({1: first, 2: second})
    gw._apply([(DELIVER_EVENT, "a", group, None), (DELIVER_EVENT, "b", group, None)])
    assert first.events == second.events == ["a", "b"] and gw.undeliverable == 2
