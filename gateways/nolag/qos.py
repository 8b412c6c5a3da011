"""NoLag: one connection's QoS window — what waits for an ack, what is sent again, where to replay from.

Plain class: no Ray, no sockets, no clock (``now`` is passed in). The session writes the frames
and asks :class:`QosWindow` what to write; the window never builds a frame itself, it keeps the
ones it may have to send again.

The rule (also in ``docs/nolag.md``): nothing a client has not acked is ever skipped, and a client
that never acks (the ``nolag`` SDK 2.6.0) is never sent a message twice.

- Every QoS 1/2 message with a ``msgId`` is written with ``requiresAck`` and held in ``unacked``
  from its first write until its ack. At most ``max_unacked`` frames are kept: beyond, the oldest
  frame is dropped, but its message still counts as unacked (its topic's floor is *pinned* below it).
- Redelivery starts once the actor has shown it acks (an ``ack``/``batchAck`` on this connection,
  or on an earlier one: ``acks_seen`` restored). A QoS 1 message is sent again ``ack_timeout_s``
  after it was written, then ``ack_backoff`` times longer each time, ``max_attempts`` sends in all;
  then its frame is dropped and its floor pinned (a reconnect replays it from the log). A QoS 2
  message is never written twice: it waits for its ack only. A frame the socket did not take is
  written again when due, whatever the QoS and whether the client acks (that is its first write).
- Per topic, two positions: ``positions`` (the shard timestamp of the last message written here)
  and the *floor* (:meth:`floors`: just before the oldest message not acked, pinned or left by an
  earlier connection). A reconnect of an actor that acks replays after the floor; of one that
  never acked, after the position, and the range between (``carried``) is replayed once the new
  connection shows it acks.
- QoS 2 ids written to the actor (on this connection, or restored from its session shard) are
  never written again; the last :data:`SEEN_CAP` are kept here.

Two stores hold what waits for an ack, oldest first: ``unacked`` (id -> entry) and, after it,
``runs``: each :class:`Run` a topic's QoS 1 messages fanned out together (one piece per recipient,
``NolagSession._fan_out_joined``), shared by every recipient's window, which keeps only how many of
its first ids it has had acked. An ack of a run's next ids in the order written (as a client acks
what it reads) moves that count, with no work per id; anything else first moves the runs' entries
into ``unacked`` (:meth:`QosWindow.materialize`) and goes on as before, as does anything that puts
an entry in ``unacked`` (so every entry there stays older than every run's).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import Any, Callable, Iterable, Iterator, Sequence

from gateways.nolag.codec import packed_ids

SEEN_CAP = 10_000  # QoS 2 ids remembered per connection
# Runs a window holds at most: one more first moves theirs into ``unacked`` (a lookup of an id
# walks the runs, so this bounds it; a fan-out's runs are its shard replies, a few at a time).
RUNS_MAX = 32


class Unacked:
    """A QoS 1/2 frame not yet acknowledged; ``attempts``: how many times the socket took it.

    Never changed once made: a fan-out shares one among the windows of all the recipients whose
    socket took the frame (:meth:`QosWindow.track`); a redelivery replaces a window's entry."""

    __slots__ = ("frame", "ts_ms", "attempts", "due", "qos", "topic")

    def __init__(self, frame: bytes, ts_ms: int, attempts: int, due: float, qos: int, topic: str) -> None:
        self.frame, self.ts_ms, self.attempts, self.due, self.qos, self.topic = frame, ts_ms, attempts, due, qos, topic


