"""NoLag's fan-out (``NolagSession.fan_out``): one message for a delivery group of connection ids,
in one loop over them — the frames each recipient gets, what its window tracks, what is accounted
and what counts as undeliverable. Plain objects: the gateway and the sockets are small fakes that
keep what they were given; the sessions and their windows are the real ones.
"""

from __future__ import annotations

import itertools
from collections import deque
from typing import Any

import msgpack
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gateways.nolag import codec
from gateways.nolag.config import NolagConfig
from gateways.nolag.qos import Unacked
from gateways.nolag.session import NolagDialect, NolagSession, _Item, _Subscription
from actors.nolag import contract as nolag
from gateways.server import frame_header
from router.contract import DELIVER_BINARY

TOPIC = "app/room/chat"
META = ("gw", 7, 0, "nolag", "Publish", TOPIC)


class Shards:
    """Nothing here reaches a shard."""

    def view(self, timeout_s: float) -> "Shards":
        return self


class Gateway:
    def __init__(self) -> None:
        self.shards = Shards()
        self.connections: dict[int, Any] = {}
        self.undeliverable = 0
        self.fanouts: list[tuple[int, list[int]]] = []  # (frame size, connection ids)
        self.failed: list[int] = []
        self.written: list[int] = []  # one at a time (a session's own write)

    def account_fanout(self, meta: tuple, nbytes: int, connection_ids: list[int]) -> None:
        assert meta is META
        self.fanouts.append((nbytes, list(connection_ids)))

    def account_written(self, written: list) -> None:  # what account_fanout of each item records
        for kind, frame, connection_ids, meta in written:
            assert kind == DELIVER_BINARY
            self.account_fanout(meta, len(frame), connection_ids)

    def account_delivery(self, meta: tuple, nbytes: int, connection_id: int, sent: bool) -> None:
        (self.written if sent else self.failed).append(connection_id)

    # what a frame from a client is accounted as: (kind, size, connection id[, reason])
    received: list[tuple]

    def event_meta(self, dialect: str, kind: str | None = None, topic: str | None = None) -> tuple:
        return ("gw", 1, 0, dialect, kind, topic)

    def accepted(self, meta: tuple, protocol_id: Any, nbytes: int, connection_id: int) -> None:
        self.__dict__.setdefault("received", []).append((meta[4], nbytes, connection_id))

    rows: list[int]  # how many frames each accepted_row took

    def accepted_row(self, dialect: str, kind: str, sizes: list[int], connection_id: int) -> None:
        assert dialect == "nolag" and sizes
        self.__dict__.setdefault("rows", []).append(len(sizes))
        for nbytes in sizes:
            self.__dict__.setdefault("received", []).append((kind, nbytes, connection_id))

    def rejected(self, meta: tuple, protocol_id: Any, nbytes: int, connection_id: int, reason: str) -> None:
        self.__dict__.setdefault("received", []).append((meta[4], nbytes, connection_id, reason))


class Wire:
    ids = itertools.count(1)

    def __init__(self, takes: bool = True) -> None:
        self.id = next(self.ids)
        self.remote, self.path, self.query, self.dropped, self.last_activity = "127.0.0.1", "/ws", "", 0, 0.0
        self.flushes = 0
        self.takes = takes  # False: a socket over its outbound limit
        self.frames: list[dict] = []
        self.session: Any = None

    def send_frame(self, frame: bytes, opcode: int, payload: bytes | None = None) -> bool:
        assert frame == frame_header(opcode, len(payload)) + payload  # the frame is the payload's
        if self.takes:
            self.frames.append(msgpack.unpackb(payload) if payload else b"")  # b"": a heartbeat
        return self.takes

    def send_binary(self, payload: bytes) -> bool:
        return self.send_frame(frame_header(0x2, len(payload)) + payload, 0x2, payload)

    open = True  # False: closed (by the session)

    def receiving(self) -> bool:
        return self.open

    def close(self, code: int = 1000, reason: str = "") -> None:
        self.open = False

    paused = False  # writing paused, under the limit: each frame is taken, but not joined ones
    joined = 0  # runs of frames written as one piece

    def takes_frames(self) -> bool:
        return self.takes and not self.paused

    def cork_frames(self, frames: bytes) -> None:
        assert self.takes_frames()
        self.joined += 1
        while frames:  # the frames as send_frame would have had them, one by one
            code = frames[1] & 0x7F
            start = 2 if code < 126 else 4 if code == 126 else 10
            size = code if code < 126 else int.from_bytes(frames[2:start], "big")
            frame, frames = frames[:start + size], frames[start + size:]
            assert frames or frame  # never an empty piece
            self.send_frame(frame, 0x2, frame[start:])


def connect(gateway: Gateway, dialect: NolagDialect, qos: int | None, takes: bool = True) -> NolagSession:
    """A connection whose session is subscribed to TOPIC at ``qos`` (None: not subscribed)."""
    wire = Wire(takes)
    session = dialect.new_session(wire, [])
    if qos is not None:
        session._put_subscription(_Subscription(TOPIC, qos, (), False, None))
    wire.session = session
    gateway.connections[wire.id] = wire
    return session


def message(msg_id: str | None, qos: int, ts_ms: int) -> tuple:
    return (TOPIC, msgpack.packb({"n": ts_ms}), msg_id, qos, None, ts_ms, "actor", META)


