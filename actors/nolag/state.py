"""NoLag state kept by the topic shards: subscriptions, presence and lobbies, QoS acks, QoS 2 dedup.

Plain classes: no Ray, no I/O, no clock (time is passed in). A *location* is whatever the shard
uses to address a connection (hashable, e.g. ``(gateway_id, connection_id)``); payloads are opaque.

Choices (also in ``docs/nolag.md``):
- Filters follow the spec: an empty filter set is wildcard mode and receives every publish,
  filtered or not. A subscriber with filters receives the publishes whose ``filter`` is in its set,
  and not the unfiltered ones (it narrowed its subscription to those entities; the broker does the
  same). ``echo: false`` excludes the sender's connection only.
- Load balancing: among the subscribers that match a publish and share a group, exactly one gets
  it: the one served least recently (ties: the earliest subscriber). With a fixed set of members this
  is round robin, so N messages over k members give each N/k ± 1; a member that joins late is not
  flooded and one that leaves costs nothing. The excluded sender never takes a turn.
- Presence is per room and per actor: an actor present from two connections is one entry whose
  location is the last one that set it, so closing the older connection does not make it leave.
- Redelivery (:class:`AckTracker`) defaults: first retry after 5 s, then ×2 (10, 20, 40 s), 5
  sends in all, at most 1000 unacked frames per connection (the oldest is dropped beyond).
- QoS 2 (:class:`Dedup`): delivered msgIds are remembered per actor (so across reconnects), at most
  10,000 per actor and for one hour; a redelivery of an unacked frame is the same delivery and does
  not pass through it.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Hashable, Iterable

Location = Hashable


# -- subscriptions ------------------------------------------------------------------------------

@dataclass(slots=True)
class Subscriber:
    location: Location
    filters: frozenset[str] = frozenset()  # empty: wildcard
    qos: int = 1
    group: str | None = None  # load-balance group; None: gets every matching message
    served: int = 0  # when it last got a load-balanced message (Subscriptions' counter)


class Subscriptions:
    def __init__(self) -> None:
        self._topics: dict[str, dict[Location, Subscriber]] = {}
        self._by_location: dict[Location, set[str]] = {}
        self._turn = 0

    def subscribe(self, topic: str, location: Location, filters: Iterable[str] = (), qos: int = 1,
                  group: str | None = None) -> bool:
        """Add or replace ``location``'s subscription; True if it is new."""
        subscribers = self._topics.setdefault(topic, {})
        previous = subscribers.get(location)
        subscriber = Subscriber(location, frozenset(filters), qos, group)
        if previous is not None and previous.group == group:
            subscriber.served = previous.served
        subscribers[location] = subscriber
        self._by_location.setdefault(location, set()).add(topic)
        return previous is None

    def unsubscribe(self, topic: str, location: Location) -> bool:
        subscribers = self._topics.get(topic)
        if subscribers is None or subscribers.pop(location, None) is None:
            return False
        if not subscribers:
            del self._topics[topic]
        topics = self._by_location[location]
        topics.discard(topic)
        if not topics:
            del self._by_location[location]
        return True

    def set_filters(self, topic: str, location: Location, filters: Iterable[str]) -> bool:
        """Replace the filter set (empty: wildcard); False if ``location`` is not subscribed."""
        subscriber = self._topics.get(topic, {}).get(location)
        if subscriber is None:
            return False
        subscriber.filters = frozenset(filters)
        return True

    def purge_connection(self, location: Location) -> list[str]:
        """Drop every subscription of a closed connection; returns their topics (sorted)."""
        topics = sorted(self._by_location.get(location, ()))
        for topic in topics:
            self.unsubscribe(topic, location)
        return topics

    def get(self, topic: str, location: Location) -> Subscriber | None:
        return self._topics.get(topic, {}).get(location)

    def locations(self) -> list[Location]:
        """Every connection with a subscription."""
        return list(self._by_location)

    def topics_of(self, location: Location) -> list[str]:
        return sorted(self._by_location.get(location, ()))

    def count(self, topic: str) -> int:
        return len(self._topics.get(topic, ()))

    def route(self, topic: str, filter: str | None = None, exclude: Location | None = None) -> list[Location]:
        return [subscriber.location for subscriber in self.route_subscribers(topic, filter, exclude)]

    def route_subscribers(self, topic: str, filter: str | None = None,
                          exclude: Location | None = None) -> list[Subscriber]:
        """Who gets one publish, in subscription order (load-balanced members where their turn falls)."""
        subscribers = self._topics.get(topic)
        if not subscribers:
            return []
        chosen: list[Subscriber] = []
        groups: dict[str, int] = {}  # group -> its slot in chosen
        for subscriber in subscribers.values():
            if subscriber.location == exclude:
                continue
            if subscriber.filters and (filter is None or filter not in subscriber.filters):
                continue
            if subscriber.group is None:
                chosen.append(subscriber)
                continue
            slot = groups.get(subscriber.group)
            if slot is None:
                groups[subscriber.group] = len(chosen)
                chosen.append(subscriber)
            elif subscriber.served < chosen[slot].served:
                chosen[slot] = subscriber
        for slot in groups.values():
            self._turn += 1
            chosen[slot].served = self._turn
        return chosen


