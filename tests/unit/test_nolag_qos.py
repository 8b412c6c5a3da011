"""gateways/nolag/qos.py: a connection's QoS window — acks, redelivery, QoS 2 ids, resume and replay."""

from __future__ import annotations

from typing import NamedTuple

from gateways.nolag.qos import SEEN_CAP, QosWindow, Unacked

T = "chat/general/messages"
U = "chat/general/other"


def window(ack_timeout_s: float = 5.0, ack_backoff: float = 2.0, max_attempts: int = 5,
           max_unacked: int = 1000) -> QosWindow:
    return QosWindow(ack_timeout_s, ack_backoff, max_attempts, max_unacked)


def write(qos_window: QosWindow, msg_id: str | None, qos: int, ts_ms: int, now: float = 0.0, topic: str = T,
          sent: bool = True) -> bool:
    """What the session does for one message: ask, write ``frame:<id>``, tell; whether it was written."""
    if not qos_window.deliverable(msg_id, qos):
        return False
    qos_window.delivered(topic, msg_id, qos, ts_ms, f"frame:{msg_id}".encode(), sent, now)
    return True


def due(qos_window: QosWindow, now: float) -> list[bytes]:
    """The frames ``resend_due`` writes at ``now`` (the socket takes each one)."""
    frames: list[bytes] = []
    qos_window.resend_due(now, lambda frame: frames.append(frame) or True)
    return frames


class Item(NamedTuple):
    msg_id: str | None
    qos: int
    tag: str = ""


# -- QoS 1: unacked until acked -----------------------------------------------------------------

def test_requires_ack_only_for_qos_1_and_2_with_an_id():
    assert QosWindow.requires_ack("m", 1) is True
    assert QosWindow.requires_ack("m", 2) is True
    assert QosWindow.requires_ack("m", 0) is False
    assert QosWindow.requires_ack(None, 1) is False
    assert QosWindow.requires_ack(None, 2) is False


def test_qos1_waits_in_unacked_until_acked():
    qos = window()
    assert write(qos, "m1", 1, 10, now=100.0) is True
    entry = qos.unacked["m1"]
    assert (entry.frame, entry.ts_ms, entry.attempts, entry.due, entry.qos, entry.topic) == (
        b"frame:m1", 10, 1, 105.0, 1, T)
    assert qos.deliverable("m1", 1) is False  # out and waiting for its ack: not written twice
    assert qos.deliverable("m1", 2) is False
    assert qos.acks_seen is False
    qos.acked("m1")
    assert qos.acks_seen is True and list(qos.unacked) == []
    assert qos.deliverable("m1", 1) is True  # QoS 1: at least once, a later copy may be written
    assert list(qos.seen_qos2) == [] and qos.deliverable("m1", 2) is True  # only QoS 2 ids are remembered
    qos.acked("m1")  # acking twice, or an unknown id, is harmless
    assert list(qos.unacked) == []


def test_qos0_and_messages_without_an_id_are_not_tracked():
    qos = window()
    assert write(qos, "m0", 0, 1) is True
    assert write(qos, None, 1, 2) is True
    assert write(qos, None, 2, 3) is True
    assert list(qos.unacked) == [] and list(qos.seen_qos2) == []
    assert write(qos, "m0", 0, 4) is True  # QoS 0 is never held back
    assert qos.positions == {T: 4}


def test_batch_ack_and_an_empty_batch_ack_turn_redelivery_on():
    qos = window()
    for index in range(3):
        write(qos, f"m{index}", 1, index + 1)
    qos.acked()
    assert qos.acks_seen is True and list(qos.unacked) == ["m0", "m1", "m2"]
    qos.acked("m2", "m0", "unknown")
    assert list(qos.unacked) == ["m1"]


def test_an_unsent_frame_is_still_tracked_but_moves_no_position():
    qos = window()
    write(qos, "m1", 1, 7, now=1.0, sent=False)
    assert list(qos.unacked) == ["m1"] and qos.unacked["m1"].due == 6.0 and qos.unacked["m1"].attempts == 0
    assert qos.positions == {}


# -- redelivery ---------------------------------------------------------------------------------

def test_nothing_is_redelivered_before_the_connection_acks():
    qos = window()
    write(qos, "m1", 1, 1, now=0.0)
    assert due(qos, 1e9) == []
    assert list(qos.unacked) == ["m1"] and qos.unacked["m1"].attempts == 1  # nor given up


