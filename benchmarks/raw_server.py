"""The ``raw`` baseline of ``router bench``: the fastest plain single-process server the
``websockets`` library makes here, the ceiling the router is compared with.

One asyncio process (uvloop), ``websockets.asyncio.server``, fan-out with ``broadcast()`` (the
frame is encoded once and written to each transport without awaiting; ``send()`` in a loop is
about a third slower). A trivial text protocol, spoken by the same load-generator processes:

    sub TOPIC          subscribe            → "ok"
    reg NAME           register a name      → "ok"
    pub TOPIC BODY     broadcast BODY to TOPIC's subscribers
    to NAME BODY       send BODY to NAME
    ping               → "pong" (in order: everything before it was handled)

    python benchmarks/raw_server.py [--port 0] [--cpu 0]    # prints "listening PORT"
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal

from websockets.asyncio.server import broadcast, serve


async def main(port: int) -> None:
    topics: dict[str, set] = {}
    names: dict[str, object] = {}

    async def handler(ws) -> None:
        mine: list[str] = []
        try:
            async for message in ws:
                verb, _, rest = message.partition(" ")
                if verb == "pub":
                    topic, _, body = rest.partition(" ")
                    broadcast(topics.get(topic, ()), body)
                elif verb == "to":
                    name, _, body = rest.partition(" ")
                    target = names.get(name)
                    if target is not None:
                        broadcast((target,), body)
                elif verb == "ping":
                    broadcast((ws,), "pong")
                elif verb == "sub":
                    topics.setdefault(rest, set()).add(ws)
                    mine.append(rest)
                    await ws.send("ok")
                elif verb == "reg":
                    names[rest] = ws
                    await ws.send("ok")
        finally:
            for topic in mine:
                topics.get(topic, set()).discard(ws)
            for name in [name for name, target in names.items() if target is ws]:
                del names[name]

    stop = asyncio.get_running_loop().create_future()
    for signum in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(signum, stop.set_result, None)
    async with serve(handler, "127.0.0.1", port, compression=None, ping_interval=None, max_queue=None,
                     max_size=None, backlog=4096) as server:
        print(f"listening {server.sockets[0].getsockname()[1]}", flush=True)
        await stop


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--cpu", type=int, default=None, help="pin the server to this CPU")
    args = parser.parse_args()
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError):
        pass
    try:
        import uvloop

        uvloop.run(main(args.port))
    except ImportError:
        asyncio.run(main(args.port))