def test_one_loop_over_the_ids_gives_each_recipient_its_frame_and_counts_the_connections_gone():
    gateway = Gateway()
    dialect = NolagDialect(gateway, NolagConfig())
    plain = connect(gateway, dialect, 0)
    acking = connect(gateway, dialect, 1)
    other = connect(gateway, dialect, None)  # unsubscribed since the topic shard grouped it
    replaying = connect(gateway, dialect, 1)
    replaying.replaying = []  # a reconnect's replay in progress: live messages wait behind it
    replaying._relive()
    full = connect(gateway, dialect, 1, takes=False)
    closed = connect(gateway, dialect, 0)
    closed.release()
    bare = Wire()  # a connection not (or no longer) bound to a session
    gateway.connections[bare.id] = bare
    gone = 10_000  # closed and forgotten
    ids = tuple(s.wire.id for s in (plain, acking, other, replaying, full, closed)) + (bare.id, gone)

    plain.fan_out(message("m1", 1, 1_000), ids, gateway)

    assert plain.wire.frames == [{"type": "message", "topic": TOPIC, "data": {"n": 1_000}, "msgId": "m1",
                                  "timestamp": 1_000}]
    assert acking.wire.frames == [{"type": "message", "topic": TOPIC, "data": {"n": 1_000}, "msgId": "m1",
                                   "requiresAck": True, "timestamp": 1_000}]
    assert other.wire.frames == [] and closed.wire.frames == [] and full.wire.frames == []
    assert [item.msg_id for item in replaying.replaying] == ["m1"] and replaying.wire.frames == []
    # positions: where a reconnect replays from
    assert plain.positions_now() == {TOPIC: 1_000} and acking.positions_now() == {TOPIC: 1_000}
    assert full.positions_now() == {}
    # the QoS 1 recipients wait for the ack; the one whose socket did not take it is written later
    assert list(acking.qos.unacked) == ["m1"] and acking.qos.unacked["m1"].attempts == 1
    assert list(full.qos.unacked) == ["m1"] and full.qos.unacked["m1"].attempts == 0
    assert list(full.qos.unwritten) == ["m1"]
    assert plain.qos.unacked == {}
    # one accounting group per frame; the refused write apart; the two gone as undeliverable
    plain_size = len(msgpack.packb(plain.wire.frames[0]))
    acked_size = len(msgpack.packb(acking.wire.frames[0]))
    assert sorted(gateway.fanouts) == sorted([(plain_size, [plain.wire.id]), (acked_size, [acking.wire.id])])
    assert gateway.failed == [full.wire.id]
    assert gateway.undeliverable == 2

    # the same message again: out and waiting for its ack, so not written twice
    plain.fan_out(message("m1", 1, 1_000), (acking.wire.id,), gateway)
    assert len(acking.wire.frames) == 1


def test_a_qos0_message_or_one_without_id_is_plain_for_everyone_and_qos2_waits_for_its_record():
    gateway = Gateway()
    dialect = NolagDialect(gateway, NolagConfig())
    sessions = [connect(gateway, dialect, qos) for qos in (0, 1, 2)]
    ids = tuple(s.wire.id for s in sessions)
    full = connect(gateway, dialect, 0, takes=False)
    gated = connect(gateway, dialect, 1)
    gated.gated.append(b"a frame behind a QoS 2 message being recorded")
    gated._relive()

    sessions[0].fan_out(message(None, 0, 5), ids + (full.wire.id, gated.wire.id), gateway)
    sessions[0].fan_out(message(None, 2, 6), ids, gateway)  # not logged: no id, nothing to ack
    for session in sessions:
        assert [f.get("requiresAck", False) for f in session.wire.frames] == [False, False]
        assert session.qos.unacked == {} and session.positions_now() == {TOPIC: 6}
    assert [size for size, _ in gateway.fanouts] == [gateway.fanouts[0][0]] * 2
    assert gateway.failed == [full.wire.id] and full.positions_now() == {}  # refused: not written
    assert gated.wire.frames == [] and [getattr(i, "ts_ms", None) for i in gated.gated] == [None, 5]

    gateway.fanouts.clear()
    for session in sessions:
        session.wire.frames.clear()
    sessions[2].recording = True  # a record out already: this one queues behind it, gated
    sessions[0].fan_out(message("q2", 2, 7), ids, gateway)
    assert [f.get("requiresAck", False) for f in sessions[0].wire.frames] == [False]
    assert [f.get("requiresAck", False) for f in sessions[1].wire.frames] == [True]
    assert sessions[2].wire.frames == []  # QoS 2: recorded with its session shard before its write
    assert [item.msg_id for item in sessions[2].gated] == ["q2"]
    assert sessions[2].to_record == [("q2", TOPIC, 7)]
    # the live loop writes the QoS 1 recipients first; the QoS 0 one is written after it
    assert [ids_ for _, ids_ in gateway.fanouts] == [[sessions[1].wire.id], [sessions[0].wire.id]]