def test_redelivery_backoff_then_give_up_after_max_attempts():
    qos = window()  # 5 s, x2, 5 sends in all
    qos.acked()
    write(qos, "m1", 1, 1, now=100.0)
    resent = []
    for now in (104.999, 105.0, 114.999, 115.0, 134.999, 135.0, 174.999, 175.0, 254.999):
        frames = due(qos, now)
        resent.extend((now, frame) for frame in frames)
    assert resent == [(105.0, b"frame:m1"), (115.0, b"frame:m1"), (135.0, b"frame:m1"), (175.0, b"frame:m1")]
    assert qos.unacked["m1"].attempts == 5 and qos.unacked["m1"].due == 255.0
    assert due(qos, 255.0) == []  # the fifth send was the last: given up
    assert list(qos.unacked) == []
    assert qos.floors() == {T: 0}  # but not skipped: a reconnect replays it from the log
    assert due(qos, 1e9) == []


def test_a_tick_before_the_earliest_due_looks_at_nothing_and_a_first_ack_makes_everything_due():
    qos = window()  # 5 s, x2
    write(qos, "m1", 1, 1, now=0.0)
    write(qos, "m2", 1, 2, now=1.0)
    assert qos.next_due == 5.0  # the earliest entry's
    assert due(qos, 6.0) == [] and qos.next_due == float("inf")  # no acks yet: none will ever be due
    write(qos, "m3", 1, 3, now=7.0)
    assert qos.next_due == 12.0
    qos.acked("m3")  # the first ack: m1 and m2, long past their due, go on the next tick
    assert qos.next_due == float("-inf")
    assert due(qos, 8.0) == [b"frame:m1", b"frame:m2"]
    assert qos.next_due == 18.0  # 8 + 5 x 2: the earlier of the two resends' dues
    assert due(qos, 17.999) == []
    assert due(qos, 18.0) == [b"frame:m1", b"frame:m2"]


def test_a_reconnect_that_restores_acks_makes_what_was_written_before_due():
    """The actor acked on an earlier connection (restored after messages were already written
    here): those messages are resent when due, as after a first ack on this connection."""
    qos = window()  # 5 s
    write(qos, "m1", 1, 1, now=0.0)
    assert due(qos, 6.0) == [] and qos.next_due == float("inf")  # not known to ack yet
    qos.restore([], acks=True)
    assert due(qos, 7.0) == [b"frame:m1"]
    qos.restore([], acks=True)  # again: nothing changes
    assert due(qos, 7.5) == [] and qos.unacked["m1"].attempts == 2


def test_the_lower_bound_holds_with_an_unsent_frame_behind_a_resent_one():
    qos = window()
    qos.acked()
    write(qos, "m1", 1, 1, now=0.0)
    assert due(qos, 5.0) == [b"frame:m1"] and qos.next_due == 15.0
    write(qos, "m2", 1, 2, now=6.0, sent=False)  # due at once... at 11: before m1's 15
    assert qos.next_due == 11.0
    assert due(qos, 11.0) == [b"frame:m2"]
    assert qos.unacked["m2"].attempts == 1 and qos.next_due == 15.0


def test_windows_share_a_fan_outs_entry_and_a_resend_replaces_only_its_own():
    shared = Unacked(b"frame:m", 4, 1, 5.0, 1, T)
    first, second = window(), window()
    for qos in (first, second):
        qos.track("m", shared)
    assert first.unacked["m"] is shared and second.unacked["m"] is shared
    assert first.positions == second.positions == {T: 4}
    first.acked()
    assert due(first, 5.0) == [b"frame:m"]
    assert first.unacked["m"].attempts == 2 and first.unacked["m"].due == 15.0
    assert (shared.attempts, shared.due) == (1, 5.0) and second.unacked["m"] is shared
    second.acked("m")
    assert list(second.unacked) == [] and list(first.unacked) == ["m"]


def test_backoff_counts_from_the_actual_resend_and_other_settings():
    qos = window(ack_timeout_s=1.0, ack_backoff=3.0, max_attempts=3)
    qos.acked()
    write(qos, "m", 1, 1, now=0.0)
    assert due(qos, 2.5) == [b"frame:m"]  # late tick: the next one is 1 x 3 s after 2.5
    assert qos.unacked["m"].due == 5.5
    assert due(qos, 5.499) == []
    assert due(qos, 5.5) == [b"frame:m"]
    assert qos.unacked["m"].due == 5.5 + 9.0 and qos.unacked["m"].attempts == 3
    assert due(qos, 14.5) == [] and list(qos.unacked) == []


