"""What one Signal Hub connection holds in the shards, counted by its gateway to cap it.

A connection's registrations hash over every registry shard and its subscriptions over every topic
shard, so no shard sees them all; the session that sends the requests does. Counting there also
makes a refusal free: the request never leaves the gateway.
"""

from __future__ import annotations

import math


class Holdings:
    """Keys (registered addresses, subscribed topics) held by one connection, at most ``limit``.

    A key is counted from the moment its request leaves (requests in flight cannot overrun the cap)
    until the answer settles it: held until a deadline (a registration's TTL, ``math.inf`` for a
    subscription), or not at all. A request that timed out may still have run, so the caller
    settles it as held: the count errs on the side of the cap. Taking a key already held or in
    flight (re-registering, subscribing again) takes no new place.
    """

    __slots__ = ("limit", "_until", "_pending")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._until: dict[str, float] = {}  # held key -> when it stops counting
        self._pending: dict[str, int] = {}  # key -> its requests in flight

    def reserve(self, key: str, now: float) -> bool:
        """Count ``key`` in flight, unless that would go over the limit (then False)."""
        if key not in self._pending and self._until.get(key, -math.inf) <= now and self._full(now):
            return False
        self._pending[key] = self._pending.get(key, 0) + 1
        return True

    def settle(self, key: str, until: float | None) -> None:
        """A reserved request answered: ``key`` is held until ``until`` (None: it was refused and
        whatever was held before stays as it was)."""
        left = self._pending[key] - 1
        if left:
            self._pending[key] = left
        else:
            del self._pending[key]
        if until is not None:
            self._until[key] = until

    def hold(self, key: str, until: float) -> None:
        """``key`` is held until ``until`` (a registration renewed)."""
        self._until[key] = until

    def release(self, key: str) -> None:
        """``key`` is no longer held (unregistered, unsubscribed)."""
        self._until.pop(key, None)

    def _full(self, now: float) -> bool:
        until = self._until
        if len(until) + len(self._pending) < self.limit:
            return False
        for key in [key for key, deadline in until.items() if deadline <= now]:
            del until[key]
        return len(until) + sum(1 for key in self._pending if key not in until) >= self.limit
