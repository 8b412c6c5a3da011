"""gateways/nolag/qos.py: runs — a topic's QoS 1 messages fanned out together, kept in every
recipient's window as one shared piece and acked in order with no work per id (and a ``batchAck``
read as bytes, ``codec.batch_ack_packed`` + ``QosWindow.acked_packed``). A window given runs must
do exactly what a window given the same entries one by one does."""

from __future__ import annotations

import itertools

import msgpack
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gateways.nolag import codec
from gateways.nolag import qos as qos_module
from gateways.nolag.qos import RUNS_MAX, QosWindow, Run, Unacked

T = "chat/general/messages"
HEAD = b"\x82" + msgpack.packb("type") + msgpack.packb("batchAck") + msgpack.packb("msgIds")


def window(max_unacked: int = 1000, acks: bool = True) -> QosWindow:
    made = QosWindow(5.0, 2.0, 3, max_unacked)
    made.acks_seen = acks
    return made


def run_of(ids: list[str], first_ts: int, due: float = 5.0) -> Run:
    return Run(tuple(ids), tuple(Unacked(f"frame:{i}".encode(), first_ts + n, 1, due, 1, T)
                                 for n, i in enumerate(ids)), due)


def batch_ack(ids: list[str]) -> bytes:
    return msgpack.packb({"type": "batchAck", "msgIds": ids})


def packed_ack(qos: QosWindow, frame: bytes) -> bool:
    found = codec.batch_ack_packed(frame)
    return found is not None and qos.acked_packed(frame, *found)


IDS = [f"0192d6c4-0000-7000-8000-{n:012x}" for n in range(8)]


def test_a_run_is_held_as_one_piece_and_acked_in_order_with_nothing_moved_to_unacked():
    qos = window()
    first, second = run_of(IDS[:3], 10), run_of(IDS[3:6], 20, due=6.0)
    qos.add_run(first)
    qos.add_run(second)
    assert qos.size() == 6 and qos.unacked == {} and qos.next_due == 5.0
    assert list(qos.outstanding()) == IDS[:6]
    assert qos.holds(IDS[4]) and not qos.deliverable(IDS[4], 1) and qos.deliverable(IDS[7], 1)
    assert qos.acked(*IDS[:2]) is False  # in order: the first run's count moves
    assert [acked for _, acked in qos.runs] == [2, 0] and qos.unacked == {}
    assert not qos.holds(IDS[0]) and qos.deliverable(IDS[0], 1)  # acked: no longer out
    qos.acked(*IDS[2:5])  # across the runs' border: the first run leaves
    assert [(held, acked) for held, acked in qos.runs] == [(second, 2)] and qos.size() == 1
    assert list(qos.outstanding()) == [IDS[5]] and qos.unacked == {}


def test_an_ack_out_of_order_moves_what_is_left_of_the_runs_to_unacked_in_order():
    qos = window()
    qos.add_run(run_of(IDS[:3], 10))
    qos.add_run(run_of(IDS[3:6], 20))
    qos.acked(IDS[0], IDS[2], "unknown")  # IDS[0] in order, then IDS[2] out of order
    assert not qos.runs and qos.in_runs == 0
    assert list(qos.unacked) == [IDS[1], *IDS[3:6]]
    assert qos.unacked[IDS[1]].frame == f"frame:{IDS[1]}".encode()


def test_what_enters_unacked_after_a_run_is_newer_than_it():
    qos = window()
    qos.add_run(run_of(IDS[:2], 10))
    qos.track("single", Unacked(b"frame:single", 30, 1, 9.0, 1, T))
    assert not qos.runs and list(qos.unacked) == [*IDS[:2], "single"]


def test_an_ack_of_older_entries_then_of_a_runs_next_ids_keeps_the_run():
    qos = window()
    qos.track("old", Unacked(b"frame:old", 1, 1, 4.0, 1, T))
    qos.add_run(run_of(IDS[:3], 10))
    qos.acked("old", *IDS[:2])
    assert qos.unacked == {} and [acked for _, acked in qos.runs] == [2] and qos.size() == 1
    qos.track("newer", Unacked(b"frame:newer", 20, 1, 4.0, 1, T))  # moves the run's last id first
    assert list(qos.unacked) == [IDS[2], "newer"] and not qos.runs


def test_a_window_holds_at_most_runs_max_runs_and_moves_them_to_unacked_before_one_more():
    qos = window(max_unacked=10_000)
    ids = [f"0192d6c4-0000-7000-8000-{n:012x}" for n in range(2 * (RUNS_MAX + 1))]
    for n in range(RUNS_MAX + 1):
        qos.add_run(run_of(ids[2 * n:2 * n + 2], 10 + 2 * n))
    assert len(qos.runs) == 1 and list(qos.unacked) == ids[:2 * RUNS_MAX]
    assert list(qos.outstanding()) == ids and qos.size() == len(ids)


