"""Baqend real-time queries: matched writes per second with 1,000 active queries, and write→event latency.

Starts an embedded router (1 gateway, ``--document-shards`` and ``--query-shards``), opens
``--connections`` connections holding ``--queries`` real-time queries in all on one bucket: query
*i* is ``{"g": i % groups}`` (``groups`` = queries / ``--per-group``), one in ten of them sorted by
``n`` with a limit of 10, so every write (a document with a random ``g``) matches ``--per-group``
queries. Then:

- flood: ``--writes`` REST inserts, ``--concurrency`` in flight; matched writes/s = writes / (first
  request → the last write's last expected event), events/s likewise;
- paced: ``--paced`` writes one at a time; latency = request sent → first event of that write.

    .venv/bin/python benchmarks/baqend_queries.py [--queries 1000] [--writes 5000] [--paced 500]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from router.bench.report import write_json  # noqa: E402


async def bench(args: argparse.Namespace, port: int) -> dict:
    import aiohttp
    import orjson
    from websockets.asyncio.client import connect

    groups = args.queries // args.per_group
    url, base = f"ws://127.0.0.1:{port}/v1/events", f"http://127.0.0.1:{port}/v1"
    seen: dict[int, list] = {}  # write id -> [sent at, first event at, events]
    done: dict[int, asyncio.Future] = {}
    loop = asyncio.get_running_loop()

    async def listen(ws) -> None:
        async for frame in ws:
            message = orjson.loads(frame)
            if message["type"] != "match" or message["operation"] != "insert":
                continue
            record = seen.get(message["data"]["w"])
            if record is None:
                continue
            if record[1] is None:
                record[1] = time.perf_counter()
            record[2] += 1
            if record[2] == args.per_group:
                done[message["data"]["w"]].set_result(None)

    sockets = []
    per_connection = args.queries // args.connections
    query_index = 0
    for _ in range(args.connections):
        ws = await connect(url, max_queue=None, max_size=None, ping_interval=None)
        for n in range(per_connection):
            fields = {"id": f"q{query_index}", "type": "subscribe", "bucket": "Bench", "initial": True,
                      "query": json.dumps({"g": query_index % groups})}
            if query_index % 10 == 0:
                fields.update(sort=json.dumps({"n": -1}), limit=10)
            await ws.send(orjson.dumps(fields))
            query_index += 1
        for _ in range(per_connection):
            assert orjson.loads(await ws.recv())["type"] == "result"
        sockets.append(ws)
    listeners = [asyncio.create_task(listen(ws)) for ws in sockets]
    rng = random.Random(1)
    write_ids = iter(range(1, 10**9))

    async def one_write(session) -> float:
        w = next(write_ids)
        # n grows: an insert always lands on top of the sorted windows (add/insert for each query)
        body = orjson.dumps({"id": f"/db/Bench/w{w}", "g": rng.randrange(groups), "n": w, "w": w})
        done[w] = loop.create_future()
        seen[w] = [time.perf_counter(), None, 0]
        async with session.post(base + "/db/Bench", data=body) as reply:
            assert reply.status == 201, await reply.text()
        await done[w]
        return w

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=args.concurrency)) as session:
        for _ in range(50):  # warm up
            await one_write(session)
        queue = iter(range(args.writes))
        started = time.perf_counter()

        async def worker() -> None:
            for _ in queue:
                await one_write(session)

        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
        flood_s = time.perf_counter() - started
        flood_ids = list(seen)[-args.writes:]
        flood_latency = sorted((seen[w][1] - seen[w][0]) * 1000 for w in flood_ids)
        paced_ids = []
        for _ in range(args.paced):
            paced_ids.append(await one_write(session))
        paced = sorted((seen[w][1] - seen[w][0]) * 1000 for w in paced_ids)
    for task in listeners:
        task.cancel()
    for ws in sockets:
        await ws.close()
    pick = lambda values, q: round(values[min(len(values) - 1, int(q * len(values)))], 2)  # noqa: E731
    return {
        "queries": args.queries, "connections": args.connections, "matches_per_write": args.per_group,
        "writes": args.writes, "concurrency": args.concurrency, "flood_seconds": round(flood_s, 3),
        "matched_writes_per_s": int(args.writes / flood_s), "events_per_s": int(args.writes * args.per_group / flood_s),
        "flood_latency_ms_p50": pick(flood_latency, 0.5), "flood_latency_ms_p99": pick(flood_latency, 0.99),
        "paced_writes": args.paced, "latency_ms_p50": pick(paced, 0.5), "latency_ms_p99": pick(paced, 0.99),
        "latency_ms_max": round(paced[-1], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--connections", type=int, default=10)
    parser.add_argument("--per-group", type=int, default=10, help="queries each write matches")
    parser.add_argument("--writes", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--paced", type=int, default=500)
    parser.add_argument("--document-shards", type=int, default=2)
    parser.add_argument("--query-shards", type=int, default=2)
    parser.add_argument("--eventlog", choices=("on", "off"), default="on")
    parser.add_argument("--out", default="benchmarks/results/baqend_queries.json")
    args = parser.parse_args()

    from router.settings import load_settings
    from router.runtime import Router

    with tempfile.TemporaryDirectory() as data_dir:
        settings = load_settings(
            port=0, namespace=f"bench-baqend-{os.getpid()}", ray_dashboard=False, data_dir=data_dir,
            shards={"session": 1, "topic": 1, "registry": 1, "document": args.document_shards,
                    "query": args.query_shards},
            signal={"enabled": False}, cashu={"enabled": False}, mx={"enabled": False},
            analytics={"enabled": args.eventlog == "on"},
            # One client (this address) holds every query and floods REST: lift the per-client limits.
            baqend={"max_subscriptions": args.queries, "max_client_subscriptions": args.queries,
                    "rest_rate_limit_per_minute": 6_000_000, "rest_rate_limit_burst": 100_000,
                    "subscribe_rate_limit_per_minute": 6_000_000, "subscribe_rate_limit_burst": 100_000})
        router = Router(settings)
        try:
            port = router.start()[0]["listeners"][0]["port"]
            result = asyncio.run(bench(args, port))
        finally:
            router.stop()
    result.update(document_shards=args.document_shards, query_shards=args.query_shards, eventlog=args.eventlog,
                  cpus=os.cpu_count())
    print(json.dumps(result, indent=2))
    write_json(Path(args.out), result)


if __name__ == "__main__":
    main()
