"""What one Baqend client may ask of a gateway: request rates and live subscriptions, per client.

A client is the subject of its token when it sent a valid one, else its remote address (without
the port: a client opens as many connections as it likes). Pure: no sockets, no actors.
"""

from __future__ import annotations

from router.ratelimit import TokenBucket

PRUNE_AT = 1024  # tracked clients before full buckets are forgotten (then twice the survivors)


def address_client(remote: str, key: str | None) -> str:
    """The client of an anonymous request from ``remote`` (``host:port``): its address as the
    gateway counts it (``key``: IPv4, IPv6 /64), or, from an exempt address such as a load
    balancer's (``key`` None), the connection itself."""
    return "conn:" + remote if key is None else "ip:" + key


def subject_client(subject: str) -> str:
    return "user:" + subject


class ClientRates:
    """A token bucket per client: ``burst`` requests at once, refilled at ``per_minute``.

    A bucket that has refilled completely is the same as a new one, so it is forgotten when the
    table grows: the table holds the clients active within the last refill period, not every
    client ever seen.
    """

    def __init__(self, per_minute: float, burst: int) -> None:
        self.rate = per_minute / 60
        self.burst = float(burst)
        self.buckets: dict[str, TokenBucket] = {}
        self._prune_at = PRUNE_AT

    def take(self, client: str, now: float) -> float:
        """0.0 when the request may go, else the seconds until it could."""
        bucket = self.buckets.get(client)
        if bucket is None:
            if len(self.buckets) >= self._prune_at:
                self._prune(now)
            bucket = self.buckets[client] = TokenBucket(self.rate, self.burst, now)
        return bucket.take(now)

    def _prune(self, now: float) -> None:
        rate, burst = self.rate, self.burst
        self.buckets = {client: bucket for client, bucket in self.buckets.items()
                        if now - bucket.updated < (burst - bucket.tokens) / rate}  # not refilled yet
        self._prune_at = max(PRUNE_AT, 2 * len(self.buckets))


class ClientCounts:
    """Live subscriptions per client; a client at zero is forgotten."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.counts: dict[str, int] = {}

    def acquire(self, client: str) -> bool:
        count = self.counts.get(client, 0)
        if count >= self.limit:
            return False
        self.counts[client] = count + 1
        return True

    def release(self, client: str) -> None:
        count = self.counts.get(client, 0) - 1
        if count > 0:
            self.counts[client] = count
        else:
            self.counts.pop(client, None)
