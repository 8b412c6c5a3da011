"""Quick Signal Hub measurement: point-to-point rate, publish fan-out rate, round-trip latency.

Starts an embedded router (rate limit lifted), drives it from load-generator processes on
127.0.0.1, prints a table and writes JSON. A baseline for later work, not the full benchmark
suite: every run is bounded in messages and seconds.

    .venv/bin/python benchmarks/signal_quick.py [--messages 50000] [--subscribers 100] [--gateways 1]
    .venv/bin/python benchmarks/signal_quick.py --eventlog compare   # what the event log costs
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from router.proc import new_event_loop  # noqa: E402

HUB = "cloudflare/signal-hub"
BODY = "x" * 40  # with the envelope, about 100-byte messages



async def _open(url: str, address: str, register: bool = False, topic: str | None = None):
    from websockets.asyncio.client import connect

    ws = await connect(url, max_queue=None, max_size=None, ping_interval=None)
    await ws.send(json.dumps({"type": "hub:connect", "from": address, "to": HUB, "payload": {"version": "1.0"}}))
    await ws.recv()
    if register:
        await ws.send(json.dumps({"type": "hub:register", "from": address, "to": HUB,
                                  "payload": {"actorAddress": address}}))
        await ws.recv()
    if topic is not None:
        await ws.send(json.dumps({"type": "hub:subscribe", "from": address, "to": HUB, "payload": {"topic": topic}}))
        await ws.recv()
    return ws


def _receivers(url: str, count: int, per_connection: int, mode: str, ready, result) -> None:
    async def main() -> None:
        clients = [await _open(url, f"bench/r{i}", register=mode == "p2p", topic="bench" if mode == "fanout" else None)
                   for i in range(count)]
        ready.set()
        first = [0.0]

        async def drain(ws) -> None:
            for n in range(per_connection):
                await ws.recv()
                if not first[0]:
                    first[0] = time.perf_counter()

        await asyncio.gather(*(drain(ws) for ws in clients))
        result.put({"elapsed": time.perf_counter() - first[0], "received": count * per_connection})
        for ws in clients:
            await ws.close()

    new_event_loop().run_until_complete(main())


def _sender(url: str, messages: int, mode: str, window: int, ready, done) -> None:
    async def main() -> None:
        ws = await _open(url, "bench/sender")
        ready.wait()
        if mode == "p2p":
            frame = json.dumps({"type": "hub:send", "from": "bench/sender", "to": "bench/r0", "payload": {"b": BODY}})
            for _ in range(messages):
                await ws.send(frame)
        else:
            frame = json.dumps({"type": "hub:publish", "from": "bench/sender", "to": HUB,
                                "payload": {"topic": "bench", "message": BODY}})
            outstanding = 0
            for _ in range(messages):
                await ws.send(frame)
                outstanding += 1
                while outstanding >= window:
                    await ws.recv()
                    outstanding -= 1
            while outstanding:
                await ws.recv()
                outstanding -= 1
        done.set()
        await ws.close()

    new_event_loop().run_until_complete(main())


def run_rate(send_url: str, recv_url: str, mode: str, subscribers: int, messages: int,
             gateway_pids: list[int] = ()) -> dict:
    ctx = mp.get_context("spawn")
    ready, done, result = ctx.Event(), ctx.Event(), ctx.Queue()
    receivers = 1 if mode == "p2p" else subscribers
    per_connection = messages if mode == "p2p" else messages // subscribers * 1
    publishes = messages if mode == "p2p" else per_connection
    rx = ctx.Process(target=_receivers, args=(recv_url, receivers, per_connection, mode, ready, result))
    tx = ctx.Process(target=_sender, args=(send_url, publishes, mode, 64, ready, done))
    gateways = [psutil.Process(pid) for pid in gateway_pids]
    cpu_before = sum(_cpu_seconds(g) for g in gateways)
    rx.start()
    tx.start()
    outcome = result.get(timeout=300)
    tx.join(60)
    rx.join(60)
    cpu = sum(_cpu_seconds(g) for g in gateways) - cpu_before
    rate = outcome["received"] / outcome["elapsed"]
    row = {"scenario": mode if mode == "p2p" else f"publish to {subscribers}", "delivered": outcome["received"],
           "seconds": round(outcome["elapsed"], 3), "deliveries_per_s": round(rate)}
    if gateways:  # the gateways' CPU per delivered message: steadier than the rate on a busy machine
        row["gateway_cpu_us_per_delivery"] = round(cpu / outcome["received"] * 1e6, 2)
    return row


def _cpu_seconds(process: "psutil.Process") -> float:
    times = process.cpu_times()
    return times.user + times.system


def run_latency(send_url: str, recv_url: str, samples: int) -> dict:
    async def main() -> dict:
        receiver = await _open(recv_url, "bench/lat-r", register=True)
        sender = await _open(send_url, "bench/lat-s")
        frame = json.dumps({"type": "hub:send", "from": "bench/lat-s", "to": "bench/lat-r", "payload": {"b": BODY}})
        beat = json.dumps({"type": "hub:heartbeat", "from": "bench/lat-s", "to": HUB, "payload": {}})
        one_way, heartbeat = [], []
        for _ in range(samples):
            started = time.perf_counter()
            await sender.send(frame)
            await receiver.recv()
            one_way.append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            await sender.send(beat)
            await sender.recv()
            heartbeat.append((time.perf_counter() - started) * 1000)
        await sender.close()
        await receiver.close()
        q = statistics.quantiles
        return {"scenario": "latency", "send_p50_ms": round(q(one_way, n=100)[49], 3),
                "send_p99_ms": round(q(one_way, n=100)[98], 3), "heartbeat_rtt_p50_ms": round(q(heartbeat, n=100)[49], 3)}

    return new_event_loop().run_until_complete(main())


def measure(args: argparse.Namespace, eventlog: bool, data_dir: str) -> tuple[dict, list[dict]]:
    """Start a router, run the scenarios against it, stop it."""
    from router.settings import load_settings
    from router.runtime import Router

    settings = load_settings(port=0, gateways=args.gateways, namespace=f"bench-{os.getpid()}", ray_dashboard=False,
                             data_dir=data_dir, analytics={"enabled": eventlog, "sample_rate": args.sample_rate},
                             signal={"rate_limit_per_minute": 1e12})
    router = Router(settings)
    endpoints = router.start()
    urls = [f"ws://127.0.0.1:{listener['port']}/signal" for gateway in endpoints for listener in gateway["listeners"]]
    send_url, recv_url = urls[0], urls[-1]
    import ray

    pids = [ray.get(record.actor.stats.remote())["pid"] for record in router.gateways]
    try:
        rows = [
            run_rate(send_url, recv_url, "p2p", 1, args.messages, pids),
            run_rate(send_url, recv_url, "fanout", args.subscribers, args.messages * 4, pids),
        ]
        if args.samples:
            rows.append(run_latency(send_url, recv_url, args.samples))
    finally:
        router.stop()
    machine = {"cpus": os.cpu_count(), "python": sys.version.split()[0], "gateways": args.gateways,
               "cross_gateway": send_url != recv_url, "eventlog": eventlog}
    return machine, rows


def compare_eventlog(args: argparse.Namespace, data_dir: str) -> dict:
    """The event log off and on, in alternating runs: best rates, and median gateway CPU per delivery."""
    rates: dict[tuple[bool, str], list[float]] = {}
    cpu: dict[tuple[bool, str], list[float]] = {}
    for _ in range(args.rounds):
        for eventlog in (False, True):
            _, rows = measure(args, eventlog, data_dir)
            for row in rows:
                key = (eventlog, row["scenario"])
                rates.setdefault(key, []).append(row["deliveries_per_s"])
                cpu.setdefault(key, []).append(row["gateway_cpu_us_per_delivery"])
                print(f"  event log {'on ' if eventlog else 'off'}  {row['scenario']:<16} "
                      f"{row['deliveries_per_s']:>9,} deliveries/s  "
                      f"{row['gateway_cpu_us_per_delivery']:>6.2f} us gateway CPU per delivery", flush=True)
    comparison = {}
    for scenario in sorted({scenario for _, scenario in rates}):
        off, on = max(rates[(False, scenario)]), max(rates[(True, scenario)])
        cpu_off, cpu_on = statistics.median(cpu[(False, scenario)]), statistics.median(cpu[(True, scenario)])
        comparison[scenario] = {"off": off, "on": on, "on_vs_off": round(on / off, 3),
                                "cpu_us_off": cpu_off, "cpu_us_on": cpu_on, "cpu_on_vs_off": round(cpu_on / cpu_off, 3)}
    return comparison


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=50_000, help="messages per rate scenario")
    parser.add_argument("--subscribers", type=int, default=100)
    parser.add_argument("--gateways", type=int, default=1)
    parser.add_argument("--samples", type=int, default=2000, help="latency samples (0: skip latency)")
    parser.add_argument("--eventlog", choices=("on", "off", "compare"), default="on",
                        help="the analytics event log: on (the default config), off, or compare both")
    parser.add_argument("--rounds", type=int, default=2, help="with --eventlog compare: alternating rounds")
    parser.add_argument("--sample-rate", type=float, default=1.0, help="analytics.sample_rate when the log is on")
    parser.add_argument("--out", default="benchmarks/results/signal_quick.json")
    parser.add_argument("--data-dir", help="keep the router's data (the event log) here instead of a temporary folder")
    args = parser.parse_args()

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="router-bench-") as temporary:
        data_dir = args.data_dir or temporary
        if args.eventlog == "compare":
            args.samples = 0
            comparison = compare_eventlog(args, data_dir)
            print("event log on vs off (best of each):")
            for scenario, row in comparison.items():
                print(f"  {scenario:<16} best rate: off {row['off']:>9,}/s  on {row['on']:>9,}/s "
                      f"(x{row['on_vs_off']:.3f});  median gateway CPU per delivery: off {row['cpu_us_off']:.2f} us"
                      f"  on {row['cpu_us_on']:.2f} us (x{row['cpu_on_vs_off']:.3f})")
            out.write_text(json.dumps({"eventlog_comparison": comparison}, indent=2))
        else:
            machine, rows = measure(args, args.eventlog == "on", data_dir)
            print(f"machine: {machine}")
            for row in rows:
                print("  " + "  ".join(f"{k}={v}" for k, v in row.items()))
            out.write_text(json.dumps({"machine": machine, "results": rows}, indent=2))
    print(f"written to {out}")


if __name__ == "__main__":
    main()
