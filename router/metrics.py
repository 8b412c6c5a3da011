"""Live metrics through ``ray.util.metrics``: the Ray dashboard and its Prometheus endpoint show them.

Ray exports them with a ``ray_`` prefix (``ray_router_messages_in_total``, ...). Recording into Ray
costs a few microseconds per call, so the hot path counts in plain integers and pushes the deltas
about once a second; histograms get a sample: latency at most every 10 ms, batch sizes at most
``SAMPLES_PER_PUSH`` evenly spread ones per push (a thousand observations at once held the event
loop for milliseconds, seen as a latency tail).
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

from ray.util.metrics import Counter, Gauge, Histogram

LATENCY_BOUNDARIES = [0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5]
BATCH_BOUNDARIES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
LATENCY_EVERY_S = 0.01
SAMPLES_PER_PUSH = 64


def spread_sample(values: list[int], limit: int = SAMPLES_PER_PUSH) -> list[int]:
    """At most ``limit`` values, evenly spread over ``values``."""
    if len(values) <= limit:
        return values
    step = len(values) / limit
    return [values[int(i * step)] for i in range(limit)]

_GATEWAY_TAGS = ("gateway", "dialect")


class GatewayMetrics:
    def __init__(self, gateway_id: str) -> None:
        self.gateway_id = gateway_id
        self._connections = Gauge("router_connections", description="Open WebSocket connections",
                                  tag_keys=_GATEWAY_TAGS)
        self._messages_in = Counter("router_messages_in", description="Messages received from clients",
                                    tag_keys=_GATEWAY_TAGS)
        self._messages_out = Counter("router_messages_out", description="Messages delivered to clients",
                                     tag_keys=_GATEWAY_TAGS)
        self._bytes_in = Counter("router_bytes_in", description="Bytes of messages received", tag_keys=_GATEWAY_TAGS)
        self._bytes_out = Counter("router_bytes_out", description="Bytes of messages delivered",
                                  tag_keys=_GATEWAY_TAGS)
        self._rejections = Counter("router_rejections", description="Messages refused, by reason",
                                   tag_keys=_GATEWAY_TAGS + ("reason",))
        self._drops = Counter("router_drops", description="Deliveries dropped, by reason",
                              tag_keys=_GATEWAY_TAGS + ("reason",))
        self._queue = Gauge("router_outbound_queue_bytes", description="Bytes waiting in client send buffers",
                            tag_keys=("gateway",))
        self._latency = Histogram("router_delivery_latency_seconds", description="Ingress to egress latency",
                                  boundaries=LATENCY_BOUNDARIES, tag_keys=_GATEWAY_TAGS)
        self._batch = Histogram("router_gateway_batch_size", description="Commands per Ray call to a shard",
                                boundaries=BATCH_BOUNDARIES, tag_keys=("gateway",))
        self.messages_in: dict[str, int] = defaultdict(int)
        self.bytes_in: dict[str, int] = defaultdict(int)
        self.messages_out: dict[str, int] = defaultdict(int)
        self.bytes_out: dict[str, int] = defaultdict(int)
        self.rejections: dict[tuple[str, str], int] = defaultdict(int)
        self.drops: dict[tuple[str, str], int] = defaultdict(int)
        self._pushed: dict[str, Any] = {}
        self._last_latency = 0.0
        self._batches: list[int] = []

    # -- hot path -------------------------------------------------------------------------

    def latency(self, dialect: str, seconds: float, now: float) -> None:
        if now - self._last_latency >= LATENCY_EVERY_S:
            self._last_latency = now
            self._latency.observe(seconds, tags={"gateway": self.gateway_id, "dialect": dialect})

    def batch(self, size: int) -> None:
        self._batches.append(size)

    # -- once a second --------------------------------------------------------------------

    def publish(self, connections: dict[str, int], outbound_bytes: int) -> None:
        gateway = self.gateway_id
        for dialect, count in connections.items():
            self._connections.set(count, tags={"gateway": gateway, "dialect": dialect})
        self._queue.set(outbound_bytes, tags={"gateway": gateway})
        for name, counter, values in (
            ("in", self._messages_in, self.messages_in),
            ("bytes_in", self._bytes_in, self.bytes_in),
            ("out", self._messages_out, self.messages_out),
            ("bytes_out", self._bytes_out, self.bytes_out),
        ):
            for dialect, total in list(values.items()):
                self._push(counter, (name, dialect), total, {"gateway": gateway, "dialect": dialect})
        for name, counter, values in (("rej", self._rejections, self.rejections), ("drop", self._drops, self.drops)):
            for (dialect, reason), total in list(values.items()):
                self._push(counter, (name, dialect, reason), total,
                           {"gateway": gateway, "dialect": dialect, "reason": reason})
        batches, self._batches = self._batches, []
        tags = {"gateway": gateway}
        for size in spread_sample(batches):
            self._batch.observe(size, tags=tags)

    def _push(self, counter: Counter, key: tuple, total: int, tags: dict[str, str]) -> None:
        delta = total - self._pushed.get(key, 0)
        if delta > 0:
            counter.inc(delta, tags=tags)
            self._pushed[key] = total


class ShardMetrics:
    """Batch sizes and command counts of one shard, pushed to Ray at most once a second."""

    def __init__(self, name: str, kind: str, interval_s: float = 1.0) -> None:
        self._tags = {"shard": name, "kind": kind}
        self._batch = Histogram("router_shard_batch_size", description="Commands per batch a shard executes",
                                boundaries=BATCH_BOUNDARIES, tag_keys=("shard", "kind"))
        self._commands = Counter("router_shard_commands", description="Commands executed by a shard",
                                 tag_keys=("shard", "kind"))
        self._interval_s = interval_s
        self._sizes: list[int] = []
        self._last_push = 0.0

    def batch(self, size: int) -> None:
        self._sizes.append(size)
        now = time.monotonic()
        if now - self._last_push >= self._interval_s:
            self._last_push = now
            sizes, self._sizes = self._sizes, []
            self._commands.inc(sum(sizes), tags=self._tags)
            for observed in spread_sample(sizes):  # a recording costs microseconds: bound the work
                self._batch.observe(observed, tags=self._tags)
