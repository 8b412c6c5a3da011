"""Token bucket: ``rate`` tokens per second refill up to ``capacity``; one message costs one token."""

from __future__ import annotations

import math


class TokenBucket:
    __slots__ = ("rate", "capacity", "tokens", "updated")

    def __init__(self, rate_per_second: float, capacity: float, now: float) -> None:
        self.rate = rate_per_second
        self.capacity = capacity
        self.tokens = capacity
        self.updated = now

    def take(self, now: float, cost: float = 1.0) -> float:
        """Take ``cost`` tokens; returns 0.0 on success, else the seconds until they would be there."""
        elapsed = now - self.updated
        if elapsed > 0:
            self.tokens = min(self.capacity, self.tokens + elapsed * self.rate)
            self.updated = now
        if self.tokens >= cost:
            self.tokens -= cost
            return 0.0
        return (cost - self.tokens) / self.rate

    @staticmethod
    def retry_after_ms(wait_seconds: float) -> int:
        return max(1, math.ceil(wait_seconds * 1000))