def test_max_attempts_one_gives_up_without_resending():
    qos = window(max_attempts=1)
    qos.acked()
    write(qos, "m", 1, 1, now=0.0)
    assert due(qos, 4.999) == [] and list(qos.unacked) == ["m"]
    assert due(qos, 5.0) == [] and list(qos.unacked) == []


def test_an_ack_stops_redelivery():
    qos = window()
    qos.acked()
    write(qos, "m1", 1, 1, now=0.0)
    write(qos, "m2", 1, 2, now=1.0)
    qos.acked("m1")
    assert due(qos, 10.0) == [b"frame:m2"]


def test_qos2_is_never_resent_nor_given_up():
    qos = window(max_attempts=1)
    qos.acked()
    write(qos, "q", 2, 1, now=0.0)
    write(qos, "one", 1, 2, now=0.0)
    assert due(qos, 1e9) == []  # the QoS 1 one is given up (max_attempts 1), the QoS 2 one waits
    assert list(qos.unacked) == ["q"] and qos.unacked["q"].attempts == 1
    qos.acked("q")
    assert list(qos.unacked) == []


def test_redeliveries_come_oldest_written_first():
    qos = window()
    qos.acked()
    write(qos, "a", 1, 1, now=0.0)
    write(qos, "b", 1, 2, now=1.0)
    write(qos, "c", 1, 3, now=2.0)
    assert due(qos, 6.0) == [b"frame:a", b"frame:b"]  # c is due at 7
    # a is next due at 16, b at 16, c at 7: at 20 all three, still in the order they were written
    assert due(qos, 20.0) == [b"frame:a", b"frame:b", b"frame:c"]


# -- max_unacked --------------------------------------------------------------------------------

def test_max_unacked_evicts_the_oldest():
    qos = window(max_unacked=2)
    qos.acked()
    write(qos, "m0", 1, 1, now=0.0)
    write(qos, "m1", 2, 2, now=1.0)
    write(qos, "m2", 1, 3, now=2.0)
    assert list(qos.unacked) == ["m1", "m2"]
    write(qos, "m3", 1, 4, now=3.0, sent=False)  # evicts even when the frame was not taken
    assert list(qos.unacked) == ["m2", "m3"]
    assert qos.deliverable("m0", 1) is True  # dropped: no longer held back
    assert qos.deliverable("m1", 2) is False  # the QoS 2 one was written: still never twice
    assert due(qos, 100.0) == [b"frame:m2", b"frame:m3"]
    assert len(qos.unacked) == 2
    # m0 left the window unacked: a reconnect still replays it (its floor is pinned below it)
    assert qos.pinned == {T: 0} and qos.floors() == {T: 0}


# -- QoS 2: never twice -------------------------------------------------------------------------

def test_qos2_id_written_once_even_after_its_ack():
    qos = window()
    assert write(qos, "q", 2, 1) is True
    assert list(qos.seen_qos2) == ["q"]
    qos.acked("q")
    assert write(qos, "q", 2, 2) is False
    assert write(qos, "q", 1, 3) is True  # the same id at QoS 1 is at-least-once
    assert qos.positions == {T: 3}


def test_qos2_not_taken_by_the_socket_is_not_seen():
    qos = window()
    write(qos, "q", 2, 1, sent=False)
    assert list(qos.seen_qos2) == [] and list(qos.unacked) == ["q"]
    assert qos.deliverable("q", 2) is False  # waits in unacked
    qos.acked("q")
    assert qos.deliverable("q", 2) is True


def test_seen_qos2_is_capped_at_10000_oldest_dropped():
    assert SEEN_CAP == 10_000
    qos = window(max_unacked=1)
    for index in range(10_001):
        write(qos, f"q{index}", 2, index + 1)
    assert len(qos.seen_qos2) == 10_000
    assert next(iter(qos.seen_qos2)) == "q1"
    assert qos.deliverable("q0", 2) is True and qos.deliverable("q1", 2) is False


# -- positions and resume -----------------------------------------------------------------------

def test_positions_move_forward_only_on_written_frames():
    qos = window()
    write(qos, None, 0, 50)
    write(qos, None, 0, 40)  # older: no step back
    write(qos, None, 0, 60, sent=False)
    write(qos, None, 0, 5, topic=U)
    assert qos.positions == {T: 50, U: 5}


def test_joined_keeps_a_held_position_and_left_forgets_it():
    qos = window()
    assert qos.joined(T, 30) == 30
    assert qos.joined(T, 99) == 30
    write(qos, None, 0, 45)
    assert qos.joined(T, 10) == 45
    qos.left(T)
    qos.left(U)  # unknown: harmless
    assert qos.positions == {}
    assert qos.joined(T, 99) == 99