def test_a_message_nobody_acks_goes_straight_to_the_live_sessions_and_the_rest_are_checked_in_full():
    gateway = Gateway()
    dialect = NolagDialect(gateway, NolagConfig())
    plain, acking = connect(gateway, dialect, 0), connect(gateway, dialect, 1)
    other = connect(gateway, dialect, None)
    replaying = connect(gateway, dialect, 0)
    replaying.replaying = []
    replaying._relive()
    gated = connect(gateway, dialect, 0)
    gated.gated.append(b"a frame behind a QoS 2 message being recorded")
    gated._relive()
    full = connect(gateway, dialect, 0, takes=False)
    closed = connect(gateway, dialect, 0)
    closed.release()
    bare = Wire()
    gateway.connections[bare.id] = bare
    ids = tuple(s.wire.id for s in (plain, other, replaying, full, acking, gated, closed)) + (bare.id, 10_000)

    plain.fan_out(message(None, 0, 40), ids, gateway)

    expected = {"type": "message", "topic": TOPIC, "data": {"n": 40}, "timestamp": 40}
    assert plain.wire.frames == [expected] and acking.wire.frames == [expected]
    assert plain.positions_now() == acking.positions_now() == {TOPIC: 40}
    assert other.wire.frames == full.wire.frames == closed.wire.frames == []
    assert full.positions_now() == {} and full.qos.unacked == {}
    assert [item.ts_ms for item in replaying.replaying] == [40] and replaying.wire.frames == []
    assert [getattr(entry, "ts_ms", None) for entry in gated.gated] == [None, 40] and gated.wire.frames == []
    # the live ones in one group, in the group's order; the refused one apart; bare and gone undeliverable
    assert gateway.fanouts == [(len(msgpack.packb(expected)), [plain.wire.id, acking.wire.id])]
    assert gateway.failed == [full.wire.id]
    assert gateway.undeliverable == 2


def test_live_follows_a_gated_write_a_replay_and_the_close_and_keeps_their_order():
    gateway = Gateway()
    dialect = NolagDialect(gateway, NolagConfig())
    session = connect(gateway, dialect, 2)
    ids = (session.wire.id,)
    assert session.live is session.subs and dialect.live_subs[TOPIC][session.wire.id] is session.subs[TOPIC]

    # a QoS 2 message waits for its record, and a plain one behind it waits too
    session.recording = True  # a record is out already: this one queues behind it
    session._deliver(_Item(TOPIC, msgpack.packb({"n": 1}), "q1", 2, None, 1, META, False))
    assert session.live == {} and session.live is not session.subs
    session.fan_out(message(None, 0, 2), ids, gateway)
    assert session.wire.frames == []
    session.qos.recording.clear()  # recorded
    session._release()
    assert [frame["timestamp"] for frame in session.wire.frames] == [1, 2]
    assert session.live is session.subs
    session.fan_out(message(None, 0, 3), ids, gateway)
    assert [frame["timestamp"] for frame in session.wire.frames] == [1, 2, 3]

    # a replay holds live messages until it has been sent
    session.replaying = []
    session._relive()
    session.fan_out(message(None, 0, 4), ids, gateway)
    assert len(session.wire.frames) == 3
    session._end_replay([])
    assert [frame["timestamp"] for frame in session.wire.frames] == [1, 2, 3, 4]
    assert session.live is session.subs and session.positions_now() == {TOPIC: 4}

    # closed: nothing more, and the dialect forgets it
    session.release()
    assert session.live == {} and TOPIC not in dialect.live_subs and dialect.gated_ids == set()
    session.fan_out(message(None, 0, 5), ids, gateway)
    assert len(session.wire.frames) == 4


def test_the_live_loops_positions_reach_the_checkpoint_and_outlive_a_new_subscription_to_the_topic():
    gateway = Gateway()
    dialect = NolagDialect(gateway, NolagConfig())
    session = connect(gateway, dialect, 0)
    told: list[tuple] = []
    session._ask_session = lambda command, on_result: told.append(command)
    session._ask = lambda *args, **kwargs: None  # nothing reaches a shard

    session.fan_out(message(None, 0, 40), (session.wire.id,), gateway)
    session.fan_out(message(None, 0, 41), (session.wire.id,), gateway)
    session._checkpoint()
    assert told[-1][2:] == ({TOPIC: 41}, {TOPIC: 41}, False)  # (resume, floors, acks)

    # subscribed again (another QoS): the new subscription starts where the old one was
    session.fan_out(message(None, 0, 42), (session.wire.id,), gateway)
    session._add_subscription(_Subscription(TOPIC, 1, (), False, None), None)
    assert session.subs[TOPIC].position == 42
    session.fan_out(message(None, 0, 39), (session.wire.id,), gateway)  # never moves back
    assert session.positions_now() == {TOPIC: 42}


def test_the_acked_live_loop_tracks_as_the_window_does_and_a_full_window_lets_its_oldest_go():
    gateway = Gateway()
    dialect = NolagDialect(gateway, NolagConfig(max_unacked=2, ack_timeout_s=5))
    first, second = connect(gateway, dialect, 1), connect(gateway, dialect, 2)  # QoS 1 messages: acked at 1
    ids = (first.wire.id, second.wire.id)

    first.fan_out(message("m1", 1, 10), ids, gateway)
    entry = first.qos.unacked["m1"]
    assert second.qos.unacked["m1"] is entry  # one entry for every window that took the frame
    assert (entry.attempts, entry.qos, entry.ts_ms, entry.topic) == (1, 1, 10, TOPIC)
    assert first.qos.next_due == second.qos.next_due == entry.due
    first.fan_out(message("m2", 1, 11), ids, gateway)
    first.fan_out(message("m3", 1, 12), ids, gateway)
    for session in (first, second):
        assert list(session.qos.unacked) == ["m2", "m3"]  # at most max_unacked: m1 left, pinned
        assert session.qos.pinned == {TOPIC: 9}
        assert session.positions_now() == {TOPIC: 12}
        assert [frame["msgId"] for frame in session.wire.frames] == ["m1", "m2", "m3"]
    assert [ids_ for _, ids_ in gateway.fanouts] == [list(ids)] * 3