# -- presence and lobbies -----------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Lobby:
    """A read-only view over rooms: an explicit set of room ids, or every room id with a prefix."""

    lobby_id: str
    rooms: frozenset[str] | None = None
    prefix: str | None = None

    def __post_init__(self) -> None:
        if (self.rooms is None) == (self.prefix is None):
            raise ValueError(f"lobby {self.lobby_id!r}: give either rooms or a prefix")

    def contains(self, room: str) -> bool:
        if self.rooms is not None:
            return room in self.rooms
        return room.startswith(self.prefix)


@dataclass(frozen=True, slots=True)
class PresenceEvent:
    event: str  # join | update | leave
    room: str
    actor_id: str
    data: Any
    joined_at: int


@dataclass(slots=True)
class _Entry:
    location: Location
    data: Any
    joined_at: int


class Presence:
    def __init__(self, lobbies: Iterable[Lobby] = ()) -> None:
        self._rooms: dict[str, dict[str, _Entry]] = {}
        self._by_location: dict[Location, set[tuple[str, str]]] = {}
        self._lobbies: dict[str, Lobby] = {}
        for lobby in lobbies:
            self.add_lobby(lobby)

    def set(self, room: str, actor_id: str, location: Location, data: Any, now: int) -> list[PresenceEvent]:
        """First presence of an actor in a room: ``join`` then ``update``; later ones: ``update``.
        ``data`` None (the SDK's ``clear_presence``) is a leave."""
        if data is None:
            return self.leave(room, actor_id=actor_id)
        entries = self._rooms.setdefault(room, {})
        entry = entries.get(actor_id)
        events = []
        if entry is None:
            entry = entries[actor_id] = _Entry(location, data, now)
            events.append(PresenceEvent("join", room, actor_id, data, now))
        else:
            self._unindex(entry.location, room, actor_id)
            entry.location, entry.data = location, data
        self._by_location.setdefault(location, set()).add((room, actor_id))
        events.append(PresenceEvent("update", room, actor_id, data, entry.joined_at))
        return events

    def leave(self, room: str, *, actor_id: str | None = None, location: Location | None = None) -> list[PresenceEvent]:
        """The actor (or every actor whose entry ``location`` holds) leaves ``room``."""
        entries = self._rooms.get(room, {})
        if actor_id is not None:
            actors = [actor_id] if actor_id in entries else []
        else:
            actors = [actor for actor, entry in entries.items() if entry.location == location]
        events = []
        for actor in actors:
            entry = entries.pop(actor)
            self._unindex(entry.location, room, actor)
            events.append(PresenceEvent("leave", room, actor, entry.data, entry.joined_at))
        if not entries:
            self._rooms.pop(room, None)
        return events

    def purge_connection(self, location: Location) -> list[tuple[str, PresenceEvent]]:
        """Everything a closed connection was present in leaves; ``(room, leave event)`` sorted by room."""
        out = []
        for room, actor in sorted(self._by_location.get(location, ())):
            out.extend((room, event) for event in self.leave(room, actor_id=actor))
        return out

    def locations(self) -> list[Location]:
        """Every connection some actor's presence is at."""
        return list(self._by_location)

    def list(self, room: str) -> list[dict[str, Any]]:
        """``[{actorTokenId, presence, joinedAt}]`` in join order (``presenceList``)."""
        return [{"actorTokenId": actor, "presence": entry.data, "joinedAt": entry.joined_at}
                for actor, entry in self._rooms.get(room, {}).items()]

    def get(self, room: str, actor_id: str) -> Any:
        entry = self._rooms.get(room, {}).get(actor_id)
        return None if entry is None else entry.data

    def rooms(self) -> list[str]:
        return sorted(self._rooms)

    def add_lobby(self, lobby: Lobby) -> None:
        self._lobbies[lobby.lobby_id] = lobby

    def lobby(self, lobby_id: str) -> Lobby | None:
        return self._lobbies.get(lobby_id)

    def lobbies_of(self, room: str) -> list[str]:
        """The lobbies that show ``room`` (sorted): where a presence change must also go."""
        return sorted(lobby_id for lobby_id, lobby in self._lobbies.items() if lobby.contains(room))

    def snapshot(self, lobby_id: str) -> dict[str, dict[str, Any]]:
        """``{room: {actor: data}}`` over the lobby's rooms that have someone (``lobbySubscribed``)."""
        lobby = self._lobbies.get(lobby_id)
        if lobby is None:
            raise KeyError(lobby_id)
        if lobby.rooms is not None:
            rooms = [room for room in sorted(lobby.rooms) if room in self._rooms]
        else:
            rooms = [room for room in sorted(self._rooms) if lobby.contains(room)]
        return {room: {actor: entry.data for actor, entry in self._rooms[room].items()} for room in rooms}

    def _unindex(self, location: Location, room: str, actor: str) -> None:
        keys = self._by_location.get(location)
        if keys is not None:
            keys.discard((room, actor))
            if not keys:
                del self._by_location[location]


