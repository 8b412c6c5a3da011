"""Load-generator processes: subscribers, publishers, idle connections, churn.

Each worker runs in its own process (multiprocessing ``spawn``) on uvloop, sets up its
connections, reports ``ready``, waits for ``go``, runs bounded in count and time, and puts one
result dict on the queue. The same worker code drives every system; a :class:`Dialect` says
which bytes mean connect, subscribe, publish and send for the router's Signal Hub, the ``raw``
websockets server (``benchmarks/raw_server.py``) and Redis. The router's other dialects register
their own (and any roles of their own) from ``router/bench/dialects/<name>.py``.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import time
from typing import Any

from router.bench.wire import (
    COUNT, LATENCY, RespClient, Tally, WsClient, open_resp, open_ws, resp_command, stamp,
)
from router.proc import new_event_loop, raise_open_file_limit

HUB = "cloudflare/signal-hub"
PAYLOAD_BYTES = 100  # the size of a delivered message on every system


# -- dialects ----------------------------------------------------------------------------------

class Dialect:
    """How one system says connect / subscribe / publish / send; frames are built once."""

    name = ""
    publish_ack_every = 1  # a publish is acknowledged every N messages (the publisher's window)
    sends_answered = True  # a point-to-point send is answered (its replies counted as acks)

    def __init__(self, config: dict[str, Any] | None = None, spec: dict[str, Any] | None = None) -> None:
        self.config = config or {}  # what the system made for its clients (``Profile.prepare``, URLs)
        self.spec = spec or {}  # the worker's job (a case may say more than the shared fields)

    async def open(self, url: str, tally: Tally | None = None):
        return await open_ws(url, tally)

    async def hello(self, client, name: str) -> None:
        """What makes a connection a session (Signal Hub's hub:connect); nothing elsewhere."""

    async def subscribe(self, client, name: str, topics: list[str]) -> None:
        raise NotImplementedError

    async def register(self, client, name: str) -> None:
        raise NotImplementedError

    def publish(self, name: str, topic: str, body: str) -> bytes:
        raise NotImplementedError

    def send(self, name: str, target: str, body: str) -> bytes:
        raise NotImplementedError

    def sync(self) -> bytes | None:
        """A frame the server answers once everything before it is handled (raw: ping)."""
        return None

    def listen(self, client, mode: str) -> None:
        client.mode = mode


class SignalDialect(Dialect):
    """The router's Signal Hub: JSON envelopes; a publish is delivered as sent, then acked."""

    name = "signal"
    sends_answered = False  # hub:send has no reply

    def _envelope(self, kind: str, sender: str, to: str, payload: dict) -> bytes:
        return json.dumps({"type": kind, "from": sender, "to": to, "payload": payload},
                          separators=(",", ":")).encode()

    async def hello(self, client: WsClient, name: str) -> None:
        client.send(self._envelope("hub:connect", name, HUB, {"version": "1.0"}))
        await client.messages(1)

    async def subscribe(self, client: WsClient, name: str, topics: list[str]) -> None:
        await self.hello(client, name)
        for topic in topics:
            client.send(self._envelope("hub:subscribe", name, HUB, {"topic": topic}))
        replies = await client.messages(len(topics))
        if not all(b"hub:subscribed" in reply for reply in replies):
            raise RuntimeError(f"subscribe refused: {replies[:1]!r}")

    async def register(self, client: WsClient, name: str) -> None:
        await self.hello(client, name)
        client.send(self._envelope("hub:register", name, HUB, {"actorAddress": name}))
        reply = (await client.messages(1))[0]
        if b"error" in reply:
            raise RuntimeError(f"register refused: {reply!r}")

    def _pad(self, frame_without_body: int, body: str) -> str:
        return body + "x" * max(0, PAYLOAD_BYTES - frame_without_body - len(body))

    def publish(self, name: str, topic: str, body: str) -> bytes:
        empty = len(self._envelope("hub:publish", name, HUB, {"topic": topic, "message": ""}))
        return self._envelope("hub:publish", name, HUB, {"topic": topic, "message": self._pad(empty, body)})

    def send(self, name: str, target: str, body: str) -> bytes:
        empty = len(self._envelope("hub:send", name, target, {"b": ""}))
        return self._envelope("hub:send", name, target, {"b": self._pad(empty, body)})


class RawDialect(Dialect):
    """``benchmarks/raw_server.py``: ``sub T`` / ``reg NAME`` → ``ok``; ``pub T BODY`` broadcasts BODY;
    ``to NAME BODY`` sends BODY; ``ping`` → ``pong``."""

    name = "raw"
    publish_ack_every = 16

    async def subscribe(self, client: WsClient, name: str, topics: list[str]) -> None:
        for topic in topics:
            client.send(f"sub {topic}".encode())
        await client.messages(len(topics))

    async def register(self, client: WsClient, name: str) -> None:
        client.send(f"reg {name}".encode())
        await client.messages(1)

    def publish(self, name: str, topic: str, body: str) -> bytes:
        return f"pub {topic} {body.ljust(PAYLOAD_BYTES, 'x')}".encode()

    def send(self, name: str, target: str, body: str) -> bytes:
        return f"to {target} {body.ljust(PAYLOAD_BYTES, 'x')}".encode()

    def sync(self) -> bytes:
        return b"ping"


class RedisDialect(Dialect):
    """Redis pub/sub: SUBSCRIBE, PUBLISH (answered with the receiver count); p2p = a channel per receiver."""

    name = "redis"

    async def open(self, url: str, tally: Tally | None = None) -> RespClient:
        return await open_resp(url, tally)

    async def hello(self, client: RespClient, name: str) -> None:
        client.marker = b"PONG"
        client.send(resp_command(b"PING"))
        await client.messages(1)

    async def subscribe(self, client: RespClient, name: str, topics: list[str]) -> None:
        client.send(resp_command(b"SUBSCRIBE", *(topic.encode() for topic in topics)))
        await client.messages(len(topics))

    async def register(self, client: RespClient, name: str) -> None:
        await self.subscribe(client, name, [f"to/{name}"])

    def publish(self, name: str, topic: str, body: str) -> bytes:
        return resp_command(b"PUBLISH", topic.encode(), body.ljust(PAYLOAD_BYTES, "x").encode())

    def send(self, name: str, target: str, body: str) -> bytes:
        return self.publish(name, f"to/{target}", body)

    def listen(self, client: RespClient, mode: str) -> None:
        client.listen(mode)


DIALECTS: dict[str, type[Dialect]] = {"signal": SignalDialect, "raw": RawDialect, "redis": RedisDialect}


def dialect_class(name: str) -> type[Dialect]:
    """The load-generator dialect ``name``; the router's other dialects register theirs when their
    bench module (``router.bench.dialects.<name>``) is imported."""
    if name not in DIALECTS:
        importlib.import_module(f"router.bench.dialects.{name}")
    return DIALECTS[name]


# -- the worker skeleton -----------------------------------------------------------------------

def _run_worker(role, spec: dict[str, Any], ready, go, results) -> None:
    """Process entry: set up, say ready, wait for go, run, report (errors are reported too)."""
    raise_open_file_limit()
    if spec.get("cpus"):
        import psutil

        from router.bench.systems import pin_threads

        pin_threads(psutil.Process(), set(spec["cpus"]))  # the threads the process started with too

    async def main() -> dict[str, Any]:
        dialect = dialect_class(spec["dialect"])(spec.get("config"), spec)
        state = await role.setup(dialect, spec)
        ready.put(spec["worker"])
        loop = asyncio.get_running_loop()
        if not await loop.run_in_executor(None, go.wait, spec["ready_timeout"]):
            raise TimeoutError("no go signal")
        cpu = time.process_time()
        try:
            result = await asyncio.wait_for(role.run(dialect, spec, state), spec["timeout"])
        finally:
            role.close(state)
        return {**result, "cpu_s": time.process_time() - cpu}

    try:
        result = new_event_loop().run_until_complete(main())
    except BaseException as error:  # report it: the orchestrator must not wait for a dead worker
        result = {"error": f"{type(error).__name__}: {error}"}
        ready.put(spec["worker"])
    results.put({"worker": spec["worker"], "role": role.__name__, **result})


async def gather_bounded(factories, concurrency: int = 50) -> list:
    """At most ``concurrency`` set-ups at a time (a burst of upgrades is not what is measured)."""
    out: list = []
    for start in range(0, len(factories), concurrency):
        out.extend(await asyncio.gather(*(factory() for factory in factories[start:start + concurrency])))
    return out


def new_tally(spec: dict[str, Any]) -> Tally:
    """The receivers' shared count; with an HDR histogram when the case measures latency."""
    histogram = None
    if spec.get("latency"):
        from hdrh.histogram import HdrHistogram

        histogram = HdrHistogram(1, 60_000_000, 3)
    return Tally(histogram)


class Subscribers:
    """Connections subscribed to topics (or registered under a name, ``register``); they count what
    arrives until ``expected`` frames, an idle gap after the first frame, or the time bound."""

    @staticmethod
    async def setup(dialect: Dialect, spec: dict[str, Any]) -> dict[str, Any]:
        tally = new_tally(spec)
        histogram = tally.histogram

        async def one(entry: dict[str, Any]):
            client = await dialect.open(entry["url"], tally)
            if entry.get("register"):
                await dialect.register(client, entry["name"])
            else:
                await dialect.subscribe(client, entry["name"], entry["topics"])
            dialect.listen(client, LATENCY if histogram is not None else COUNT)
            return client

        clients = await gather_bounded([lambda e=e: one(e) for e in spec["connections"]], 50)
        return {"clients": clients, "tally": tally}

    @staticmethod
    async def run(dialect: Dialect, spec: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
        tally: Tally = state["tally"]
        expected, idle, deadline = spec["expected"], spec["idle_s"], time.monotonic() + spec["timeout"] - 1
        while tally.count < expected and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
            if tally.last and time.monotonic() - tally.last > idle:
                break
        result = {"received": tally.count, "expected": expected, "first": tally.first, "last": tally.last}
        if tally.histogram is not None:
            result["histogram"] = tally.histogram_now().encode()
        return result

    @staticmethod
    def close(state: dict[str, Any]) -> None:
        for client in state["clients"]:
            client.close()


class Publishers:
    """Connections that publish ``messages`` each, round-robin over ``topics``, keeping at most
    ``window`` unacknowledged; or at ``rate`` messages/s, stamped with the intended send time; or,
    with ``target``, ``hub:send``-style messages to one receiver (no acknowledgement but TCP's)."""

    @staticmethod
    async def setup(dialect: Dialect, spec: dict[str, Any]) -> dict[str, Any]:
        async def one(entry: dict[str, Any]):
            client = await dialect.open(entry["url"])
            await dialect.hello(client, entry["name"])
            dialect.listen(client, COUNT)
            return client

        clients = await gather_bounded([lambda e=e: one(e) for e in spec["connections"]], 50)
        return {"clients": clients}

    @staticmethod
    async def run(dialect: Dialect, spec: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
        started = time.monotonic()
        jobs = [_publish(dialect, client, entry, spec) for client, entry in zip(state["clients"], spec["connections"])]
        sent = sum(await asyncio.gather(*jobs))
        return {"sent": sent, "start": started, "end": time.monotonic()}

    @staticmethod
    def close(state: dict[str, Any]) -> None:
        for client in state["clients"]:
            client.close()


async def _publish(dialect: Dialect, client, entry: dict[str, Any], spec: dict[str, Any]) -> int:
    messages, name = spec["messages"], entry["name"]
    if entry.get("target") is not None:  # point to point: a flood, bounded by the transport
        frame = dialect.send(name, entry["target"], "")
        sync, every = dialect.sync(), dialect.publish_ack_every
        for sent in range(1, messages + 1):
            client.send(frame)
            if sync is not None and sent % every == 0:
                client.send(sync)
            if sent % 64 == 0:
                await client.drain()
                # Replies to read (raw's pongs, Redis's counts): keep a window as publishers do.
                if (dialect.sends_answered or sync is not None) and sent - client.acks * every >= spec["window"]:
                    await client.wait_acks((sent - spec["window"] // 2) // every)
        await _settle(dialect, client, messages, acknowledged=dialect.sends_answered)
        return messages
    topics = entry["topics"]
    if spec.get("rate"):
        return await _publish_at_rate(dialect, client, name, topics[0], messages, spec["rate"])
    frames = [dialect.publish(name, topic, "") for topic in topics]
    sync, every, window = dialect.sync(), dialect.publish_ack_every, spec["window"]
    count = len(frames)
    for sent in range(1, messages + 1):
        client.send(frames[sent % count])
        if sent % every == 0:
            if sync is not None:
                client.send(sync)
            await client.drain()
            if sent - client.acks * every >= window:  # full: wait until half the window is free
                await client.wait_acks((sent - window // 2) // every)
    await _settle(dialect, client, messages)
    return messages


async def _settle(dialect: Dialect, client, messages: int, acknowledged: bool = True) -> None:
    """Before closing: wait until the server has handled every message (a close right behind the
    last frames may otherwise lose them). Signal Hub's hub:send has no reply: the connection is
    closed, and its end waits for the server's close frame, which follows everything sent."""
    sync, every = dialect.sync(), dialect.publish_ack_every
    if sync is not None:
        client.send(sync)
        await client.wait_acks(messages // every + 1)
    elif acknowledged:  # every publish is answered (hub:delivery_ack, Redis's receiver count)
        await client.wait_acks(messages)
    else:
        await client.close_read()


async def paced(count: int, rate: float):
    """``(index, due)`` for ``count`` sends at ``rate``/s, each yielded at its intended send time
    (``due``, ``time.monotonic_ns``); a late one is yielded at once and keeps its intended time, so
    a stamp of ``due`` counts the wait a stalled server caused (no coordinated omission)."""
    interval_ns = int(1e9 / rate)
    start = time.monotonic_ns() + 10_000_000
    for index in range(count):
        due = start + index * interval_ns
        delay = due - time.monotonic_ns()
        if delay > 0:
            await asyncio.sleep(delay / 1e9)
        yield index, due


async def _publish_at_rate(dialect: Dialect, client, name: str, topic: str, messages: int, rate: float) -> int:
    """A fixed offered rate; each message stamped with its intended send time (no coordinated omission)."""
    sync = dialect.sync()
    async for index, due in paced(messages, rate):
        client.send(dialect.publish(name, topic, stamp(due)))
        if sync is not None and (index + 1) % dialect.publish_ack_every == 0:
            client.send(sync)
    await _settle(dialect, client, messages)
    return messages


class Idle:
    """Idle connections (after the dialect's hello); the orchestrator measures memory while they
    wait for ``go``, then they report how many are still open and close."""

    @staticmethod
    async def setup(dialect: Dialect, spec: dict[str, Any]) -> dict[str, Any]:
        async def one(entry: dict[str, Any]):
            client = await dialect.open(entry["url"])
            await dialect.hello(client, entry["name"])
            return client

        clients = await gather_bounded([lambda e=e: one(e) for e in spec["connections"]], spec.get("concurrency", 50))
        return {"clients": clients}

    @staticmethod
    async def run(dialect: Dialect, spec: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(spec.get("hold_s", 0))
        alive = sum(1 for client in state["clients"] if not client.closed.done())
        return {"open": alive}

    @staticmethod
    def close(state: dict[str, Any]) -> None:
        for client in state["clients"]:
            client.close()


class Churn:
    """``concurrency`` loops of connect → (hello) → subscribe → close, for ``seconds`` or ``cycles``."""

    @staticmethod
    async def setup(dialect: Dialect, spec: dict[str, Any]) -> dict[str, Any]:
        return {}

    @staticmethod
    async def run(dialect: Dialect, spec: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
        done = [0, 0]
        deadline = time.monotonic() + spec["seconds"]
        urls = spec["urls"]

        async def loop(index: int) -> None:
            cycle = 0
            while time.monotonic() < deadline and done[0] < spec["cycles"]:
                name = f"bench/c{spec['worker']}-{index}-{cycle}"
                try:
                    client = await dialect.open(urls[(index + cycle) % len(urls)])
                    await dialect.subscribe(client, name, [f"churn/{index % 10}"])
                    client.close()
                    done[0] += 1
                except (OSError, asyncio.TimeoutError, RuntimeError, ConnectionError):
                    done[1] += 1
                cycle += 1

        started = time.monotonic()
        await asyncio.gather(*(loop(index) for index in range(spec["concurrency"])))
        return {"cycles": done[0], "errors": done[1], "start": started, "end": time.monotonic()}

    @staticmethod
    def close(state: dict[str, Any]) -> None:
        pass


ROLES: dict[str, Any] = {"subscribers": Subscribers, "publishers": Publishers, "idle": Idle, "churn": Churn}


def worker(role_name: str, spec: dict[str, Any], ready, go, results) -> None:
    dialect_class(spec["dialect"])  # a dialect's own roles are registered with it
    _run_worker(ROLES[role_name], spec, ready, go, results)
