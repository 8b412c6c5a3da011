"""Killing and stopping router processes in the tests: a shard by SIGKILL, a process by SIGSTOP
(until every thread of it is stopped), and the healing time measured after a kill."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import ray

from router.shardmap import shard_index
from tests.stopping import stop, thread_states, threads_stopped  # noqa: F401 (re-exported)

HEAL_LIMIT_S = 5.0  # the bound: from a kill until a new message reaches every old subscriber


def shard_info(router: Any, kind: str, index: int = 0) -> dict[str, Any]:
    return ray.get(router.shards[kind][index].info.remote(), timeout=30)


def epoch_of(router: Any, kind: str, index: int = 0) -> str | None:
    """The shard's epoch, or None while it is restarting."""
    try:
        return ray.get(router.shards[kind][index].info.remote(), timeout=5)["epoch"]
    except Exception:
        return None


def kill_shard(router: Any, kind: str, index: int = 0) -> tuple[float, str]:
    """SIGKILL shard ``index`` of ``kind``; returns when it was killed and the epoch it had."""
    info = shard_info(router, kind, index)
    os.kill(info["pid"], signal.SIGKILL)
    return time.monotonic(), info["epoch"]


def owner(router: Any, kind: str, key: str) -> int:
    """The index of the shard of ``kind`` that holds ``key``."""
    return shard_index(key, len(router.shards[kind]))


class HealingTimes(dict):
    """Healing times by name, for a module to print at its end."""

    def healed(self, name: str, killed_at: float, at: float | None = None) -> float:
        took = (at if at is not None else time.monotonic()) - killed_at
        self[name] = took
        assert took < HEAL_LIMIT_S, f"{name} took {took:.2f}s to heal"
        return took

    def report(self, title: str) -> None:
        print(f"\n{title} healing times (s):", {name: round(value, 3) for name, value in self.items()})