def test_resume_without_acks_is_the_positions():
    qos = window()
    write(qos, "a", 1, 10)
    write(qos, "b", 1, 20)
    resume = qos.resume()
    assert resume == {T: 20}
    resume[T] = 0  # a copy
    assert qos.positions == {T: 20}


def test_floors_are_just_before_the_oldest_unacked_with_or_without_acks():
    qos = window()
    write(qos, "a", 1, 10)
    write(qos, "b", 1, 20)
    write(qos, "c", 2, 7, topic=U)  # QoS 2, written: never written again, so it holds no floor
    write(qos, "d", 0, 30, topic=U)
    assert qos.floors() == {T: 9, U: 30}
    assert qos.resume() == {T: 20, U: 30}  # the positions: the last written
    qos.acked("a")
    assert qos.floors() == {T: 19, U: 30}
    qos.acked("b", "c")
    assert qos.floors() == {T: 20, U: 30}


def test_resume_ignores_unacked_of_topics_without_a_position():
    qos = window()
    qos.acked()
    write(qos, "a", 1, 10)
    write(qos, "u", 1, 4, topic=U, sent=False)  # never written: U has no position
    qos.left(T)
    assert qos.floors() == {}
    write(qos, None, 0, 2, topic=U)
    assert qos.floors() == {U: 2}  # 3 (just before u) is not below 2


# -- reconnect: restore, then replay ------------------------------------------------------------

def test_restore_then_replay_skips_seen_qos2_and_advances_positions():
    qos = window()
    qos.restore(["old1", "old2"])
    assert list(qos.seen_qos2) == ["old1", "old2"]
    assert qos.joined("x/y/new", 500) == 500  # a topic without a saved position
    topics = qos.replay_topics({T: 100, U: 200, "x/y/gone": 300}, [U, "x/y/new", T])
    assert topics == [U, T]  # in subscription order, only those with a saved position
    assert qos.positions == {"x/y/new": 500, U: 200, T: 100}
    logged = [Item("old1", 2, "a"), Item("old2", 1, "b"), Item("new1", 2, "c"), Item("old2", 2, "d"),
              Item("new2", 1, "e")]
    replay, live = qos.replayed(logged, [])
    assert replay == [Item("old2", 1, "b"), Item("new1", 2, "c"), Item("new2", 1, "e")]
    assert live == []
    for item in replay:  # the session writes them: positions follow the log's timestamps
        write(qos, item.msg_id, item.qos, {"b": 150, "c": 160, "e": 170}[item.tag])
    assert qos.positions[T] == 170
    assert qos.deliverable("new1", 2) is False


def test_replay_topics_never_moves_a_position_back():
    qos = window()
    write(qos, None, 0, 400)
    assert qos.replay_topics({T: 100}, [T]) == [T]
    assert qos.positions == {T: 400}
    assert qos.replay_topics({}, [T]) == [] and qos.replay_topics({T: 1}, []) == []


def test_live_messages_held_during_a_replay_are_sent_after_it_unless_replayed():
    qos = window()
    held = [Item("m1", 1, "live1"), Item(None, 0, "live2"), Item("m3", 2, "live3"), Item("m9", 1, "live4")]
    replay, live = qos.replayed([Item("m1", 1, "log1"), Item("m3", 2, "log3")], held)
    assert replay == [Item("m1", 1, "log1"), Item("m3", 2, "log3")]
    assert live == [Item(None, 0, "live2"), Item("m9", 1, "live4")]
    # a message without an id is never taken for one in the replay
    assert qos.replayed([Item(None, 1, "log")], held)[1] == held


def test_a_held_message_whose_replay_copy_was_left_out_is_kept():
    qos = window()
    qos.restore(["m3"])
    held = [Item("m3", 1, "live")]  # the live copy at QoS 1 (its subscription's QoS)
    replay, live = qos.replayed([Item("m3", 2, "log")], held)
    assert replay == [] and live == held
    replay, live = qos.replayed([], held)
    assert replay == [] and live == held and live is not held


def test_restore_keeps_order_and_does_not_duplicate():
    qos = window()
    write(qos, "q1", 2, 1)
    qos.restore(["q0", "q1", "q2"])
    assert list(qos.seen_qos2) == ["q1", "q0", "q2"]
    assert qos.deliverable("q2", 2) is False and qos.deliverable("q2", 1) is True
