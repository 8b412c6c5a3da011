"""Cashu NUT-17 notification rate: states pushed by the mint → notifications to wallet subscriptions.

Starts an embedded router with the state feed on, opens ``--connections`` wallet connections in
load-generator processes holding ``--subscriptions`` subscriptions in all (each to one of
``--objects`` mint quotes, so every quote has subscriptions/objects subscribers), then pushes
``--rounds`` states per quote through ``POST /v1/ws/state`` (``--batch`` states per request) and
measures notifications per second and push→notification latency. Bounded in count and time.

    .venv/bin/python benchmarks/cashu_notify.py [--connections 100] [--subscriptions 1000] [--objects 100]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from router.bench.report import write_json  # noqa: E402
from router.proc import new_event_loop  # noqa: E402

API_KEY = "bench-feed-key"



def _wallets(url: str, plan: list[list[str]], expected: int, ready, result, timeout_s: float) -> None:
    """One process: a connection per entry of ``plan`` (its quote ids), counting notifications."""
    import orjson
    from websockets.asyncio.client import connect

    async def main() -> None:
        connections = []
        for index, quotes in enumerate(plan):
            ws = await connect(url, max_queue=None, max_size=None, ping_interval=None)
            for n, quote in enumerate(quotes):
                await ws.send(orjson.dumps({"jsonrpc": "2.0", "id": n, "method": "subscribe",
                                            "params": {"kind": "bolt11_mint_quote", "filters": [quote],
                                                       "subId": f"c{index}s{n}"}}))
                while True:  # the OK, then the quote's current state (UNPAID)
                    reply = orjson.loads(await ws.recv())
                    if "id" in reply:
                        assert reply["result"]["status"] == "OK", reply
                        break
            connections.append(ws)
        ready.set()
        latencies: list[float] = []
        received = [0]
        first = [0.0]
        last = [0.0]

        async def drain(ws) -> None:
            async for frame in ws:
                now = time.time_ns()
                payload = orjson.loads(frame)["params"]["payload"]
                if payload.get("state") != "PAID":
                    continue  # the initial UNPAID
                if not first[0]:
                    first[0] = time.perf_counter()
                received[0] += 1
                latencies.append((now - payload["pushed_ns"]) / 1e6)
                last[0] = time.perf_counter()
                if received[0] >= expected:
                    return

        tasks = [asyncio.ensure_future(drain(ws)) for ws in connections]
        done_waiting = asyncio.ensure_future(_until(lambda: received[0] >= expected))
        await asyncio.wait([done_waiting], timeout=timeout_s)
        for task in tasks:
            task.cancel()
        result.put({"received": received[0], "first": first[0], "last": last[0], "latencies_ms": latencies[::10]})
        for ws in connections:
            await ws.close()

    new_event_loop().run_until_complete(main())


async def _until(condition) -> None:
    while not condition():
        await asyncio.sleep(0.01)


def _pusher(http_url: str, quotes: list[str], rounds: int, batch: int, concurrency: int, start, done) -> None:
    import aiohttp
    import orjson

    async def main() -> None:
        start.wait()
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {API_KEY}"}) as session:
            bodies = []
            for round_ in range(rounds):
                for offset in range(0, len(quotes), batch):
                    bodies.append([{"kind": "bolt11_mint_quote", "payload": {
                        "quote": quote, "state": "PAID", "amount": 100, "unit": "sat", "amount_paid": round_}}
                        for quote in quotes[offset:offset + batch]])
            slots = asyncio.Semaphore(concurrency)

            async def send(states) -> None:
                async with slots:
                    now = time.time_ns()
                    for state in states:
                        state["payload"]["pushed_ns"] = now
                    async with session.post(http_url + "/v1/ws/state", data=orjson.dumps({"states": states})) as reply:
                        assert reply.status == 200, await reply.text()

            await asyncio.gather(*(send(states) for states in bodies))
        done.set()

    new_event_loop().run_until_complete(main())


def run(args: argparse.Namespace, data_dir: str) -> dict:
    from router.settings import load_settings
    from router.runtime import Router
    from gateways.cashu.feed import StateFeed

    settings = load_settings(
        port=0, gateways=args.gateways, namespace=f"bench-cashu-{os.getpid()}", ray_dashboard=False, data_dir=data_dir,
        shards={"session": 1, "topic": args.topic_shards, "registry": 1}, signal={"enabled": False},
        analytics={"enabled": args.eventlog == "on"},
        cashu={"state_api_key": API_KEY, "max_subscriptions": 10_000, "rate_limit_per_second": 1e9,
               "rate_limit_burst": 1_000_000})
    router = Router(settings)
    endpoints = router.start()
    ports = [gateway["listeners"][0]["port"] for gateway in endpoints]
    quotes = [f"bench-quote-{n}" for n in range(args.objects)]
    try:
        feed = StateFeed(f"http://127.0.0.1:{ports[0]}", API_KEY)
        for offset in range(0, len(quotes), 500):
            feed.push_many([("bolt11_mint_quote", {"quote": q, "state": "UNPAID"}) for q in quotes[offset:offset + 500]])
        per_connection = args.subscriptions // args.connections
        plans = [[quotes[(c * per_connection + n) % len(quotes)] for n in range(per_connection)]
                 for c in range(args.connections)]
        ctx = mp.get_context("spawn")
        result = ctx.Queue()
        readies, processes = [], []
        for index in range(args.processes):
            mine = plans[index::args.processes]
            expected = sum(len(plan) for plan in mine) * args.rounds
            ready = ctx.Event()
            url = f"ws://127.0.0.1:{ports[index % len(ports)]}/v1/ws"
            process = ctx.Process(target=_wallets, args=(url, mine, expected, ready, result, args.timeout))
            process.start()
            readies.append(ready)
            processes.append(process)
        for ready in readies:
            if not ready.wait(120):
                raise RuntimeError("wallets did not connect in time")
        start, done = ctx.Event(), ctx.Event()
        pusher = ctx.Process(target=_pusher, args=(f"http://127.0.0.1:{ports[0]}", quotes, args.rounds, args.batch,
                                                   args.concurrency, start, done))
        pusher.start()
        started = time.perf_counter()
        start.set()
        outcomes = [result.get(timeout=args.timeout + 60) for _ in processes]
        pusher.join(60)
        for process in processes:
            process.join(30)
    finally:
        router.stop()
    received = sum(o["received"] for o in outcomes)
    expected = args.rounds * args.subscriptions
    first = min(o["first"] for o in outcomes if o["first"])
    last = max(o["last"] for o in outcomes)
    latencies = sorted(x for o in outcomes for x in o["latencies_ms"])
    pick = lambda q: round(latencies[min(len(latencies) - 1, int(q * len(latencies)))], 2)  # noqa: E731
    return {
        "connections": args.connections, "subscriptions": args.subscriptions, "objects": args.objects,
        "states_pushed": args.rounds * args.objects, "notifications_expected": expected,
        "notifications_received": received, "seconds": round(last - first, 3),
        "notifications_per_s": int(received / (last - first)) if last > first else 0,
        "states_per_s": int(args.rounds * args.objects / (last - first)) if last > first else 0,
        "latency_ms_p50": pick(0.5), "latency_ms_p99": pick(0.99), "latency_ms_max": round(latencies[-1], 2),
        "wall_s": round(time.perf_counter() - started, 2), "gateways": args.gateways, "eventlog": args.eventlog,
        "cpus": os.cpu_count(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--connections", type=int, default=100)
    parser.add_argument("--subscriptions", type=int, default=1000, help="in all, spread evenly over the connections")
    parser.add_argument("--objects", type=int, default=100, help="distinct mint quotes")
    parser.add_argument("--rounds", type=int, default=100, help="states pushed per quote")
    parser.add_argument("--batch", type=int, default=100, help="states per push request")
    parser.add_argument("--concurrency", type=int, default=4, help="push requests in flight")
    parser.add_argument("--processes", type=int, default=2, help="wallet load-generator processes")
    parser.add_argument("--gateways", type=int, default=1)
    parser.add_argument("--topic-shards", type=int, default=2)
    parser.add_argument("--eventlog", choices=("on", "off"), default="on")
    parser.add_argument("--timeout", type=float, default=120)
    parser.add_argument("--out", default="benchmarks/results/cashu_notify.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="router-bench-") as data_dir:
        row = run(args, data_dir)
    print("  ".join(f"{k}={v}" for k, v in row.items()))
    write_json(Path(args.out), row)
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
