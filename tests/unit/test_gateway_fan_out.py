"""The gateway's hand-off of a dialect event for several connections (``Gateway._apply`` →
``_fan_out``): a dialect with ``fan_out`` gets the whole delivery group in one call and counts the
connections that are gone itself; any other gets ``on_event`` per live session, and the gateway
counts the gone ones. Plain objects: a gateway made without its start-up, fake connections."""

from __future__ import annotations

from collections import defaultdict
from typing import Any
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from gateways.gateway import Gateway
from gateways.server import frame_header
from router.eventlog import EventLog
from router.contract import DELIVER_BINARY, DELIVER_EVENT, DELIVER_EVENTS, DELIVER_TEXT


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


class Socket:
    """A connection that keeps the bytes it was given (one piece per call) and takes frames or not."""

    def __init__(self, takes: bool = True, joins: bool = True) -> None:
        self.session, self.takes, self.joins = None, takes, joins
        self.pieces: list[bytes] = []

    def send_frame(self, frame: bytes, opcode: int, payload: bytes | None = None) -> bool:
        if self.takes:
            self.pieces.append(frame)
        return self.takes

    def takes_frames(self) -> bool:
        return self.takes and self.joins

    def cork_frames(self, frames: bytes) -> None:
        self.pieces.append(frames)


def frames_gateway(sockets: dict[int, Socket]) -> Gateway:
    gw = Gateway.__new__(Gateway)
    gw.connections = dict(sockets)
    gw.undeliverable = gw.delivered = 0
    gw.metrics = gw.events = None
    accounted: list[tuple] = []
    gw._account = lambda meta, nbytes, ids, delivered, failed: accounted.append((meta, nbytes, ids, delivered, failed))
    # Frames written to their whole group are accounted together, after the items (see
    # test_account_written_is_account_of_each_item for what that does).
    gw._account_written = lambda written: accounted.extend(
        (meta, len(payload), ids, len(ids), None) for _, payload, ids, meta in written if meta is not None)
    gw.accounted = accounted
    return gw


def test_frames_in_a_row_for_the_same_group_are_one_piece_each_and_accounted_frame_by_frame():
    sockets = {1: Socket(), 2: Socket()}
    gw = frames_gateway(sockets)
    group = (1, 2)
    gw._apply([(DELIVER_TEXT, b"a", group, "m1"), (DELIVER_TEXT, b"bb", group, "m2"), (DELIVER_BINARY, b"c", group, None),
               (DELIVER_BINARY, b"d", group, "m4")])
    text = frame_header(0x1, 1) + b"a" + frame_header(0x1, 2) + b"bb"
    binary = frame_header(0x2, 1) + b"c" + frame_header(0x2, 1) + b"d"
    assert sockets[1].pieces == sockets[2].pieces == [text, binary]
    assert gw.delivered == 8 and gw.undeliverable == 0
    assert gw.accounted == [("m1", 1, group, 2, None), ("m2", 2, group, 2, None), ("m4", 1, group, 2, None)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["joins", "paused", "refuses", "gone"]), min_size=1, max_size=4),
       st.lists(st.tuples(st.sampled_from([DELIVER_TEXT, DELIVER_BINARY]), st.binary(max_size=3),
                          st.sampled_from([None, "m"]), st.booleans()), max_size=6))
def test_runs_of_frames_write_and_account_what_frames_one_at_a_time_do(kinds: list[str], items: list[tuple]):
    """The same items with one group object (runs) and with an equal tuple each (never a run): the
    same bytes reach each socket in the same order, the same counts and accounting."""

    def world() -> tuple[Gateway, dict[int, Socket]]:
        sockets = {n: Socket(takes=kind != "refuses", joins=kind == "joins")
                   for n, kind in enumerate(kinds) if kind != "gone"}
        return frames_gateway(sockets), sockets

    ids = list(range(len(kinds)))
    shared = tuple(ids)
    runs, run_sockets = world()
    runs._apply([(kind, payload, shared if same else tuple(ids), meta) for kind, payload, meta, same in items])
    single, single_sockets = world()
    single._apply([(kind, payload, tuple(ids), meta) for kind, payload, meta, _ in items])
    assert {n: b"".join(s.pieces) for n, s in run_sockets.items()} == {n: b"".join(s.pieces)
                                                                        for n, s in single_sockets.items()}
    assert (runs.delivered, runs.undeliverable) == (single.delivered, single.undeliverable)
    assert [(meta, nbytes, list(group), delivered, failed) for meta, nbytes, group, delivered, failed in runs.accounted] \
        == [(meta, nbytes, list(group), delivered, failed) for meta, nbytes, group, delivered, failed in single.accounted]


def test_a_group_holding_a_connection_twice_goes_frame_by_frame():
    """Frame by frame, a connection in the group twice gets each frame twice in a row; one piece
    each would interleave the run (a, b, a, b): such a group is not joined."""
    sockets = {1: Socket(), 2: Socket()}
    gw = frames_gateway(sockets)
    group = (1, 1, 2)
    gw._apply([(DELIVER_TEXT, b"a", group, None), (DELIVER_TEXT, b"b", group, None)])
    a, b = frame_header(0x1, 1) + b"a", frame_header(0x1, 1) + b"b"
    assert sockets[1].pieces == [a, a, b, b] and sockets[2].pieces == [a, b]


