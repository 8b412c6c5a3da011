"""What a lane costs: opening one, a round trip, and batch throughput, over Unix and TLS-over-TCP.

A shard's LaneServer runs in a child process (as in a shard, its own event loop in a thread) and
echoes every batch; the parent is the gateway on uvloop. Commands are 100 random bytes each, so
pickle cannot share them; throughput keeps 4 batches of 100 in flight, like a gateway's link.

    router bench lanes [--lanes unix,tcp] [--lane-seconds 3]
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import statistics
import time
from typing import Any

from router import lane
from router.proc import new_event_loop

CONNECTS = 20
ROUND_TRIPS = 3000
BATCH = 100
IN_FLIGHT = 4


def _serve(kind: str, pipe) -> None:
    server = lane.LaneServer("bench", lambda gateway_id, commands: (commands, None))
    if kind == "unix":
        pipe.send(("unix", server.unix_address(), server.secret))
    else:
        host, port = server.tcp_address("127.0.0.1")
        pipe.send(("tcp", host, port, server.secret, server.certificate))
    pipe.recv()
    server.close()


async def _measure(address: tuple, seconds: float) -> dict[str, float]:
    loop = asyncio.get_running_loop()
    waiting: list[asyncio.Future] = []

    def factory() -> lane.LaneClient:
        return lane.LaneClient(lambda results, bundle: waiting.pop(0).set_result(results), lambda bundle: None,
                               lambda client, exc: None)

    def call(client: lane.LaneClient, commands: list) -> asyncio.Future:
        future = loop.create_future()
        waiting.append(future)
        client.call(commands)
        return future

    started = time.perf_counter()
    for _ in range(CONNECTS):  # open, one call, close
        client = await lane.connect(loop, address, "gw-bench", factory)
        await asyncio.wait_for(call(client, [("op", b"x")]), 10)
        client.close()
    connect_ms = (time.perf_counter() - started) / CONNECTS * 1000

    client = await lane.connect(loop, address, "gw-bench", factory)
    round_trips = []
    for _ in range(ROUND_TRIPS):
        sent = time.perf_counter()
        await asyncio.wait_for(call(client, [("op", os.urandom(100))]), 10)
        round_trips.append(time.perf_counter() - sent)

    batch = [("op", os.urandom(100)) for _ in range(BATCH)]
    answered, inflight = 0, set()
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        while len(inflight) < IN_FLIGHT:
            inflight.add(call(client, batch))
        done, inflight = await asyncio.wait(inflight, return_when=asyncio.FIRST_COMPLETED)
        answered += len(done)
    if inflight:
        await asyncio.wait(inflight)
        answered += len(inflight)
    elapsed = time.perf_counter() - started
    client.close()
    return {"connect_ms": connect_ms, "rtt_p50_us": statistics.median(round_trips) * 1e6,
            "rtt_p99_us": statistics.quantiles(round_trips, n=100)[98] * 1e6,
            "commands_per_s": answered * BATCH / elapsed}


def run(kinds: list[str], seconds: float) -> list[dict[str, Any]]:
    """Measure each kind of lane (``unix``, ``tcp``) against a LaneServer in a child process."""
    rows = []
    for kind in kinds:
        parent, child = mp.Pipe()
        shard = mp.get_context("fork").Process(target=_serve, args=(kind, child), daemon=True)
        shard.start()
        try:
            result = new_event_loop().run_until_complete(_measure(parent.recv(), seconds))
        finally:
            parent.send("stop")
            shard.join(10)
        print(f"{kind}: open + 1 call {result['connect_ms']:.2f} ms; "
              f"round trip p50 {result['rtt_p50_us']:.0f} µs, p99 {result['rtt_p99_us']:.0f} µs; "
              f"{result['commands_per_s']:,.0f} commands/s "
              f"({BATCH}-command batches, {IN_FLIGHT} in flight)", flush=True)
        rows.append({"lane": kind, **{key: round(value, 2) for key, value in result.items()}})
    return rows