def test_a_reconnects_restore_holds_live_messages_until_its_replay_is_sent():
    gateway = Gateway()
    dialect = NolagDialect(gateway, NolagConfig())
    session = connect(gateway, dialect, None)
    answers: list[Any] = []
    replays: list[dict] = []
    session._ask = lambda key, command, on_result, failures=False: answers.append(on_result)
    session._replay = replays.append  # the logged messages are asked for: answered below

    # the actor's kept state: subscribed at QoS 0, its last message at 30
    session._restore(2, ({TOPIC: (0, [], False, None)}, {TOPIC: 30}, {}, [], False))
    assert session.live == {} and session.live is not session.subs
    session.fan_out(message(None, 0, 35), (session.wire.id,), gateway)  # live, during the restore
    assert session.wire.frames == []
    for answered in [answer for answer in answers if answer is not None]:
        answered(33)  # the subscribe's answer: the topic's position
    assert replays == [{TOPIC: 30}] and session.live == {}
    session._end_replay([])
    assert [frame.get("timestamp") for frame in session.wire.frames if frame.get("type") == "message"] == [35]
    assert session.live is session.subs and session.positions_now() == {TOPIC: 35}


class _Shards(Shards):
    """Records what is sent; every key maps to one link."""

    def __init__(self) -> None:
        self.sent: list[tuple] = []
        self.the_link = object()

    def link(self, kind: str, key: str) -> object:
        return self.the_link

    def all(self, kind: str) -> list:
        return []

    def send(self, link: object, command: tuple, on_result: Any = None, timeout_s: Any = None) -> None:
        self.sent.append(command)


def test_the_live_positions_reach_a_restarted_shard_and_the_last_checkpoint():
    gateway = Gateway()
    dialect = NolagDialect(gateway, NolagConfig())
    session = connect(gateway, dialect, 0)
    shards = session.shards = _Shards()
    session.key, session.actor = "a key", "actor-1"
    session.fan_out(message(None, 0, 50), (session.wire.id,), gateway)

    session.reannounce(shards.the_link)
    positions = [command[-1] for command in shards.sent if command[0] == nolag.Op.ACTOR_SAVE]
    assert positions == [50]  # the subscription's record with its position
    assert any(command[0] == nolag.Op.SUBSCRIBE and command[-1] == 50 for command in shards.sent)

    session.fan_out(message(None, 0, 51), (session.wire.id,), gateway)
    shards.sent.clear()
    session.release()
    checkpoints = [command for command in shards.sent if command[0] == nolag.Op.ACTOR_CHECKPOINT]
    assert checkpoints and checkpoints[-1][2] == {TOPIC: 51}


# -- the dialect's index of live subscriptions ----------------------------------------------------

TOPICS = (TOPIC, "app/room/other")


def derived_index(dialect: NolagDialect, sessions: list[NolagSession]) -> dict[str, dict[int, _Subscription]]:
    """What ``live_subs`` must hold: every subscription of every open session not replaying."""
    index: dict[str, dict[int, _Subscription]] = {}
    for session in sessions:
        if not session.closed and session.replaying is None:
            for topic, sub in session.subs.items():
                index.setdefault(topic, {})[session.wire.id] = sub
    return index


def live_ids(sessions: list[NolagSession], topic: str) -> set[int]:
    """The connections a fan-out on ``topic`` writes in its loop: open, subscribed, not replaying,
    nothing gated."""
    return {session.wire.id for session in sessions
            if not session.closed and session.replaying is None and not session.gated and topic in session.subs}


@settings(max_examples=300, deadline=None)
@example([("subscribe", 0, TOPIC, 0), ("unsubscribe", 0, TOPIC, 0)])
@example([("subscribe", 0, TOPIC, 1), ("replay", 0, TOPIC, 0), ("subscribe", 0, TOPICS[1], 0),
          ("unsubscribe", 0, TOPIC, 0), ("replayed", 0, TOPIC, 0)])
@example([("subscribe", 1, TOPIC, 2), ("gate", 1, TOPIC, 0), ("subscribe", 1, TOPICS[1], 0),
          ("recorded", 1, TOPIC, 0), ("gate", 1, TOPIC, 0), ("release", 1, TOPIC, 0)])
@given(st.lists(st.tuples(st.sampled_from(["subscribe", "unsubscribe", "replay", "replayed", "gate", "recorded",
                                           "release"]),
                          st.integers(0, 2), st.sampled_from(TOPICS), st.integers(0, 2)), max_size=30))
