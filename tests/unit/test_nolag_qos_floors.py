"""gateways/nolag/qos.py: nothing a client has not acked is skipped by a reconnect, and a client
that never acks is never sent anything twice."""

from __future__ import annotations

from gateways.nolag.qos import QosWindow

T = "chat/general/messages"
U = "chat/general/other"


def window(max_attempts: int = 3, max_unacked: int = 1000) -> QosWindow:
    return QosWindow(1.0, 1.0, max_attempts, max_unacked)


def write(qos: QosWindow, msg_id: str, qos_level: int, ts_ms: int, now: float = 0.0, topic: str = T,
          sent: bool = True) -> None:
    assert qos.deliverable(msg_id, qos_level)
    qos.delivered(topic, msg_id, qos_level, ts_ms, f"frame:{msg_id}".encode(), sent, now)


def resent(qos: QosWindow, now: float, taken: bool = True) -> list[bytes]:
    frames: list[bytes] = []
    qos.resend_due(now, lambda frame: frames.append(frame) or taken)
    return frames


def test_first_messages_before_the_first_ack_are_held_and_redelivered_once_it_acks():
    qos = window()
    write(qos, "m1", 1, 10)
    write(qos, "m2", 1, 20)
    assert resent(qos, 100.0) == []  # not yet known to ack: never twice
    assert qos.acked("m3") is True  # the first ack (of a later message)
    assert qos.acked("m4") is False
    assert resent(qos, 100.0) == [b"frame:m1", b"frame:m2"]
    assert qos.floors() == {T: 9} and qos.resume() == {T: 20}


def test_a_given_up_message_pins_the_floor_until_the_connection_ends():
    qos = window(max_attempts=2)
    qos.acked()
    write(qos, "m1", 1, 10)
    write(qos, "m2", 1, 20)
    assert resent(qos, 1.0) == [b"frame:m1", b"frame:m2"]
    assert resent(qos, 2.0) == []  # given up
    assert list(qos.unacked) == [] and qos.pinned == {T: 9}
    write(qos, "m3", 1, 30, now=2.0)
    qos.acked("m3")
    assert qos.floors() == {T: 9} and qos.resume() == {T: 30}
    qos.left(T)
    assert qos.pinned == {} and qos.floors() == {}


def test_eviction_pins_qos1_but_not_a_written_qos2():
    qos = window(max_unacked=1)
    write(qos, "q", 2, 5)
    write(qos, "m", 1, 6)  # evicts q: written once, never again, holds nothing
    assert qos.pinned == {}
    write(qos, "n", 1, 7)  # evicts m
    assert qos.pinned == {T: 5} and qos.floors() == {T: 5}


def test_an_unwritten_frame_is_written_when_due_even_without_acks_and_qos2_is_then_seen():
    qos = window()
    write(qos, "q", 2, 5, sent=False)
    assert qos.floors() == {} and qos.deliverable("q", 2) is False
    assert resent(qos, 0.5) == []  # not due yet
    assert resent(qos, 1.0, taken=False) == [b"frame:q"]  # the socket refused it again
    assert qos.unacked["q"].attempts == 0
    assert resent(qos, 2.0) == [b"frame:q"]
    assert qos.unacked["q"].attempts == 1 and "q" in qos.seen_qos2 and qos.positions == {T: 5}
    assert resent(qos, 100.0) == []  # written once: never again


def test_carried_floors_from_an_actor_that_had_not_shown_it_acks():
    qos = window()
    qos.carry({T: 10, U: 50}, {T: 40, U: 50})  # U: nothing was left unacked
    assert qos.carried == {T: (10, 40)}
    qos.joined(T, 40)
    qos.joined(U, 50)
    assert qos.floors() == {T: 10, U: 50}  # kept until replayed, across further reconnects
    qos.carried.pop(T)
    assert qos.floors() == {T: 40, U: 50}


def test_ids_being_recorded_are_not_delivered_twice_and_seen_ends_the_recording():
    qos = window()
    assert QosWindow.needs_record("q", 2) and not QosWindow.needs_record("m", 1)
    assert not QosWindow.needs_record(None, 2)
    qos.recording.add("q")
    assert qos.deliverable("q", 2) is False and qos.deliverable("q", 1) is True
    qos.seen("q")
    assert qos.recording == set() and qos.deliverable("q", 2) is False


def test_restore_takes_the_acks_flag():
    qos = window()
    qos.restore(["a"], acks=True)
    assert qos.acks_seen is True and list(qos.seen_qos2) == ["a"]
    assert qos.acked() is False  # not a first sign: already known
