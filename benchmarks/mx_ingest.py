"""mx-notifier hub: events per second from node ingest (/save) to 100 consumers with mixed filters.

Starts an embedded router, opens ``--consumers`` hub consumers in load-generator processes (a
quarter each with an All, Identifier, Address and Topics filter), then a node process pushes
``--blocks`` generated SaveBlocks (``--transactions`` each) with stop-and-wait ACKs as a real node
does, and a FinalizedBlock after the last one as the end marker. Reports log events ingested per
second and frames delivered per second, from the first push to the last consumer's end marker.

    .venv/bin/python benchmarks/mx_ingest.py [--consumers 100] [--blocks 200] [--transactions 50]
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



def _consumers(url: str, filters: list[tuple], end_hash: str, ready, result, timeout_s: float) -> None:
    from websockets.asyncio.client import connect

    from gateways.mx import codec
    from gateways.mx.pb import mx_hub_pb2

    async def main() -> None:
        connections = []
        for index, (level, address, identifier, topics) in enumerate(filters):
            ws = await connect(url, max_size=None, max_queue=None, ping_interval=None)
            await ws.send(codec.payload_frame(1, codec.SUBSCRIBE_TOPIC,
                                              codec.subscribe_payload(level, address, identifier, topics), True))
            ack = mx_hub_pb2.WsMessage()
            ack.ParseFromString(await ws.recv())
            assert ack.type == codec.ACK, ack
            connections.append(ws)
        ready.set()
        counts = [0] * len(connections)
        ended = [0.0] * len(connections)

        async def drain(index: int, ws) -> None:
            frame = mx_hub_pb2.WsMessage()
            async for data in ws:
                frame.ParseFromString(data)
                if frame.topic == codec.FINALIZED_TOPIC:
                    final = mx_hub_pb2.FinalizedEvent()
                    final.ParseFromString(frame.payload)
                    if final.hash == end_hash:
                        ended[index] = time.time()
                        return
                counts[index] += 1

        await asyncio.wait_for(asyncio.gather(*(drain(i, ws) for i, ws in enumerate(connections))), timeout_s)
        result.put({"frames": sum(counts), "ended": max(ended), "per_consumer": counts})
        for ws in connections:
            await ws.close()

    new_event_loop().run_until_complete(main())


def _node(url: str, blocks: int, transactions: int, seed: int, start, result) -> None:
    from websockets.asyncio.client import connect

    from gateways.mx import generator, node

    payloads = [generator.save_block_payload(generator.generate_save_block(seed + i, transactions=transactions))
                for i in range(blocks)]
    last = generator.generate_save_block(seed + blocks - 1, transactions=transactions)
    payloads = [(node.SAVE_BLOCK, p) for p in payloads] + [(node.FINALIZED_BLOCK, generator.finalized_payload(last))]

    async def main() -> None:
        async with connect(url, max_size=None, ping_interval=None) as ws:
            start.wait()
            began = time.time()
            for counter, (topic, payload) in enumerate(payloads, start=1):
                await ws.send(node.encode_node_frame(topic, payload, counter))
                reply = node.decode_node_frame(await ws.recv())
                assert reply.type == node.ACK and reply.counter == counter
            result.put({"began": began, "pushed": time.time() - began})

    new_event_loop().run_until_complete(main())


def plan(consumers: int, seed: int, transactions: int) -> list[tuple]:
    """Mixed filters taken from the first block (identifiers recur in every block)."""
    from gateways.mx import generator, node

    events = node.normalize_save_block(generator.generate_save_block(seed, transactions=transactions)).events
    with_topics = next(e for e in events if len(e.topics) >= 1)
    kinds = [
        ("All", "", "", []),
        ("Identifier", "", "ESDTTransfer", []),
        ("Address", events[0].address, "", []),
        ("Topics", with_topics.address, with_topics.identifier, [bytes(with_topics.topics[0])]),
    ]
    return [kinds[i % len(kinds)] for i in range(consumers)]


def run(args: argparse.Namespace, data_dir: str) -> dict:
    from gateways.mx import generator, node
    from router.settings import load_settings
    from router.runtime import Router

    settings = load_settings(
        port=0, gateways=args.gateways, namespace=f"bench-mx-{os.getpid()}", ray_dashboard=False, data_dir=data_dir,
        shards={"session": 1, "topic": args.topic_shards, "registry": 1}, signal={"enabled": False},
        cashu={"enabled": False}, baqend={"enabled": False}, analytics={"enabled": args.eventlog == "on"},
        mx={"max_queue_depth": 1_000_000})
    router = Router(settings)
    endpoints = router.start()
    ports = [gateway["listeners"][0]["port"] for gateway in endpoints]
    filters = plan(args.consumers, args.seed, args.transactions)
    end_hash = generator.generate_save_block(args.seed + args.blocks - 1,
                                             transactions=args.transactions).BlockData.HeaderHash.hex()
    events = 0
    for i in range(args.blocks):
        events += len(node.normalize_save_block(generator.generate_save_block(args.seed + i,
                                                                               transactions=args.transactions)).events)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    try:
        readies, processes = [], []
        for index in range(args.processes):
            ready = ctx.Event()
            url = f"ws://127.0.0.1:{ports[-1 - index % len(ports)]}/hub/ws"
            process = ctx.Process(target=_consumers, args=(url, filters[index::args.processes], end_hash, ready,
                                                           results, args.timeout))
            process.start()
            readies.append(ready)
            processes.append(process)
        for ready in readies:
            if not ready.wait(120):
                raise RuntimeError("consumers did not subscribe in time")
        start = ctx.Event()
        pusher = ctx.Process(target=_node, args=(f"ws://127.0.0.1:{ports[0]}/save", args.blocks, args.transactions,
                                                 args.seed, start, results))
        pusher.start()
        start.set()
        outcomes = [results.get(timeout=args.timeout + 120) for _ in range(args.processes + 1)]
        for process in [*processes, pusher]:
            process.join(30)
    finally:
        router.stop()
    node_result = next(o for o in outcomes if "began" in o)
    consumer_results = [o for o in outcomes if "frames" in o]
    elapsed = max(o["ended"] for o in consumer_results) - node_result["began"]
    frames = sum(o["frames"] for o in consumer_results)
    return {
        "consumers": args.consumers, "blocks": args.blocks, "transactions_per_block": args.transactions,
        "events_ingested": events, "frames_delivered": frames, "seconds": round(elapsed, 3),
        "events_per_s": int(events / elapsed), "deliveries_per_s": int(frames / elapsed),
        "node_push_seconds": round(node_result["pushed"], 3), "gateways": args.gateways,
        "topic_shards": args.topic_shards, "eventlog": args.eventlog, "cpus": os.cpu_count(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--consumers", type=int, default=100)
    parser.add_argument("--blocks", type=int, default=200)
    parser.add_argument("--transactions", type=int, default=50, help="per block (about 3 log events each)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--processes", type=int, default=2, help="consumer load-generator processes")
    parser.add_argument("--gateways", type=int, default=1)
    parser.add_argument("--topic-shards", type=int, default=2)
    parser.add_argument("--eventlog", choices=("on", "off"), default="on")
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--out", default="benchmarks/results/mx_ingest.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="router-bench-") as data_dir:
        row = run(args, data_dir)
    print("  ".join(f"{k}={v}" for k, v in row.items()))
    write_json(Path(args.out), row)
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
