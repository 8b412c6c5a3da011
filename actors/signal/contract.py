"""Signal Hub between gateways and registry shards: named actors (TTL, capabilities, metadata),
point-to-point and broadcast. Its topics use the core pub/sub (``signal/<topic>``)."""

from __future__ import annotations

from typing import Any

REGISTRY = "registry"  # the shard kind: actors by address


class Op:
    REGISTER = "signal.register"
    UNREGISTER = "signal.unregister"
    RENEW = "signal.renew"
    SEND = "signal.send"
    DISCOVER = "signal.discover"
    DESCRIBE = "signal.describe"
    BROADCAST = "signal.broadcast"
    RESTORE = "signal.restore"


def topic_key(topic: str) -> str:
    """Signal Hub topics live under ``signal/`` in the core topic namespace."""
    return "signal/" + topic


def register(address: str, connection_id: int, session_id: str, capabilities: Any, metadata: Any,
             ttl_ms: int) -> tuple:
    """Answers the Registration (its renewal token and expiry)."""
    return (Op.REGISTER, address, connection_id, session_id, capabilities, metadata, ttl_ms)


def restore(address: str, connection_id: int, session_id: str, capabilities: Any, metadata: Any,
            registered_at: int, expires_at: int, version: int, renewal_token: str) -> tuple:
    """Re-announce a registration (as its ``register``/``renew`` answered it) to a registry shard
    that restarted empty; answers whether it was taken back (not if expired, or taken meanwhile)."""
    return (Op.RESTORE, address, connection_id, session_id, capabilities, metadata, registered_at, expires_at,
            version, renewal_token)


def unregister(address: str, connection_id: int) -> tuple:
    """Answers the shard's time (ms)."""
    return (Op.UNREGISTER, address, connection_id)


def renew(address: str, connection_id: int, token: str, ttl_ms: int) -> tuple:
    return (Op.RENEW, address, connection_id, token, ttl_ms)


def send(address: str, payload: Any, kind: int, meta: tuple | None = None) -> tuple:
    """Deliver to the actor registered at ``address``; answers False if there is none."""
    return (Op.SEND, address, payload, kind, meta)


def discover(pattern: str | None, capabilities: Any, metadata: Any, window: int) -> tuple:
    """Answers (matches, the addresses of the first ``window``): matches is exact up to ``window``
    and ``window + 1`` when more matched. Addresses only: a page's entries come from ``describe``."""
    return (Op.DISCOVER, pattern, capabilities, metadata, window)


def describe(addresses: list[str]) -> tuple:
    """Answers the public view of each address still registered here, in the given order."""
    return (Op.DESCRIBE, addresses)


def broadcast(payload: Any, kind: int, exclude: int | None = None, meta: tuple | None = None) -> tuple:
    """Deliver to every registered actor but ``exclude``; answers how many."""
    return (Op.BROADCAST, payload, kind, exclude, meta)
