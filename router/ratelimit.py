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
        tokens = self.tokens  # locals and a comparison, not min(): every message passes here
        elapsed = now - self.updated
        if elapsed > 0:
            tokens += elapsed * self.rate
            if tokens > self.capacity:
                tokens = self.capacity
            self.updated = now
        if tokens >= cost:
            self.tokens = tokens - cost
            return 0.0
        self.tokens = tokens
        return (cost - tokens) / self.rate

    @staticmethod
    def retry_after_ms(wait_seconds: float) -> int:
        return max(1, math.ceil(wait_seconds * 1000))