def test_a_run_not_due_is_kept_and_sets_the_next_due_time_and_a_due_one_is_resent_in_order():
    qos = window()
    qos.track("old", Unacked(b"frame:old", 1, 1, 4.0, 1, T))
    qos.add_run(run_of(IDS[:2], 10, due=6.0))
    sent: list[bytes] = []
    assert qos.resend_due(4.5, lambda frame: sent.append(frame) or True) == 1
    assert sent == [b"frame:old"] and len(qos.runs) == 1 and qos.next_due == 6.0
    assert qos.resend_due(6.0, lambda frame: sent.append(frame) or True) == 2
    assert sent[1:] == [f"frame:{i}".encode() for i in IDS[:2]] and not qos.runs
    assert [e.attempts for e in qos.unacked.values()] == [2, 2, 2]


def test_a_connection_that_never_acked_is_never_sent_a_run_again():
    qos = window(acks=False)
    qos.add_run(run_of(IDS[:2], 10))
    assert qos.resend_due(100.0, lambda frame: pytest.fail("resent")) == 0
    assert len(qos.runs) == 1 and qos.next_due == float("inf")


def test_floors_count_the_runs():
    qos = window()
    qos.positions[T] = 30
    qos.add_run(run_of(IDS[:3], 10))
    assert qos.floors() == {T: 9}
    qos.acked(IDS[0])
    assert qos.floors() == {T: 10}


def test_a_packed_batch_ack_of_the_next_ids_in_order_is_acked_across_runs():
    qos = window()
    qos.add_run(run_of(IDS[:3], 10))
    qos.add_run(run_of(IDS[3:6], 20))
    assert packed_ack(qos, batch_ack(IDS[:4])) is True
    assert [acked for _, acked in qos.runs] == [1] and list(qos.outstanding()) == IDS[4:6]


def test_a_packed_batch_ack_within_the_first_run_moves_its_count_and_one_to_its_end_takes_it_out():
    qos = window()
    first, second = run_of(IDS[:3], 10), run_of(IDS[3:6], 20)
    qos.add_run(first)
    qos.add_run(second)
    assert packed_ack(qos, batch_ack(IDS[:2])) is True
    assert [(held, acked) for held, acked in qos.runs] == [(first, 2), (second, 0)] and qos.size() == 4
    assert packed_ack(qos, batch_ack(IDS[2:3])) is True
    assert [(held, acked) for held, acked in qos.runs] == [(second, 0)] and qos.size() == 3
    assert packed_ack(qos, batch_ack(IDS[3:6])) is True
    assert not qos.runs and qos.in_runs == 0 and qos.size() == 0 and qos.unacked == {}


@pytest.mark.parametrize("frame", [
    batch_ack([IDS[1], IDS[0]]),  # out of order
    batch_ack(IDS[1:3]),  # not from the first one left
    batch_ack(IDS[:7]),  # more than are out
    batch_ack(IDS[:2]) + b"\xc0",  # a byte after the map
    batch_ack(IDS[:2])[:-1],  # cut short
    batch_ack([IDS[0], IDS[1][:-1] + "X"]),  # one byte differs
    msgpack.packb({"msgIds": IDS[:2], "type": "batchAck"}),  # the keys the other way round
    # across the runs' border (the walk of the runs, not the first run's one comparison)
    batch_ack(IDS[1:5]),  # not from the first one left
    batch_ack(IDS[:4]) + b"\xc0",  # a byte after the map
    batch_ack(IDS[:4])[:-1],  # cut short
    batch_ack(IDS[:3] + [IDS[4]]),  # the second run's first id skipped
], ids=["order", "not-first", "too-many", "extra", "short", "differs", "keys", "across-not-first", "across-extra",
        "across-short", "across-skipped"])
def test_any_other_packed_batch_ack_changes_nothing(frame: bytes):
    qos = window()
    qos.add_run(run_of(IDS[:3], 10))
    qos.add_run(run_of(IDS[3:6], 20))
    assert packed_ack(qos, frame) is False
    assert list(qos.outstanding()) == IDS[:6] and [acked for _, acked in qos.runs] == [0, 0]


def test_a_packed_batch_ack_with_an_array_16_header_of_few_ids_is_read_too():
    qos = window()
    qos.add_run(run_of(IDS[:3], 10))
    assert packed_ack(qos, HEAD + b"\xdc\x00\x02" + b"".join(map(msgpack.packb, IDS[:2]))) is True
    assert list(qos.outstanding()) == IDS[2:3]