def test_the_index_of_live_subscriptions_is_always_what_the_sessions_hold(steps: list[tuple[str, int, str, int]]):
    """Subscriptions made, replaced and dropped while sessions replay, wait for a record and
    close, in any order: after every step the index is the live sessions' subscriptions, each the
    session's own object, and a fan-out writes to exactly those of its topic."""
    gateway = Gateway()
    dialect = NolagDialect(gateway, NolagConfig())
    sessions = [connect(gateway, dialect, None) for _ in range(3)]
    for session in sessions:
        session._ask = lambda *args, **kwargs: None  # nothing reaches a shard
        session._ask_session = lambda command, on_result: None
        session.recording = True  # a record is out: a QoS 2 message waits until "recorded"
    ts = itertools.count(1)
    for step, (what, which, topic, qos) in enumerate(steps):
        session = sessions[which]
        if what == "subscribe" and not session.closed:
            session._add_subscription(_Subscription(topic, qos, (), False, None), None)
        elif what == "unsubscribe" and topic in session.subs and not session.closed:
            session._drop_subscription(topic)
        elif what == "replay" and not session.closed and session.replaying is None:
            session.replaying = []
            session._relive()
        elif what == "replayed" and session.replaying is not None:
            session._end_replay([])
        elif what == "gate" and not session.closed and TOPIC in session.subs:
            session._deliver(_Item(TOPIC, msgpack.packb({}), f"q{step}", 2, None, next(ts), META, False))
        elif what == "recorded" and session.gated:
            session.qos.recording.clear()
            session._release()
        elif what == "release":
            session.release()
        assert dialect.live_subs == derived_index(dialect, sessions)
        assert dialect.gated_ids == {session.wire.id for session in sessions if session.gated and not session.closed}
        for topic_subs in dialect.live_subs.values():
            for connection_id, sub in topic_subs.items():
                assert sub.wire.id == connection_id and sub.session.subs[sub.topic] is sub
    for topic, qos in itertools.product(TOPICS, (0, 1)):
        msg_id = None if qos == 0 else f"m-{topic}"  # a new id: not out already anywhere
        before = {session.wire.id: len(session.wire.frames) for session in sessions}
        gated_before = {session.wire.id: len(session.gated) for session in sessions}
        live = live_ids(sessions, topic)
        sessions[0].fan_out((topic, msgpack.packb({}), msg_id, qos, None, next(ts), "actor", META),
                            tuple(session.wire.id for session in sessions), gateway)
        written = {session.wire.id for session in sessions if len(session.wire.frames) > before[session.wire.id]}
        held = {session.wire.id for session in sessions if len(session.gated) > gated_before[session.wire.id]}
        assert written == live  # written at once: exactly the live ones
        # a subscribed session with a gated write in progress holds it behind the gated ones
        assert held == {session.wire.id for session in sessions
                        if session.gated and not session.closed and topic in session.subs
                        and session.replaying is None}


def test_a_connection_the_fan_out_writes_to_gets_no_heartbeat_and_one_written_to_by_nobody_does():
    """The live loops do not stamp the session's ``last_sent``: a tick sees the connection's writes
    (``flushes``) instead, so the heartbeat goes only after ``heartbeat_interval_s`` of nothing."""
    gateway = Gateway()
    dialect = NolagDialect(gateway, NolagConfig(heartbeat_interval_s=30))
    session = connect(gateway, dialect, 0)
    session.key = object()  # authenticated
    session._ask_session = lambda command, on_result: None  # its checkpoints reach no shard
    t0 = session.last_sent
    heartbeats = lambda: session.wire.frames.count(b"")  # noqa: E731

    session.fan_out(message(None, 0, 1), (session.wire.id,), gateway)
    session.wire.flushes += 1  # the server wrote the turn's frames
    session.wire.last_activity = t0 + 100  # the client is alive
    session.on_tick(t0 + 25)  # the write seen here
    session.on_tick(t0 + 50)
    assert heartbeats() == 0 and len(session.wire.frames) == 1
    session.on_tick(t0 + 56)  # 31 s after the tick that saw the write
    assert heartbeats() == 1
    session.wire.flushes += 1  # the heartbeat's own write
    session.on_tick(t0 + 57)
    session.on_tick(t0 + 86)
    assert heartbeats() == 1
    session.on_tick(t0 + 88)
    assert heartbeats() == 2


def test_a_qos2_gate_leaves_the_index_alone_whatever_the_sessions_subscriptions(monkeypatch):
    """A QoS 2 message gates its session's writes until it is recorded, once per message: that
    is one set operation, not a walk over the session's (up to 1,000) subscriptions each way."""
    import gateways.nolag.session as module

    gateway = Gateway()
    dialect = NolagDialect(gateway, NolagConfig())
    session = connect(gateway, dialect, 2)
    for n in range(999):
        session._put_subscription(_Subscription(f"app/room/t{n}", 0, (), False, None))
    session.recording = True  # a record is out: the QoS 2 message waits behind it
    walked: list[str] = []
    monkeypatch.setattr(module, "_index", lambda index, topic, *rest: walked.append(topic))
    monkeypatch.setattr(module, "_unindex", lambda index, topic, *rest: walked.append(topic))

    session._deliver(_Item(TOPIC, msgpack.packb({}), "q1", 2, None, 1, META, False))
    assert dialect.gated_ids == {session.wire.id} and session.live == {}
    session.qos.recording.clear()
    session._release()
    assert dialect.gated_ids == set() and session.live is session.subs
    assert walked == [] and len(dialect.live_subs) == 1_000
    assert [frame["msgId"] for frame in session.wire.frames] == ["q1"]


# -- a run of messages to one group (fan_out_run) ------------------------------------------------

