"""Stable placement of keys (topics, addresses, sessions) onto named shard actors.

The hash must be the same in every process and across restarts, so Python's salted ``hash``
is never used: xxh64 of the UTF-8 key, modulo the shard count.
"""

from __future__ import annotations

from typing import Any

import xxhash

SESSION = "session"
TOPIC = "topic"
REGISTRY = "registry"
DOCUMENT = "document"  # Baqend documents, by id
QUERY = "query"  # Baqend real-time queries, by subscription
SHARD_KINDS = (SESSION, TOPIC, REGISTRY)
BAQEND_SHARD_KINDS = (DOCUMENT, QUERY)
ALL_SHARD_KINDS = SHARD_KINDS + BAQEND_SHARD_KINDS

GATEWAY_PREFIX = "gateway-"


def shard_kinds(settings: Any) -> tuple[str, ...]:
    """The kinds a router with ``settings`` starts: Baqend's only when the dialect is enabled."""
    return ALL_SHARD_KINDS if settings.baqend.enabled else SHARD_KINDS


def shard_index(key: str, count: int) -> int:
    """Index of the shard that owns ``key`` among ``count`` shards."""
    if count == 1:
        return 0
    return xxhash.xxh64_intdigest(key.encode("utf-8", "surrogatepass")) % count


def shard_name(kind: str, index: int) -> str:
    """Ray actor name of a shard, as the Ray dashboard shows it: ``topic-shard-3``."""
    return f"{kind}-shard-{index}"


def gateway_name(gateway_id: str) -> str:
    return GATEWAY_PREFIX + gateway_id
