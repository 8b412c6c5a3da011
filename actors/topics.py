"""TopicTable: subscribers per topic, grouped by gateway for fan-out."""

from __future__ import annotations

from typing import Any

Location = tuple[str, int]
Routes = dict[str, tuple[int, ...]]  # gateway id -> connection ids


class TopicTable:
    """Which connections subscribe to which topics.

    A subscription belongs to a connection (a location); subscribing twice is idempotent. The
    fan-out grouping (gateway -> connections) is cached per topic and rebuilt only when the
    topic's subscribers change, so a publish costs one dictionary lookup, not a scan.
    """

    def __init__(self) -> None:
        self._topics: dict[str, dict[Location, Any]] = {}
        self._by_connection: dict[Location, set[str]] = {}
        self._routes: dict[str, Routes] = {}

    def subscribe(self, topic: str, location: Location, info: Any = None) -> bool:
        """Add a subscription; returns False when it already existed (its ``info`` is updated)."""
        subscribers = self._topics.setdefault(topic, {})
        created = location not in subscribers
        subscribers[location] = info
        if created:
            self._by_connection.setdefault(location, set()).add(topic)
            self._routes.pop(topic, None)
        return created

    def unsubscribe(self, topic: str, location: Location) -> bool:
        subscribers = self._topics.get(topic)
        if subscribers is None or subscribers.pop(location, _MISSING) is _MISSING:
            return False
        if not subscribers:
            del self._topics[topic]
        self._routes.pop(topic, None)
        topics = self._by_connection.get(location)
        if topics is not None:
            topics.discard(topic)
            if not topics:
                del self._by_connection[location]
        return True

    def routes(self, topic: str, exclude: Location | None = None) -> tuple[int, Routes]:
        """Fan-out targets of a publish: (recipient count, gateway -> connection ids)."""
        subscribers = self._topics.get(topic)
        if not subscribers:
            return 0, {}
        routes = self._routes.get(topic)
        if routes is None:
            grouped: dict[str, list[int]] = {}
            for gateway_id, connection_id in subscribers:
                grouped.setdefault(gateway_id, []).append(connection_id)
            routes = {gateway_id: tuple(ids) for gateway_id, ids in grouped.items()}
            self._routes[topic] = routes
        if exclude is None or exclude not in subscribers:
            return len(subscribers), routes
        gateway_id, connection_id = exclude
        trimmed = dict(routes)
        remaining = tuple(c for c in routes[gateway_id] if c != connection_id)
        if remaining:
            trimmed[gateway_id] = remaining
        else:
            del trimmed[gateway_id]
        return len(subscribers) - 1, trimmed

    def purge_connection(self, location: Location) -> list[str]:
        """Drop every subscription of a connection (it closed); returns the topics it left."""
        topics = self._by_connection.pop(location, set())
        for topic in topics:
            subscribers = self._topics.get(topic)
            if subscribers is not None:
                subscribers.pop(location, None)
                if not subscribers:
                    del self._topics[topic]
            self._routes.pop(topic, None)
        return sorted(topics)

    def purge_gateway(self, gateway_id: str) -> int:
        """Drop every subscription held through a gateway that is gone; returns how many connections."""
        gone = [location for location in self._by_connection if location[0] == gateway_id]
        for location in gone:
            self.purge_connection(location)
        return len(gone)

    def stats(self) -> dict[str, int]:
        return {
            "topics": len(self._topics),
            "subscriptions": sum(len(s) for s in self._topics.values()),
            "connections": len(self._by_connection),
        }


_MISSING = object()
