"""NoLag fan-out: messages/second to a topic with 100 subscribers, at QoS 0 and QoS 1.

Starts an embedded router, creates keys, opens ``--subscribers`` authenticated connections in
load-generator processes (subscribed at the QoS under test; at QoS 1 they acknowledge with one
``batchAck`` per 100 messages), and a publisher process that sends ``--messages`` ~100-byte
messages with a window of unanswered publishes (every publish carries a ``msgRef``; the router's
``published`` reply frees a slot). Bounded in count and time.

    .venv/bin/python benchmarks/nolag_fanout.py [--subscribers 100] [--messages 20000]
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

TOPIC = "bench/room/fanout"



async def _open(url: str, token: str, qos: int):
    import msgpack
    from websockets.asyncio.client import connect

    ws = await connect(url, max_size=None, max_queue=None, ping_interval=None)
    await ws.send(msgpack.packb({"type": "auth", "token": token}))
    assert msgpack.unpackb(await ws.recv())["success"]
    await ws.send(msgpack.packb({"type": "subscribe", "topic": TOPIC, "qos": qos}))
    assert msgpack.unpackb(await ws.recv())["type"] == "subscribed"
    return ws


def _subscribers(url: str, tokens: list[str], qos: int, expected: int, ready, result, timeout_s: float) -> None:
    import msgpack

    async def main() -> None:
        connections = [await _open(url, token, qos) for token in tokens]
        ready.set()
        ended = [0.0] * len(connections)

        async def drain(index: int, ws) -> None:
            got, ids = 0, []
            async for frame in ws:
                if not frame:
                    continue
                message = msgpack.unpackb(frame)
                if message.get("type") != "message":
                    continue
                got += 1
                if qos:
                    ids.append(message["msgId"])
                    if len(ids) == 100:
                        await ws.send(msgpack.packb({"type": "batchAck", "msgIds": ids}))
                        ids = []
                if got >= expected:
                    ended[index] = time.time()
                    return

        await asyncio.wait_for(asyncio.gather(*(drain(i, ws) for i, ws in enumerate(connections))), timeout_s)
        result.put({"ended": max(ended), "received": expected * len(connections)})
        for ws in connections:
            await ws.close()

    new_event_loop().run_until_complete(main())


def _publisher(url: str, token: str, qos: int, messages: int, window: int, start, result) -> None:
    import msgpack

    async def main() -> None:
        ws = await _open(url, token, 0)  # a publisher must be subscribed to the topic (echo off below)
        start.wait()
        began = time.time()
        slots = asyncio.Semaphore(window)

        async def replies() -> None:
            answered = 0
            async for frame in ws:
                if frame and msgpack.unpackb(frame).get("type") == "published":
                    answered += 1
                    slots.release()
                    if answered == messages:
                        return

        reader = asyncio.ensure_future(replies())
        body = {"text": "x" * 60, "n": 0}
        for n in range(messages):
            await slots.acquire()
            body["n"] = n
            await ws.send(msgpack.packb({"type": "publish", "topic": TOPIC, "data": body, "qos": qos,
                                         "echo": False, "msgRef": n}))
        await reader
        result.put({"began": began})
        await ws.close()

    new_event_loop().run_until_complete(main())


def run(args: argparse.Namespace, qos: int, data_dir: str) -> dict:
    from router.settings import load_settings
    from actors.nolag.keys import open_key_store
    from router.runtime import Router

    settings = load_settings(
        port=0, gateways=args.gateways, namespace=f"bench-nolag-{os.getpid()}-{qos}", ray_dashboard=False,
        data_dir=data_dir, signal={"enabled": False}, cashu={"enabled": False}, mx={"enabled": False},
        baqend={"enabled": False}, analytics={"enabled": args.eventlog == "on"},
        nolag={"max_unacked": 100_000})
    keys = open_key_store(settings)
    tokens = [keys.create("bench", rate_limit_per_s=1_000_000_000)[0] for _ in range(args.subscribers + 1)]
    router = Router(settings)
    endpoints = router.start()
    ports = [gateway["listeners"][0]["port"] for gateway in endpoints]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    try:
        readies, processes = [], []
        for index in range(args.processes):
            ready = ctx.Event()
            url = f"ws://127.0.0.1:{ports[-1 - index % len(ports)]}/ws"
            process = ctx.Process(target=_subscribers, args=(url, tokens[1 + index::args.processes], qos,
                                                             args.messages, ready, results, args.timeout))
            process.start()
            readies.append(ready)
            processes.append(process)
        for ready in readies:
            if not ready.wait(120):
                raise RuntimeError("subscribers did not connect in time")
        start = ctx.Event()
        publisher = ctx.Process(target=_publisher, args=(f"ws://127.0.0.1:{ports[0]}/ws", tokens[0], qos,
                                                         args.messages, args.window, start, results))
        publisher.start()
        start.set()
        outcomes = [results.get(timeout=args.timeout + 60) for _ in range(args.processes + 1)]
        for process in [*processes, publisher]:
            process.join(30)
    finally:
        router.stop()
    began = next(o["began"] for o in outcomes if "began" in o)
    ended = max(o["ended"] for o in outcomes if "ended" in o)
    received = sum(o["received"] for o in outcomes if "received" in o)
    elapsed = ended - began
    return {"qos": qos, "subscribers": args.subscribers, "messages": args.messages, "seconds": round(elapsed, 3),
            "messages_per_s": int(args.messages / elapsed), "deliveries_per_s": int(received / elapsed),
            "gateways": args.gateways, "eventlog": args.eventlog, "cpus": os.cpu_count()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--subscribers", type=int, default=100)
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--window", type=int, default=64, help="unanswered publishes in flight")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--gateways", type=int, default=1)
    parser.add_argument("--qos", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--eventlog", choices=("on", "off"), default="on")
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--out", default="benchmarks/results/nolag_fanout.json")
    args = parser.parse_args()
    rows = []
    for qos in args.qos:
        with tempfile.TemporaryDirectory(prefix="router-bench-") as data_dir:
            row = run(args, qos, data_dir)
        print("  ".join(f"{k}={v}" for k, v in row.items()), flush=True)
        rows.append(row)
    write_json(Path(args.out), rows)
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
