"""NoLag state kept by the topic shards: subscriptions, presence, lobbies.

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
  The actors present in a room hear its presence events, as its subscribers do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterable

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
        self._memo: dict[str, Any] = {}  # topic -> a value derived from its subscriptions (memo)

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
        self._memo.pop(topic, None)
        return previous is None

    def unsubscribe(self, topic: str, location: Location) -> bool:
        subscribers = self._topics.get(topic)
        if subscribers is None or subscribers.pop(location, None) is None:
            return False
        self._memo.pop(topic, None)
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
        self._memo.pop(topic, None)
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

    def has_groups(self, topic: str) -> bool:
        """Whether a subscriber of ``topic`` is in a load-balance group (its routes take turns)."""
        return any(subscriber.group is not None for subscriber in self._topics.get(topic, {}).values())

    def memo(self, topic: str, make: Callable[[], Any]) -> Any:
        """``make()``, computed once and kept until ``topic``'s subscriptions change (a subscribe,
        an unsubscribe, new filters); ``make`` must derive its value from them alone. Nothing is
        kept for a topic without subscribers (publishes to any number of such topics keep nothing)."""
        if topic not in self._topics:
            return make()
        memo = self._memo
        if topic in memo:
            return memo[topic]
        value = memo[topic] = make()
        return value

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
    def __init__(self) -> None:
        self._rooms: dict[str, dict[str, _Entry]] = {}
        self._by_location: dict[Location, set[tuple[str, str]]] = {}

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

    def restore(self, room: str, actor_id: str, location: Location, data: Any, joined_at: int) -> bool:
        """Put back an entry a restarted shard lost, as it was, with no event; an entry the actor
        already has here (re-announced by another of its connections) is kept. True if added."""
        entries = self._rooms.setdefault(room, {})
        if actor_id in entries:
            return False
        entries[actor_id] = _Entry(location, data, joined_at)
        if any(entry.joined_at > joined_at for entry in entries.values()):  # lists stay in join order
            self._rooms[room] = dict(sorted(entries.items(), key=lambda item: item[1].joined_at))
        self._by_location.setdefault(location, set()).add((room, actor_id))
        return True

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

    def locations_in(self, room: str) -> list[Location]:
        """The connections of the actors present in ``room``: they hear its presence events."""
        return [entry.location for entry in self._rooms.get(room, {}).values()]

    def list(self, room: str) -> list[dict[str, Any]]:
        """``[{actorTokenId, presence, joinedAt}]`` in join order (``presenceList``)."""
        return [{"actorTokenId": actor, "presence": entry.data, "joinedAt": entry.joined_at}
                for actor, entry in self._rooms.get(room, {}).items()]

    def get(self, room: str, actor_id: str) -> Any:
        entry = self._rooms.get(room, {}).get(actor_id)
        return None if entry is None else entry.data

    def rooms(self) -> list[str]:
        return sorted(self._rooms)

    def _unindex(self, location: Location, room: str, actor: str) -> None:
        keys = self._by_location.get(location)
        if keys is not None:
            keys.discard((room, actor))
            if not keys:
                del self._by_location[location]