def test_a_run_of_messages_to_live_recipients_is_one_piece_each_with_every_entry_in_the_windows():
    gateway = Gateway()
    dialect = NolagDialect(gateway, NolagConfig(ack_timeout_s=5))
    sessions = [connect(gateway, dialect, qos) for qos in (1, 2, 1)]
    ids = tuple(session.wire.id for session in sessions)
    run = [message(f"m{n}", 1, 10 + n) for n in range(3)]

    sessions[0].fan_out_run(run, ids, gateway)

    for session in sessions:
        assert session.wire.joined == 1  # the three frames in one piece
        assert session.wire.frames == [{"type": "message", "topic": TOPIC, "data": {"n": 10 + n}, "msgId": f"m{n}",
                                        "requiresAck": True, "timestamp": 10 + n} for n in range(3)]
        assert list(session.qos.outstanding()) == ["m0", "m1", "m2"] and session.qos.size() == 3
        assert session.qos.unacked == {}  # one run, shared by the windows
        assert [(held, acked) for held, acked in session.qos.runs] == [(sessions[0].qos.runs[0][0], 0)]
        assert session.positions_now() == {TOPIC: 12}
        assert session.qos.next_due == session.qos.outstanding()["m0"].due
    for msg_id in ("m0", "m1", "m2"):  # one entry per message, shared by every window
        entry = sessions[0].qos.outstanding()[msg_id]
        assert all(session.qos.outstanding()[msg_id] is entry for session in sessions)
        assert (entry.attempts, entry.qos, entry.topic) == (1, 1, TOPIC)
    assert [ids_ for _, ids_ in gateway.fanouts] == [list(ids)] * 3  # one group per message

    # plain messages too
    plain = [message(None, 0, 20 + n) for n in range(2)]
    sessions[0].fan_out_run(plain, ids, gateway)
    assert all(session.wire.joined == 2 and len(session.wire.frames) == 5 for session in sessions)


def _world(specs: list[str], max_unacked: int, out: list[str]) -> tuple[Gateway, list[NolagSession], tuple]:
    gateway = Gateway()
    dialect = NolagDialect(gateway, NolagConfig(max_unacked=max_unacked, ack_timeout_s=5))
    sessions, ids = [], []
    for spec in specs:
        if spec in ("gone", "bare"):
            if spec == "bare":
                bare = Wire()
                gateway.connections[bare.id] = bare
                ids.append(bare.id)
            else:
                ids.append(99_999)
            continue
        qos = {"qos0": 0, "qos2": 2, "unsubscribed": None}.get(spec, 1)
        session = connect(gateway, dialect, qos, takes=spec != "full")
        session._ask = lambda *args, **kwargs: None  # nothing reaches a shard
        session._ask_session = lambda command, on_result: None
        session.recording = True  # a QoS 2 message waits for its record
        session.wire.paused = spec == "paused"
        for n, msg_id in enumerate(out):  # out already, waiting for their acks
            session.qos.track(msg_id, Unacked(b"x", n, 1, 1e12, 1, TOPIC))
        if spec == "replaying":
            session.replaying = []
            session._relive()
        elif spec == "gated":
            session.gated.append(b"a frame behind a QoS 2 message being recorded")
            session._relive()
        elif spec == "closed":
            session.release()
        sessions.append(session)
        ids.append(session.wire.id)
    return gateway, sessions, tuple(ids)


def _seen(gateway: Gateway, sessions: list[NolagSession]) -> tuple:
    """What a fan-out leaves, without the connection ids (each world numbers its own) or the due times."""
    number = {session.wire.id: n for n, session in enumerate(sessions)}
    windows = [([(k, e.frame, e.ts_ms, e.attempts, e.qos, e.topic) for k, e in s.qos.outstanding().items()],
                list(s.qos.unwritten), dict(s.qos.pinned)) for s in sessions]
    return ([s.wire.frames for s in sessions], windows, [s.positions_now() for s in sessions],
            [len(s.gated) for s in sessions], [len(s.replaying or ()) for s in sessions],
            [(size, [number.get(i, -1) for i in ids_]) for size, ids_ in gateway.fanouts],
            [number.get(i, -1) for i in gateway.failed], gateway.undeliverable)


SPECS = ["qos0", "qos1", "qos2", "unsubscribed", "replaying", "gated", "full", "paused", "closed", "bare", "gone"]


@settings(max_examples=300, deadline=None)
@example(["qos1", "qos1"], [("a", 1), ("b", 1)], 100, [])
@example(["qos1", "qos1"], [("a", 1), ("a", 1)], 100, [])  # an id twice in the run
@example(["qos1", "qos2"], [("a", 1), ("b", 1)], 100, ["b"])  # out already
@example(["qos1"], [("a", 1), ("b", 1), ("c", 1)], 2, [])  # no room for the run
@example(["qos0", "qos1"], [(None, 0), (None, 0)], 100, [])
@example(["qos1", "paused"], [(None, 0), (None, 0)], 100, [])
@example(["qos0", "qos1", "qos0"], [(None, 0), (None, 0)], 100, [])
@given(st.lists(st.sampled_from(SPECS), min_size=1, max_size=6),
       st.lists(st.tuples(st.sampled_from([None, "a", "b", "c", "d"]), st.sampled_from([0, 1, 2])),
                min_size=2, max_size=5),
       st.sampled_from([2, 4, 100]), st.lists(st.sampled_from(["a", "b", "x"]), max_size=2, unique=True))
def test_a_run_leaves_what_each_message_fanned_out_in_turn_leaves(specs: list[str], run: list[tuple], max_unacked: int,
                                                                  out: list[str]):
    """The same worlds, one given the run at once, the other its messages one at a time: the
    same frames on every socket, in order, the same windows, positions, held messages and
    accounting, whether the run went as one piece or not."""
    _same_as_one_at_a_time(specs, run, max_unacked, out, twice=False)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from(["qos0", "qos1", "qos2"]), min_size=1, max_size=3),
       st.lists(st.tuples(st.sampled_from([None, "a", "b"]), st.sampled_from([0, 1])), min_size=2, max_size=4))