# -- QoS 1/2: acknowledgements and redelivery ---------------------------------------------------

@dataclass(slots=True)
class _Unacked:
    frame: Any
    attempts: int
    due: float


@dataclass(frozen=True, slots=True)
class Redelivery:
    location: Location
    msg_id: str
    frame: Any
    attempt: int  # 2 for the first redelivery


class AckTracker:
    """Frames sent with ``requiresAck`` until acked: due again after ``initial_timeout_s``, then
    ``factor`` times longer each time, given up after ``max_attempts`` sends (first one included)."""

    def __init__(self, initial_timeout_s: float = 5.0, factor: float = 2.0, max_attempts: int = 5,
                 max_unacked: int = 1000) -> None:
        if initial_timeout_s <= 0 or factor < 1 or max_attempts < 1 or max_unacked < 1:
            raise ValueError("need initial_timeout_s > 0, factor >= 1, max_attempts >= 1, max_unacked >= 1")
        self.initial_timeout_s = initial_timeout_s
        self.factor = factor
        self.max_attempts = max_attempts
        self.max_unacked = max_unacked
        self._pending: dict[Location, OrderedDict[str, _Unacked]] = {}
        self._heap: list[tuple[float, int, Location, str]] = []  # stale entries are skipped
        self._seq = 0
        self._live = 0  # frames in _pending
        self.dropped = 0  # pushed out by max_unacked
        self.expired = 0  # given up after max_attempts

    def sent(self, location: Location, msg_id: str, frame: Any, now: float) -> None:
        pending = self._pending.setdefault(location, OrderedDict())
        if msg_id in pending:
            del pending[msg_id]
            self._live -= 1
        elif len(pending) >= self.max_unacked:
            pending.popitem(last=False)
            self._live -= 1
            self.dropped += 1
        self._live += 1
        item = _Unacked(frame, 1, now + self.initial_timeout_s)
        pending[msg_id] = item
        self._push(item.due, location, msg_id)

    def ack(self, location: Location, msg_id: str) -> bool:
        pending = self._pending.get(location)
        if pending is None or pending.pop(msg_id, None) is None:
            return False
        self._live -= 1
        if not pending:
            del self._pending[location]
        return True

    def due(self, now: float) -> list[Redelivery]:
        """Frames to send again now, in the order they fell due."""
        out = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            due, _, location, msg_id = heapq.heappop(heap)
            pending = self._pending.get(location)
            item = None if pending is None else pending.get(msg_id)
            if item is None or item.due != due:
                continue  # acked, dropped, purged or re-sent since
            if item.attempts >= self.max_attempts:
                del pending[msg_id]
                self._live -= 1
                if not pending:
                    del self._pending[location]
                self.expired += 1
                continue
            item.attempts += 1
            item.due = now + self.initial_timeout_s * self.factor ** (item.attempts - 1)
            self._push(item.due, location, msg_id)
            out.append(Redelivery(location, msg_id, item.frame, item.attempts))
        return out

    def next_due(self) -> float | None:
        """When :meth:`due` may next return something (an upper bound on the wait), or None."""
        return self._heap[0][0] if self._heap else None

    def purge_connection(self, location: Location) -> int:
        """Forget a closed connection's frames; returns how many were unacked."""
        pending = self._pending.pop(location, None)
        if pending is None:
            return 0
        self._live -= len(pending)
        return len(pending)

    def unacked(self, location: Location) -> list[str]:
        return list(self._pending.get(location, ()))

    def _push(self, due: float, location: Location, msg_id: str) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (due, self._seq, location, msg_id))
        if len(self._heap) > 4 * self._live + 256:
            self._compact()

    def _compact(self) -> None:
        self._heap = [entry for entry in self._heap
                      if (item := self._pending.get(entry[2], {}).get(entry[3])) is not None and item.due == entry[0]]
        heapq.heapify(self._heap)