def test_an_ack_repeating_an_older_id_takes_it_once():
    """Before: the older ids at the head of an ack were counted, then deleted, so a repeated one
    was deleted twice (KeyError: the connection closed with 1011)."""
    qos = window()
    qos.track("old", Unacked(b"frame:old", 1, 1, 4.0, 1, T))
    qos.add_run(run_of(IDS[:2], 10))
    assert qos.acked("old", "old", IDS[0]) is False
    assert list(qos.outstanding()) == [IDS[1]]  # the repeat is out of order: the run moved, as before


def test_holds_any_looks_the_first_id_up_in_the_runs_and_the_rest_once_the_runs_moved():
    qos = window()
    qos.track("old", Unacked(b"frame:old", 1, 1, 4.0, 1, T))
    qos.add_run(run_of(IDS[:3], 10))
    assert qos.holds_any([IDS[0], "x"]) is True and len(qos.runs) == 1  # the first: no move
    assert qos.holds_any(["x"]) is False and len(qos.runs) == 1
    assert qos.holds_any([]) is False
    assert qos.holds_any(["x", IDS[2]]) is True and not qos.runs  # then one lookup each
    assert list(qos.unacked) == ["old", *IDS[:3]]
    assert qos.holds_any(["x", "y"]) is False


def test_a_packed_batch_ack_is_read_only_once_the_connection_acks_and_for_runs_of_one_id_size():
    quiet = window(acks=False)
    quiet.add_run(run_of(IDS[:2], 10))
    assert packed_ack(quiet, batch_ack(IDS[:1])) is False  # its first ack goes the decoded way
    mixed = window()
    mixed.add_run(run_of(["short", "a-longer-id"], 10))
    assert packed_ack(mixed, batch_ack(["short"])) is False
    assert mixed.acked("short") is False and list(mixed.outstanding()) == ["a-longer-id"]


def test_a_run_given_its_ids_packed_reads_acks_as_one_that_packs_them():
    """A run made with its ids already packed (the frames' builder packs them) compares acks with
    those: the same bytes and size as packing the ids; ids of several sizes have no such reading
    either way."""
    ids = ["a" * 36, "b" * 36, "c" * 36]
    given_packed = Run(tuple(ids), (), 5.0, codec.joined_ids([msgpack.packb(i) for i in ids]))
    assert given_packed.packed() == Run(tuple(ids), (), 5.0).packed()
    assert bytes(given_packed.packed()[0]) == b"".join(msgpack.packb(i) for i in ids)
    assert given_packed.packed()[1] == 38  # str 8: a type byte, a length byte, 36 bytes
    mixed = ["a", "b" * 40]
    assert Run(tuple(mixed), (), 5.0, codec.joined_ids([msgpack.packb(i) for i in mixed])).packed()[1] == 0
    qos = window()
    qos.add_run(Run(tuple(ids), tuple(Unacked(b"f", n, 1, 5.0, 1, T) for n in range(3)), 5.0,
                    codec.joined_ids([msgpack.packb(i) for i in ids])))
    assert packed_ack(qos, batch_ack(ids[:2])) and qos.size() == 1
    assert packed_ack(qos, batch_ack(ids[2:])) and qos.size() == 0


def test_batch_ack_packed_reads_only_the_plain_shape_within_the_limit():
    ids = [msgpack.packb(i) for i in IDS[:2]]
    assert codec.batch_ack_packed(batch_ack(IDS[:2])) == (2, len(HEAD) + 1)
    assert codec.batch_ack_packed(HEAD + b"\xdc\x00\x02" + b"".join(ids)) == (2, len(HEAD) + 3)
    assert codec.batch_ack_packed(HEAD + b"\xdd\x00\x00\x00\x02" + b"".join(ids)) == (2, len(HEAD) + 5)
    assert codec.batch_ack_packed(batch_ack([])) is None  # empty: decoded (a first ack)
    assert codec.batch_ack_packed(HEAD) is None and codec.batch_ack_packed(HEAD + b"\xdc\x00") is None
    assert codec.batch_ack_packed(msgpack.packb({"type": "ack", "msgId": IDS[0]})) is None
    limits = codec.Limits(max_batch_ack=1)
    assert codec.batch_ack_packed(batch_ack(IDS[:2]), limits) is None  # decoded: its error


# -- the same as one by one ---------------------------------------------------------------------