class Metrics:
    """The counters ``_account`` updates (``router.metrics.GatewayMetrics``' hot-path fields)."""

    def __init__(self) -> None:
        self.messages_out: dict[str, int] = defaultdict(int)
        self.bytes_out: dict[str, int] = defaultdict(int)
        self.latencies: list[tuple[str, float]] = []

    def latency(self, dialect: str, seconds: float, now: float) -> None:
        self.latencies.append((dialect, seconds))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=5), st.lists(st.integers(0, 9), max_size=3),
                          st.one_of(st.none(), st.tuples(st.sampled_from(["gw-a", "gw-b"]), st.integers(0, 20),
                                                         st.integers(0, 10**6), st.sampled_from(["signal", "nolag"]),
                                                         st.sampled_from(["hub:publish", None]),
                                                         st.sampled_from(["t1", "t2", None])))),
                max_size=12),
       st.sampled_from([1.0, 0.5, 0.0]))
def test_account_written_is_account_of_each_item(tmp_path_factory, items: list[tuple], sample_rate: float):
    """Frames written to their whole group are accounted in one pass: the same counters and the
    same event-log records (groups, ids, streams) as ``_account`` of each in turn, and the latency
    metric (which samples one call in 10 ms) offered the first one ``_account`` offers it."""

    def world() -> Gateway:
        gw = Gateway.__new__(Gateway)
        gw.metrics = Metrics()
        gw.events = EventLog(tmp_path_factory.mktemp("events"), "gw-a", sample_rate=sample_rate)
        return gw

    written = [(DELIVER_TEXT, payload, tuple(ids), meta) for payload, ids, meta in items]
    logged = [item for item in written if item[3] is not None]
    # A dialect's own run (NoLag's) goes through account_written: the same as account_fanout of each.
    at_once, each, dialect_run = world(), world(), world()
    each.delivered = dialect_run.delivered = 0
    with mock.patch("time.time_ns", return_value=10**18):
        at_once._account_written(written)
        dialect_run.account_written(logged)
        for _, payload, ids, meta in logged:
            each.account_fanout(meta, len(payload), ids)
    assert dialect_run.delivered == each.delivered == sum(len(item[2]) for item in logged)
    for gw in (at_once, dialect_run):
        assert gw.metrics.latencies == each.metrics.latencies[:1]
    for gw in (at_once, each, dialect_run):
        gw.taken = gw.events._take()
        gw.events.close()
    for gw in (at_once, dialect_run):
        assert gw.metrics.messages_out == each.metrics.messages_out
        assert gw.metrics.bytes_out == each.metrics.bytes_out
        first, second = gw.taken, each.taken
        assert [bytes(chunk) for chunk in first.groups] == [bytes(chunk) for chunk in second.groups]
        assert (first.groups_end, list(first.ids), first.streams) == (second.groups_end, list(second.ids),
                                                                      second.streams)


# -- frames accepted in a row (Gateway.accepted_row) ---------------------------------------------

class RowEvents:
    def __init__(self, every: int) -> None:
        self.sample_every, self.records = every, []

    def sampled(self, seq: int) -> bool:
        return seq % self.sample_every == 0

    def ingress(self, ts_ns: int, meta: tuple, protocol_id: Any, nbytes: int, connection: int) -> None:
        self.records.append((ts_ns, meta, protocol_id, nbytes, connection))


class RowMetrics:
    def __init__(self) -> None:
        from collections import Counter

        self.messages_in, self.bytes_in = Counter(), Counter()


def test_frames_accepted_in_a_row_are_what_accepting_each_records_with_one_clock_read():
    def fresh(every: int) -> Gateway:
        gw = Gateway.__new__(Gateway)  # only what accepting reads
        gw.id, gw._seq, gw.events, gw.metrics = "gw-1", 40, RowEvents(every), RowMetrics()
        return gw

    row, each = fresh(1), fresh(1)
    row.accepted_row("nolag", "BatchAck", [30, 3000, 7], 12)
    for size in (30, 3000, 7):
        meta = each.event_meta("nolag", "BatchAck")
        each.accepted(meta, None, size, 12)
    assert row._seq == each._seq == 43
    assert row.metrics.messages_in == each.metrics.messages_in == {"nolag": 3}
    assert row.metrics.bytes_in == each.metrics.bytes_in == {"nolag": 3037}
    (ts, _, _, _, _) = row.events.records[0]
    assert row.events.records == [(ts, ("gw-1", seq, ts, "nolag", "BatchAck", None), None, size, 12)
                                  for seq, size in zip((41, 42, 43), (30, 3000, 7))]
    assert [(meta[:2] + meta[3:], rest) for _, meta, *rest in each.events.records] == \
        [(meta[:2] + meta[3:], rest) for _, meta, *rest in row.events.records]
    sampled = fresh(2)  # each frame takes its seq; the sampled ones are logged
    sampled.accepted_row("nolag", "BatchAck", [1, 2, 3], 5)
    assert [meta[1] for _, meta, *_ in sampled.events.records] == [42] and sampled._seq == 43