class Run:
    """A topic's QoS 1 messages written together, in order, to several connections: their ids and
    entries (each entry ``attempts`` 1, one ``due``), never changed once made and shared by the
    windows of every recipient (:meth:`QosWindow.add_run`)."""

    __slots__ = ("ids", "entries", "due", "_index", "_packed")

    def __init__(self, ids: tuple[str, ...], entries: tuple[Unacked, ...], due: float,
                 packed: tuple[bytes, int] | None = None) -> None:
        """``packed``: the ids already packed and joined, and the size of each, as
        :func:`packed_ids` gives them (the frames' builder packed them), for :meth:`packed`."""
        self.ids, self.entries, self.due = ids, entries, due
        self._index: dict[str, int] | None = None
        self._packed: tuple[memoryview, int] | None = None if packed is None else (memoryview(packed[0]), packed[1])

    def position(self, msg_id: str) -> int:
        """Where ``msg_id`` is among the ids, -1 if it is not one of them."""
        index = self._index
        if index is None:
            index = self._index = {msg_id: position for position, msg_id in enumerate(self.ids)}
        return index.get(msg_id, -1)

    def packed(self) -> tuple[memoryview, int]:
        """The ids as MessagePack strings, back to back (as a ``batchAck``'s array carries them; a
        memoryview: a slice of it is compared without a copy), and the size of each one; 0 if they
        are not all one size (then there is no such reading)."""
        packed = self._packed
        if packed is None:
            joined, width = packed_ids(self.ids)
            packed = self._packed = (memoryview(joined), width)
        return packed


