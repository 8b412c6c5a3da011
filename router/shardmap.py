"""Stable placement of keys (topics, addresses, sessions) onto named shard actors.

The hash must be the same in every process and across restarts, so Python's salted ``hash``
is never used: xxh64 of the UTF-8 key, modulo the shard count.
"""

from __future__ import annotations

import xxhash

# The core's shard kinds; dialects add their own (``gateways/dialects.py`` lists which).
SESSION = "session"  # per client identity: what a session keeps while it is away
TOPIC = "topic"  # per topic: subscribers, and what dialects keep per topic or room

GATEWAY_PREFIX = "gateway-"
SHARD_SUFFIX = "-shard-"


def shard_index(key: str, count: int) -> int:
    """Index of the shard that owns ``key`` among ``count`` shards."""
    if count == 1:
        return 0
    return xxhash.xxh64_intdigest(key.encode("utf-8", "surrogatepass")) % count


def shard_name(kind: str, index: int) -> str:
    """Ray actor name of a shard, as the Ray dashboard shows it: ``topic-shard-3``."""
    return f"{kind}{SHARD_SUFFIX}{index}"


def gateway_name(gateway_id: str) -> str:
    return GATEWAY_PREFIX + gateway_id
