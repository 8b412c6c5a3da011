"""NoLag: one connection's QoS window — what waits for an ack, what is sent again, where to replay from.

Plain class: no Ray, no sockets, no clock (``now`` is passed in). The session writes the frames
and asks :class:`QosWindow` what to write; the window never builds or sends a frame itself, it
keeps the ones it may have to send again.

- A QoS 1/2 message with a ``msgId`` is written with ``requiresAck`` and waits in ``unacked``
  (oldest first, at most ``max_unacked``: the oldest is dropped beyond) until its ack.
- Acknowledgements are opt-in: redelivery starts once the connection has acked once. A QoS 1
  message is sent again ``ack_timeout_s`` after it was written, then ``ack_backoff`` times
  longer each time, ``max_attempts`` sends in all; then it is given up (it stays in the log for a
  reconnect's replay). A QoS 2 message is never sent twice: it waits for its ack only.
- QoS 2 ids written to the actor (on this connection, or restored from an earlier one) are never
  written again; the last :data:`SEEN_CAP` are kept, the last :data:`SEEN_KEPT` are left with the
  session shard when the connection ends.
- ``positions``: per topic, the shard timestamp of the last message written here; a reconnect
  replays what the topic logged after it (:meth:`QosWindow.resume`).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Iterable, Sequence

SEEN_CAP = 10_000  # QoS 2 ids remembered per connection
SEEN_KEPT = 1000  # the newest of them handed to the session shard when the connection ends


class Unacked:
    """A QoS 1/2 frame written and not yet acknowledged."""

    __slots__ = ("frame", "ts_ms", "attempts", "due", "qos", "topic")

    def __init__(self, frame: bytes, ts_ms: int, due: float, qos: int, topic: str) -> None:
        self.frame, self.ts_ms, self.attempts, self.due, self.qos, self.topic = frame, ts_ms, 1, due, qos, topic


class QosWindow:
    def __init__(self, ack_timeout_s: float, ack_backoff: float, max_attempts: int, max_unacked: int) -> None:
        self.ack_timeout_s = ack_timeout_s
        self.ack_backoff = ack_backoff
        self.max_attempts = max_attempts
        self.max_unacked = max_unacked
        self.unacked: OrderedDict[str, Unacked] = OrderedDict()  # msg id -> its frame, oldest first
        # Acknowledgements are opt-in: a client that never acks (the nolag SDK 2.6.0 does not) is not
        # sent each message again and again; one that has acked once gets redeliveries.
        self.acks_seen = False
        self.seen_qos2: OrderedDict[str, None] = OrderedDict()
        self.positions: dict[str, int] = {}  # topic -> shard timestamp of the last message written here

    # -- delivery -------------------------------------------------------------------------------

    @staticmethod
    def requires_ack(msg_id: str | None, qos: int) -> bool:
        """Whether the message is written with ``requiresAck`` (and tracked until its ack)."""
        return qos >= 1 and msg_id is not None

    def deliverable(self, msg_id: str | None, qos: int) -> bool:
        """False: do not write it — a QoS 2 id the actor has had, or a message out and waiting for its ack."""
        if qos >= 1 and msg_id is not None:
            if qos == 2 and msg_id in self.seen_qos2:
                return False  # exactly once: this actor has had it (on this connection or an earlier one)
            if msg_id in self.unacked:
                return False  # already out and waiting for its ack
        return True

    def delivered(self, topic: str, msg_id: str | None, qos: int, ts_ms: int, frame: bytes, sent: bool,
                  now: float) -> None:
        """``frame`` was handed to the socket at ``now`` (``sent``: whether the socket took it;
        ``now`` is read only for a frame that waits for its ack)."""
        if sent and ts_ms > self.positions.get(topic, 0):
            self.positions[topic] = ts_ms
        if self.requires_ack(msg_id, qos):
            if qos == 2 and sent:
                seen = self.seen_qos2
                seen[msg_id] = None
                while len(seen) > SEEN_CAP:
                    seen.popitem(last=False)
            unacked = self.unacked
            if len(unacked) >= self.max_unacked:
                unacked.popitem(last=False)
            unacked[msg_id] = Unacked(frame, ts_ms, now + self.ack_timeout_s, qos, topic)

    def acked(self, *msg_ids: str) -> None:
        """An ``ack`` or ``batchAck`` (even an empty one: the connection acks, so it gets redeliveries)."""
        self.acks_seen = True
        unacked = self.unacked
        for msg_id in msg_ids:
            unacked.pop(msg_id, None)

    def due(self, now: float) -> list[bytes]:
        """The frames to send again at ``now``, oldest first; QoS 1 ones past ``max_attempts`` are dropped."""
        if not self.unacked or not self.acks_seen:
            return []
        frames = []
        for msg_id, entry in list(self.unacked.items()):
            if entry.due > now or entry.qos == 2:
                continue  # QoS 2 is never sent twice to an actor: it waits for its ack only
            if entry.attempts >= self.max_attempts:
                del self.unacked[msg_id]  # given up: it stays in the log for a reconnect's replay
                continue
            frames.append(entry.frame)
            entry.due = now + self.ack_timeout_s * self.ack_backoff ** entry.attempts
            entry.attempts += 1
        return frames

    # -- positions, reconnect and replay --------------------------------------------------------

    def joined(self, topic: str, position: int) -> int:
        """Subscribed: the topic's last message when we joined, unless a position is already held; the position."""
        return self.positions.setdefault(topic, position)

    def left(self, topic: str) -> None:
        self.positions.pop(topic, None)

    def resume(self) -> dict[str, int]:
        """Per topic, where a reconnect replays from: the last message written to this connection,
        or (for clients that ack) just before the oldest one still waiting for its ack.

        Positions are the topic shard's timestamps, strictly increasing per topic, so "after this
        position" is exactly "not yet written to this actor"."""
        resume = dict(self.positions)
        if self.acks_seen:
            for entry in self.unacked.values():
                topic = entry.topic
                if topic in resume and entry.ts_ms - 1 < resume[topic]:
                    resume[topic] = entry.ts_ms - 1
        return resume

    def kept_seen(self) -> list[str]:
        """The QoS 2 ids the session shard keeps for the actor when this connection ends (oldest first)."""
        return list(self.seen_qos2)[-SEEN_KEPT:]

    def restore(self, seen_ids: Iterable[str]) -> None:
        """Reconnect: the QoS 2 ids the actor had on earlier connections."""
        seen = self.seen_qos2
        for msg_id in seen_ids:
            seen[msg_id] = None

    def replay_topics(self, resume: dict[str, int], subscribed: Iterable[str]) -> list[str]:
        """The subscribed topics a reconnect replays (in ``subscribed`` order); each one's position
        moves up to where the replay starts."""
        topics = [topic for topic in subscribed if topic in resume]
        positions = self.positions
        for topic in topics:
            positions[topic] = max(positions.get(topic, 0), resume[topic])
        return topics

    def replayed(self, items: Sequence[Any], held: Sequence[Any]) -> tuple[list[Any], list[Any]]:
        """What a replay sends: of the logged ``items`` (each with ``msg_id`` and its effective
        ``qos``), those that are not QoS 2 ids the actor has had; then, of the live ``held`` ones,
        those not in the replay. Returns ``(replay, live)``, order kept."""
        seen = self.seen_qos2
        replay = [item for item in items if not (item.qos == 2 and item.msg_id in seen)]
        live = list(held)
        if replay:
            ids = {item.msg_id for item in replay}
            live = [item for item in live if item.msg_id is None or item.msg_id not in ids]
        return replay, live