class QosWindow:
    def __init__(self, ack_timeout_s: float, ack_backoff: float, max_attempts: int, max_unacked: int) -> None:
        self.ack_timeout_s = ack_timeout_s
        self.ack_backoff = ack_backoff
        self.max_attempts = max_attempts
        self.max_unacked = max_unacked
        # msg id -> its frame, oldest first (a dict keeps the order, and a replaced entry keeps its
        # place; measured: half the cost of an OrderedDict per write and ack)
        self.unacked: dict[str, Unacked] = {}
        self.unwritten: dict[str, None] = {}  # the ones of them the socket has not taken yet, oldest first
        # After them, oldest first: [run, how many of its first ids were acked here] (every run's
        # frames were taken by the socket); ``in_runs``: how many of their ids wait for an ack.
        self.runs: deque[list] = deque()
        self.in_runs = 0
        # No entry is due before this (a lower bound): a tick before it has nothing to look at.
        self.next_due = float("inf")
        # Acknowledgements are opt-in: a client that never acks (the nolag SDK 2.6.0 does not) is not
        # sent each message again and again; one that has acked once gets redeliveries.
        self.acks_seen = False
        self.seen_qos2: OrderedDict[str, None] = OrderedDict()
        self.recording: set[str] = set()  # QoS 2 ids the session shard is recording before their write
        self.positions: dict[str, int] = {}  # topic -> shard timestamp of the last message written here
        self.pinned: dict[str, int] = {}  # topic -> floor held by unacked messages whose frames were dropped
        # topic -> (floor, position): what an earlier connection of an actor that had not shown it acks
        # left unacked; replayed once this one acks
        self.carried: dict[str, tuple[int, int]] = {}

    # -- delivery -------------------------------------------------------------------------------

    @staticmethod
    def requires_ack(msg_id: str | None, qos: int) -> bool:
        """Whether the message is written with ``requiresAck`` (and tracked until its ack)."""
        return qos >= 1 and msg_id is not None

    def deliverable(self, msg_id: str | None, qos: int) -> bool:
        """False: do not write it — a QoS 2 id the actor has had (or is being recorded), or a
        message out and waiting for its ack."""
        if qos >= 1 and msg_id is not None:
            if qos == 2 and (msg_id in self.seen_qos2 or msg_id in self.recording):
                return False  # exactly once: this actor has had it (on this connection or an earlier one)
            if self.holds(msg_id):
                return False  # already out and waiting for its ack
        return True

    @staticmethod
    def needs_record(msg_id: str | None, qos: int) -> bool:
        """A QoS 2 message is recorded with the actor's session shard before it is written."""
        return qos == 2 and msg_id is not None

    def seen(self, *msg_ids: str) -> None:
        """QoS 2 ids the actor has had (recorded with its session shard): never written again."""
        seen = self.seen_qos2
        for msg_id in msg_ids:
            seen[msg_id] = None
            self.recording.discard(msg_id)
        while len(seen) > SEEN_CAP:
            seen.popitem(last=False)

    def delivered(self, topic: str, msg_id: str | None, qos: int, ts_ms: int, frame: bytes, sent: bool,
                  now: float) -> None:
        """``frame`` was handed to the socket at ``now`` (``sent``: whether the socket took it;
        ``now`` is read only for a frame that waits for its ack)."""
        if not self.requires_ack(msg_id, qos):
            if sent and ts_ms > self.positions.get(topic, 0):
                self.positions[topic] = ts_ms
            return
        if qos == 2 and sent:
            self.seen(msg_id)
        self.track(msg_id, Unacked(frame, ts_ms, 1 if sent else 0, now + self.ack_timeout_s, qos, topic), sent)

    def track(self, msg_id: str, entry: Unacked, taken: bool = True) -> None:
        """A frame waits for its ack: ``entry`` (``attempts`` 1 and due ``ack_timeout_s`` after the
        write if the socket ``taken`` it, else 0) may be shared with other windows."""
        if taken and entry.ts_ms > self.positions.get(entry.topic, 0):
            self.positions[entry.topic] = entry.ts_ms
        if self.runs:
            self.materialize()  # what enters ``unacked`` is newer than every run
        unacked = self.unacked
        if len(unacked) >= self.max_unacked:
            dropped_id = next(iter(unacked))
            dropped = unacked.pop(dropped_id)
            self.unwritten.pop(dropped_id, None)
            self._pin(dropped)
        unacked[msg_id] = entry
        if not taken:
            self.unwritten[msg_id] = None
        if entry.due < self.next_due:
            self.next_due = entry.due

    def _pin(self, entry: Unacked) -> None:
        """``entry`` leaves the window unacked: its topic's floor stays below it (the log keeps it)."""
        if entry.attempts and entry.qos == 2:
            return  # written once: exactly once never writes it again
        floor = entry.ts_ms - 1
        if floor < self.pinned.get(entry.topic, floor + 1):
            self.pinned[entry.topic] = floor

    def acked(self, *msg_ids: str) -> bool:
        """An ``ack`` or ``batchAck`` (even an empty one: the connection acks, so it gets
        redeliveries); True if it is the first sign that the actor acks."""
        first = not self.acks_seen
        if first:
            self._acks_start()
        unacked, unwritten = self.unacked, self.unwritten
        if self.runs:
            if unacked:  # the ack's first ids may be older ones, one by one; then the runs' in order
                lead = 0
                for msg_id in msg_ids:
                    if unacked.pop(msg_id, None) is None:  # not there (or repeated: taken already)
                        break
                    unwritten.pop(msg_id, None)
                    lead += 1
                msg_ids = msg_ids[lead:]
            taken = self._acked_in_order(msg_ids)
            if taken == len(msg_ids):
                return first
            msg_ids = msg_ids[taken:]
            self.materialize()
        pop = unacked.pop
        for msg_id in msg_ids:
            pop(msg_id, None)
        if unwritten:
            for msg_id in msg_ids:
                unwritten.pop(msg_id, None)
        return first

    def _acked_in_order(self, msg_ids: tuple[str, ...]) -> int:
        """How many of the first ``msg_ids`` are the runs' next ids in order: those are acked (an
        id is never both in a run and in ``unacked``)."""
        done, count = 0, len(msg_ids)
        for run, start in self.runs:
            ids = run.ids
            take = min(count - done, len(ids) - start)
            if ids[start:start + take] != msg_ids[done:done + take]:
                break
            done += take
            if done == count:
                break
        self._take(done)
        return done

    def acked_packed(self, data: bytes, count: int, start: int) -> bool:
        """A ``batchAck`` of ``count`` ids, MessagePack strings back to back in ``data[start:]``
        (to its end): True if they are the runs' next ``count`` ids in order, written as this
        router packs them — then they are acked; False (nothing done) otherwise. Only for a
        connection that has acked before."""
        if not self.acks_seen or not self.runs or count > self.in_runs:
            return False
        state = self.runs[0]
        run, first = state
        end = first + count
        if end <= len(run.ids):  # all of them in the first run (a client acks less than a run a frame)
            packed, width = run.packed()
            if not width or len(data) - start != count * width or not data.startswith(packed[first * width:end * width],
                                                                                         start):
                return False
            self.in_runs -= count  # _take, for one run
            if end == len(run.ids):
                self.runs.popleft()
            else:
                state[1] = end
            return True
        position, left = start, count
        for run, first in self.runs:
            packed, width = run.packed()
            if not width:
                return False
            take = min(left, len(run.ids) - first)
            size = take * width
            if not data.startswith(packed[first * width:(first + take) * width], position):  # no copy
                return False
            position += size
            left -= take
            if not left:
                break
        if position != len(data):
            return False
        self._take(count)
        return True

    def _take(self, count: int) -> None:
        """The runs' next ``count`` ids are acked here (``count`` at most ``in_runs``)."""
        runs = self.runs
        self.in_runs -= count
        while count:
            state = runs[0]
            run, start = state
            take = min(count, len(run.ids) - start)
            count -= take
            if start + take == len(run.ids):
                runs.popleft()
            else:
                state[1] = start + take

    def add_run(self, run: Run) -> None:
        """``run``'s frames were written to this connection, after everything before."""
        if len(self.runs) >= RUNS_MAX:
            self.materialize()
        self.runs.append([run, 0])
        self.in_runs += len(run.ids)
        if run.due < self.next_due:
            self.next_due = run.due

    def in_a_run(self, msg_id: str) -> bool:
        """Whether ``msg_id`` is in a run and not acked here."""
        for run, start in self.runs:
            position = run.position(msg_id)
            if position >= start:
                return True
        return False

    def holds(self, msg_id: str) -> bool:
        """Whether ``msg_id`` waits for its ack here."""
        return msg_id in self.unacked or (bool(self.runs) and self.in_a_run(msg_id))

    def holds_any(self, msg_ids: Sequence[str]) -> bool:
        """Whether any of ``msg_ids`` waits for its ack here: the first is looked up in the runs
        too (a client acks in order), the others in ``unacked`` once the runs' entries have moved
        there (one lookup each, not a walk of the runs each: an ack of ids that are not out is
        refused by the rate limit after this check)."""
        if not msg_ids:
            return False
        if self.runs:
            if self.holds(msg_ids[0]):
                return True
            if len(msg_ids) == 1:
                return False
            self.materialize()
        return any(map(self.unacked.__contains__, msg_ids))

    def size(self) -> int:
        """How many messages wait for their ack here."""
        return len(self.unacked) + self.in_runs

    def _in_runs(self) -> Iterator[tuple[str, Unacked]]:
        """The runs' ids not acked here and their entries, oldest first."""
        for run, start in self.runs:
            yield from zip(run.ids[start:], run.entries[start:])

    def materialize(self) -> None:
        """The runs' entries not acked into ``unacked``, in order, after what it holds."""
        self.unacked.update(self._in_runs())
        self.runs.clear()
        self.in_runs = 0

    def outstanding(self) -> dict[str, Unacked]:
        """Every message waiting for its ack here, oldest first (a copy)."""
        waiting = dict(self.unacked)
        waiting.update(self._in_runs())
        return waiting

    def resend_due(self, now: float, send: Callable[[bytes], bool]) -> int:
        """Write again, oldest first, what is due at ``now`` with ``send`` (True: the socket took
        it); QoS 1 ones past ``max_attempts`` leave the window, pinned. Returns how many were written."""
        if now < self.next_due:
            return 0  # nothing is due yet
        runs = self.runs
        if runs and self.acks_seen and runs[0][0].due <= now:
            self.materialize()  # a run is due: its entries go one by one from here
        if self.acks_seen:
            waiting = list(self.unacked.items())
        elif self.unwritten:  # a client that does not ack: only first writes
            waiting = [(msg_id, self.unacked[msg_id]) for msg_id in self.unwritten]
        else:
            self.next_due = float("inf")
            return 0
        written = 0
        next_due = float("inf")  # of the entries that may be written later
        unacked = self.unacked
        for msg_id, entry in waiting:
            if entry.attempts and (entry.qos == 2 or not self.acks_seen):
                continue  # QoS 2 is never written twice; a client that does not ack is never resent
            due = entry.due
            if due > now:
                if due < next_due:
                    next_due = due
                continue
            if entry.attempts >= self.max_attempts:  # a redelivery, but the last one was the last
                del unacked[msg_id]  # given up: the log keeps it for a reconnect's replay
                self._pin(entry)
                continue
            if send(entry.frame):
                written += 1
                self.unwritten.pop(msg_id, None)
                if entry.qos == 2:
                    self.seen(msg_id)
                if entry.ts_ms > self.positions.get(entry.topic, 0):
                    self.positions[entry.topic] = entry.ts_ms
                due = now + self.ack_timeout_s * self.ack_backoff ** entry.attempts
                attempts = entry.attempts + 1
            else:
                due, attempts = now + self.ack_timeout_s, entry.attempts
            unacked[msg_id] = Unacked(entry.frame, entry.ts_ms, attempts, due, entry.qos, entry.topic)
            if due < next_due:
                next_due = due
        if runs and self.acks_seen and runs[0][0].due < next_due:  # not due yet (oldest first: the first is the soonest)
            next_due = runs[0][0].due
        self.next_due = next_due
        return written

    # -- positions, reconnect and replay --------------------------------------------------------

    def joined(self, topic: str, position: int) -> int:
        """Subscribed: the topic's last message when we joined, unless a position is already held; the position."""
        return self.positions.setdefault(topic, position)

    def left(self, topic: str) -> None:
        self.positions.pop(topic, None)
        self.pinned.pop(topic, None)
        self.carried.pop(topic, None)

    def resume(self) -> dict[str, int]:
        """Per topic, the last message written to this connection (shard timestamps, strictly
        increasing per topic, so "after this position" is exactly "not yet written here")."""
        return dict(self.positions)

    def floors(self) -> dict[str, int]:
        """Per topic, just before the oldest message written here (or left by an earlier
        connection) that was not acked: a reconnect of an actor that acks replays after it."""
        floors = dict(self.positions)

        def lower(topic: str, floor: int) -> None:
            if topic in floors and floor < floors[topic]:
                floors[topic] = floor

        for topic, floor in self.pinned.items():
            lower(topic, floor)
        for topic, (floor, _) in self.carried.items():
            lower(topic, floor)
        current = floors.get  # inlined (a window may hold max_unacked entries, read each checkpoint)
        entries: Iterable[Unacked] = self.unacked.values()
        if self.runs:
            entries = [*entries, *(entry for _, entry in self._in_runs())]
        for entry in entries:
            if entry.qos == 1 or not entry.attempts:  # a QoS 2 one written is never replayed
                floor = entry.ts_ms - 1
                if floor < current(entry.topic, floor):  # a topic without a position stays out
                    floors[entry.topic] = floor
        return floors

    def restore(self, seen_ids: Iterable[str], acks: bool = False) -> None:
        """Reconnect: the QoS 2 ids the actor had on earlier connections, and whether it acks."""
        self.seen(*seen_ids)
        if acks and not self.acks_seen:
            self._acks_start()

    def _acks_start(self) -> None:
        """The actor acks: redeliveries start, and what was written before may already be due."""
        self.acks_seen = True
        self.next_due = float("-inf")

    def carry(self, floors: dict[str, int], positions: dict[str, int]) -> None:
        """Reconnect of an actor that had not shown it acks: what its earlier connections left
        unacked (between each floor and position), to replay once this connection acks."""
        for topic, floor in floors.items():
            position = positions.get(topic)
            if position is not None and floor < position:
                self.carried[topic] = (floor, position)

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
