"""Idle connections: a quiet peer is pinged, a silent one is closed.

Neither an mx hub consumer without ACKs, a node between blocks, nor a Baqend client waiting for
events has to send anything, so silence alone says nothing; a peer that does not answer a ping either is gone (a half-open TCP
connection) or holds the socket without speaking WebSocket. The server stamps
``wire.last_activity`` on every byte received, pongs included.
"""

from __future__ import annotations

from typing import Any, Callable

CLOSE_IDLE = 1001
PING = "ping"
IDLE = "idle"


class Keepalive:
    """When to ping a connection and when to call it idle (times are ``time.monotonic()``)."""

    __slots__ = ("ping_interval_s", "idle_timeout_s", "pinged_at")

    def __init__(self, ping_interval_s: float, idle_timeout_s: float) -> None:
        self.ping_interval_s = ping_interval_s
        self.idle_timeout_s = idle_timeout_s
        self.pinged_at = float("-inf")

    def due(self, last_activity: float, now: float) -> str | None:
        """IDLE: nothing received for ``idle_timeout_s``; PING: quiet for ``ping_interval_s`` and
        not pinged within it; else None."""
        quiet = now - last_activity
        if quiet > self.idle_timeout_s:
            return IDLE
        if quiet >= self.ping_interval_s and now - self.pinged_at >= self.ping_interval_s:
            self.pinged_at = now
            return PING
        return None

    def reason(self) -> str:
        return f"idle for {self.idle_timeout_s:g} s"

    def tend(self, wire: Any, now: float, close_idle: Callable[[str], None]) -> None:
        """Ping ``wire`` when it is due; ``close_idle(reason)`` when it has been silent too long."""
        due = self.due(wire.last_activity, now)
        if due == IDLE:
            close_idle(self.reason())
        elif due == PING:
            wire.ping()