@example(["qos1"], [("a", 1), ("b", 1)])
@example(["qos0", "qos0"], [(None, 0), (None, 0)])
def test_a_run_to_a_group_holding_a_recipient_twice_leaves_what_one_at_a_time_leaves(specs: list[str],
                                                                                   run: list[tuple]):
    """Message by message, a recipient in the group twice gets each message twice in a row."""
    _same_as_one_at_a_time(specs, run, 100, [], twice=True)


def _same_as_one_at_a_time(specs: list[str], run: list[tuple], max_unacked: int, out: list[str], twice: bool) -> None:
    payloads = [message(msg_id, qos, 100 + n) for n, (msg_id, qos) in enumerate(run)]
    at_once, one_by_one = _world(specs, max_unacked, out), _world(specs, max_unacked, out)
    if twice:  # the first recipient in the group twice
        at_once, one_by_one = [(g, s, ids[:1] + ids) for g, s, ids in (at_once, one_by_one)]
    gateway, sessions, ids = at_once
    if not sessions:
        return
    sessions[0].fan_out_run(payloads, ids, gateway)
    gateway, sessions, ids = one_by_one
    for payload in payloads:
        sessions[0].fan_out(payload, ids, gateway)
    assert _seen(*at_once[:2]) == _seen(*one_by_one[:2])
    clean = (all(spec in ("qos1", "qos2") for spec in specs) and not out
             and all(qos == 1 and msg_id for msg_id, qos in run) and len({m for m, _ in run}) == len(run)
             and len(run) <= max_unacked)
    if twice:  # a recipient twice: message by message
        assert all(session.wire.joined == 0 for session in at_once[1])
    elif clean:  # nothing stood in the way: one piece each
        assert all(session.wire.joined == 1 for session in at_once[1])



# -- runs in the windows: acked as bytes, in order ------------------------------------------------

UUIDS = [f"0192d6c4-0000-7000-8000-{n:012x}" for n in range(6)]


def _acking(gateway: Gateway, dialect: NolagDialect) -> NolagSession:
    session = connect(gateway, dialect, 1)
    session.key = object()  # authenticated
    session._ask_session = lambda command, on_result: None  # its checkpoints reach no shard
    session.qos.acks_seen = True  # it has acked before
    return session


def test_a_batch_ack_of_a_runs_next_ids_in_order_is_read_as_bytes_and_anything_else_decoded():
    gateway = Gateway()
    dialect = NolagDialect(gateway, NolagConfig(ack_timeout_s=5))
    first, second = _acking(gateway, dialect), _acking(gateway, dialect)
    ids = (first.wire.id, second.wire.id)
    first.fan_out_run([message(msg_id, 1, 10 + n) for n, msg_id in enumerate(UUIDS[:3])], ids, gateway)
    run = first.qos.runs[0][0]
    assert [held for held, _ in second.qos.runs] == [run] and second.qos.unacked == {}

    ack = msgpack.packb({"type": "batchAck", "msgIds": UUIDS[:2]})
    decode = codec.decode
    codec.decode = None  # read as bytes: not decoded
    try:
        first.on_message(ack, False)
    finally:
        codec.decode = decode
    assert [(held, acked) for held, acked in first.qos.runs] == [(run, 2)] and dialect.acked_as_bytes == 1
    assert [(held, acked) for held, acked in second.qos.runs] == [(run, 0)]  # one window's count each
    assert gateway.received == [("BatchAck", len(ack), first.wire.id)]

    first.on_message(msgpack.packb({"type": "batchAck", "msgIds": [UUIDS[2], UUIDS[2]]}), False)  # 2 > 1 out: decoded
    assert first.qos.runs == deque() and first.qos.size() == 0
    second.on_message(msgpack.packb({"type": "batchAck", "msgIds": [UUIDS[1]]}), False)  # out of order: decoded
    assert second.qos.runs == deque() and list(second.qos.unacked) == [UUIDS[0], UUIDS[2]]

    first.fan_out_run([message(msg_id, 1, 20 + n) for n, msg_id in enumerate(UUIDS[3:])], ids, gateway)
    bad = msgpack.packb({"type": "batchAck", "msgIds": [UUIDS[3], 7]})  # the shape read as bytes, an int in it
    first.on_message(bad, False)
    assert first.wire.frames[-1]["type"] == "error" and first.wire.frames[-1]["error"] == "invalid_message"
    assert gateway.received[-1] == (None, len(bad), first.wire.id, "invalid_message")  # refused undecoded
    assert list(first.qos.outstanding()) == UUIDS[3:]  # nothing acked


def test_a_run_with_an_id_a_window_holds_in_an_earlier_run_goes_message_by_message():
    gateway = Gateway()
    dialect = NolagDialect(gateway, NolagConfig(ack_timeout_s=5))
    sessions = [_acking(gateway, dialect) for _ in range(2)]
    ids = tuple(session.wire.id for session in sessions)
    sessions[0].fan_out_run([message(msg_id, 1, 10 + n) for n, msg_id in enumerate(UUIDS[:2])], ids, gateway)
    sessions[0].fan_out_run([message(msg_id, 1, 12 + n) for n, msg_id in enumerate(UUIDS[1:4])], ids, gateway)
    for session in sessions:
        assert session.wire.joined == 1  # the second run went message by message
        assert [frame["msgId"] for frame in session.wire.frames] == UUIDS[:4]  # UUIDS[1] once: out already
        assert list(session.qos.outstanding()) == UUIDS[:4] and not session.qos.runs  # moved on the first track
    sessions[0].fan_out(message(UUIDS[4], 1, 20), ids, gateway)  # the live loop after: newest last
    assert all(list(session.qos.unacked) == UUIDS[:5] for session in sessions)