OPS = st.lists(st.one_of(
    st.tuples(st.just("run"), st.integers(1, 4)),
    st.tuples(st.just("single"), st.booleans()),  # whether the socket took its frame
    st.tuples(st.just("prefix"), st.integers(0, 6)),
    st.tuples(st.just("packed"), st.integers(0, 6)),
    st.tuples(st.just("corrupt"), st.integers(1, 4)),
    st.tuples(st.just("some"), st.lists(st.integers(0, 12), max_size=4)),
    st.tuples(st.just("tick"), st.floats(0.0, 12.0)),
), max_size=25)


@settings(max_examples=400, deadline=None)
@example([("single", True), ("run", 2), ("some", [0, 0])], 1000, True, 32)  # an older id twice
@given(OPS, st.sampled_from([4, 8, 1000]), st.booleans(), st.sampled_from([2, 32]))
def test_a_window_with_runs_does_what_one_given_each_entry_does(ops: list, max_unacked: int, acks: bool,
                                                                runs_max: int):
    """Two windows take the same messages, one as runs (when it has room, as the fan-out asks;
    at most ``runs_max`` of them), the other entry by entry; the same acks, ticks and checks: the
    same entries wait, in the same order, the same frames are resent, the same floors."""
    qos_module.RUNS_MAX = runs_max
    try:
        _runs_against_entries(ops, max_unacked, acks)
    finally:
        qos_module.RUNS_MAX = RUNS_MAX


def _runs_against_entries(ops: list, max_unacked: int, acks: bool) -> None:
    runs, flat = window(max_unacked, acks), window(max_unacked, acks)
    numbers, now, ts = itertools.count(), 0.0, 0
    made: list[str] = []

    def new_ids(count: int) -> list[str]:
        ids = [f"0192d6c4-0000-7000-8000-{next(numbers):012x}" for _ in range(count)]
        made.extend(ids)
        return ids

    for op, arg in ops:
        if op == "run":
            ids = new_ids(arg)
            run = run_of(ids, ts + 1, due=now + 5.0)
            ts += arg
            if runs.size() + arg <= max_unacked:
                runs.add_run(run)
            else:  # the fan-out goes message by message
                for msg_id, entry in zip(run.ids, run.entries):
                    runs.track(msg_id, entry)
            for msg_id, entry in zip(run.ids, run.entries):
                flat.track(msg_id, entry)
            for qos in (runs, flat):
                qos.positions[T] = ts
        elif op == "single":
            (msg_id,) = new_ids(1)
            ts += 1
            entry = Unacked(f"frame:{msg_id}".encode(), ts, 1 if arg else 0, now + 5.0, 1, T)
            for qos in (runs, flat):
                qos.track(msg_id, entry, arg)
        elif op in ("prefix", "packed", "corrupt"):
            waiting = list(flat.unacked)
            ids = waiting[:arg] if op != "corrupt" else [*waiting[1:arg + 1], *waiting[:1]]
            if op == "prefix":
                assert runs.acked(*ids) == flat.acked(*ids)
            else:
                frame = batch_ack(ids)
                acking = runs.acks_seen
                if not packed_ack(runs, frame):
                    decoded = codec.decode(frame)
                    runs.acked(*decoded.msg_ids)
                else:
                    assert acking and ids  # only a connection that acks, never an empty one
                flat.acked(*ids)
        elif op == "some":
            ids = [made[i] if i < len(made) else f"unknown-{i}" for i in arg]
            assert runs.acked(*ids) == flat.acked(*ids)
        else:
            now += arg
            sent_runs: list[bytes] = []
            sent_flat: list[bytes] = []
            assert runs.resend_due(now, lambda f: sent_runs.append(f) or True) == \
                flat.resend_due(now, lambda f: sent_flat.append(f) or True)
            assert sent_runs == sent_flat
        seen = runs.outstanding()
        assert [(k, e.frame, e.ts_ms, e.attempts, e.due) for k, e in seen.items()] == \
            [(k, e.frame, e.ts_ms, e.attempts, e.due) for k, e in flat.unacked.items()]
        assert runs.size() == len(flat.unacked) and runs.acks_seen == flat.acks_seen
        assert runs.floors() == flat.floors() and runs.pinned == flat.pinned
        assert list(runs.unwritten) == list(flat.unwritten)
        assert all(runs.holds(i) == (i in flat.unacked) for i in made)
        probe = made[-3:] + ["unknown"]
        assert runs.holds_any(probe[::-1]) == any(i in flat.unacked for i in probe)
        assert len(runs.runs) <= qos_module.RUNS_MAX
        if runs.acks_seen:  # a lower bound of what may be resent (nothing, for one that never acked)
            assert runs.next_due <= min((e.due for e in seen.values()), default=float("inf"))