# -- QoS 2: never the same msgId twice to one actor ---------------------------------------------

class Dedup:
    def __init__(self, max_per_actor: int = 10_000, window_s: float = 3600.0, max_actors: int = 100_000) -> None:
        self.max_per_actor = max_per_actor
        self.window_s = window_s
        self.max_actors = max_actors
        # actor (least recently active first) -> {msgId: when delivered}, oldest first
        self._actors: OrderedDict[str, OrderedDict[str, float]] = OrderedDict()

    def first_delivery(self, actor: str, msg_id: str, now: float) -> bool:
        """True (and remembered) if ``actor`` has not been given ``msg_id``; False: drop it."""
        ids = self._actors.get(actor)
        if ids is None:
            ids = self._actors[actor] = OrderedDict()
            while len(self._actors) > self.max_actors:
                self._actors.popitem(last=False)
        else:
            self._actors.move_to_end(actor)
        horizon = now - self.window_s
        while ids and next(iter(ids.values())) < horizon:
            ids.popitem(last=False)
        if msg_id in ids:
            return False
        ids[msg_id] = now
        if len(ids) > self.max_per_actor:
            ids.popitem(last=False)
        return True

    def seen(self, actor: str, msg_id: str, now: float) -> bool:
        """Whether ``msg_id`` was delivered to ``actor`` within the window (does not record)."""
        ids = self._actors.get(actor)
        delivered = None if ids is None else ids.get(msg_id)
        return delivered is not None and delivered >= now - self.window_s

    def forget(self, actor: str) -> None:
        self._actors.pop(actor, None)