# -- a read's frames in a row (on_binaries) --------------------------------------------------------

def _acked_world() -> tuple[Gateway, NolagDialect, NolagSession]:
    """A gateway and one acking session that was written two runs of UUIDS[:3] and UUIDS[3:]
    (frames over 256 + 4,096 bytes are too large)."""
    gateway = Gateway()
    dialect = NolagDialect(gateway, NolagConfig(ack_timeout_s=5, max_message_bytes=256))
    session, other = _acking(gateway, dialect), _acking(gateway, dialect)
    ids = (session.wire.id, other.wire.id)
    session.fan_out_run([message(msg_id, 1, 10 + n) for n, msg_id in enumerate(UUIDS[:3])], ids, gateway)
    session.fan_out_run([message(msg_id, 1, 20 + n) for n, msg_id in enumerate(UUIDS[3:])], ids, gateway)
    gateway.received = []
    return gateway, dialect, session


def _state(gateway: Gateway, dialect: NolagDialect, session: NolagSession) -> tuple:
    window = session.qos
    received = [(kind, size, connection == session.wire.id, *rest)  # each world's ids are its own
                for kind, size, connection, *rest in gateway.__dict__.get("received", [])]
    return (list(window.outstanding()), [(run.ids, acked) for run, acked in window.runs], list(window.unacked),
            received, session.wire.frames, dialect.acked_as_bytes, window.acks_seen)


def _batch_ack(ids: list) -> bytes:
    return msgpack.packb({"type": "batchAck", "msgIds": ids})


def test_a_reads_batch_acks_in_a_row_are_acked_and_logged_together_and_the_rest_in_their_place():
    frames = [_batch_ack(UUIDS[:2]), _batch_ack(UUIDS[2:4]), msgpack.packb({"type": "ack", "msgId": UUIDS[4]}),
              b"", _batch_ack(UUIDS[5:])]
    gateway, dialect, session = _acked_world()
    session.on_binaries(frames)
    assert gateway.rows == [2, 1]  # the single ack (decoded) and the heartbeat go in their place
    assert list(session.qos.outstanding()) == [] and dialect.acked_as_bytes == 3
    assert gateway.received == [("BatchAck", len(frames[0]), session.wire.id),
                                ("BatchAck", len(frames[1]), session.wire.id),
                                ("Ack", len(frames[2]), session.wire.id),
                                ("BatchAck", len(frames[4]), session.wire.id)]
    one_by_one = _acked_world()
    for data in frames:
        one_by_one[2].on_message(data, False)
    assert _state(*one_by_one) == _state(gateway, dialect, session)


def test_after_a_frame_that_closed_the_connection_the_rest_of_the_row_is_dropped():
    gateway, dialect, session = _acked_world()
    session.qos.runs.clear()  # nothing read as bytes: each frame goes through _receive
    handled = []
    receive = session._receive

    def closing(data: bytes) -> None:
        handled.append(data)
        receive(data)
        session.wire.close(1008, "bye")

    session._receive = closing
    session.on_binaries([b"", b"", b""])
    assert handled == [b""]


FRAMES = st.one_of(
    st.tuples(st.integers(0, 6), st.integers(0, 6)).map(lambda span: _batch_ack(UUIDS[span[0]:span[1]])),
    st.lists(st.sampled_from(UUIDS), min_size=1, max_size=4).map(_batch_ack),
    st.sampled_from(UUIDS).map(lambda msg_id: msgpack.packb({"type": "ack", "msgId": msg_id})),
    st.just(b""), st.just(b"\xc1"), st.just(_batch_ack(["not-an-id", 7])),
    st.just(_batch_ack(UUIDS[:1] * 120)),  # the shape read as bytes, too large (4,575 bytes)
)


@settings(max_examples=300, deadline=None)
@given(st.lists(FRAMES, max_size=8), st.sampled_from(["acking", "unauthenticated", "waiting", "closed"]))
@example([_batch_ack(UUIDS[:1]), _batch_ack(UUIDS[1:3]), _batch_ack(UUIDS[3:6])], "acking")
@example([_batch_ack(UUIDS[:2]), _batch_ack(UUIDS[:2]), _batch_ack(UUIDS[2:4])], "acking")
@example([_batch_ack(UUIDS[:1]), _batch_ack(UUIDS[:1] * 120), _batch_ack(UUIDS[1:2])], "acking")
def test_a_row_of_frames_leaves_what_each_frame_in_turn_leaves(frames: list[bytes], state: str):
    """Whatever the session's state: a frame that waits for the key store (and every one after
    it) keeps its place in the queue; an unauthenticated or closed session's frames are refused
    or dropped as one by one."""
    worlds = _acked_world(), _acked_world()
    for _, _, session in worlds:
        if state == "unauthenticated":
            session.key = None
        elif state == "waiting":
            session.waiting = deque([(b"", None)])
        elif state == "closed":
            session.closed = True  # released (what it gives back to shards is not looked at here)
    rows, one_by_one = worlds
    rows[2].on_binaries(frames)
    for data in frames:
        one_by_one[2].on_message(data, False)
    assert _state(*rows) == _state(*one_by_one)
    if state == "waiting":
        assert [data for data, _ in rows[2].waiting] == [data for data, _ in one_by_one[2].waiting] == [b"", *frames]
