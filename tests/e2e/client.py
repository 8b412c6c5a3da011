"""A minimal Signal Hub client for the tests: real websockets, JSON envelopes, exact frames."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

HUB = "cloudflare/signal-hub"
_ids = itertools.count(1)


def now_ms() -> int:
    return int(time.time() * 1000)


class HubClient:
    def __init__(self, ws: ClientConnection, address: str) -> None:
        self.ws = ws
        self.address = address

    @classmethod
    async def open(cls, url: str, address: str, token: str | None = None, hello: bool = True) -> "HubClient":
        ws = await connect(url, open_timeout=10, max_size=None, ping_interval=None)
        client = cls(ws, address)
        if hello:
            payload: dict[str, Any] = {"version": "1.0"}
            if token is not None:
                payload["jwt"] = token
            reply = await client.request("hub:connect", payload)
            assert reply["type"] == "hub:connected", reply
        return client

    def envelope(self, kind: str, payload: Any = None, to: str = HUB, **extra: Any) -> dict[str, Any]:
        message: dict[str, Any] = {"type": kind, "from": self.address, "to": to}
        if payload is not None:
            message["payload"] = payload
        message.update(extra)
        return message

    async def send(self, kind: str, payload: Any = None, to: str = HUB, **extra: Any) -> dict[str, Any]:
        message = self.envelope(kind, payload, to, **extra)
        await self.ws.send(json.dumps(message))
        return message

    def send_burst(self, messages: list[dict[str, Any]]) -> None:
        """Text frames written in one write, so that the gateway reads them in one go."""
        from websockets.frames import Frame, Opcode

        frames = [Frame(Opcode.TEXT, json.dumps(message).encode()).serialize(mask=True, extensions=[])
                  for message in messages]
        self.ws.transport.write(b"".join(frames))

    async def send_raw(self, data: str | bytes) -> None:
        await self.ws.send(data)

    async def recv_raw(self, timeout: float = 10) -> str | bytes:
        return await asyncio.wait_for(self.ws.recv(), timeout)

    async def recv(self, timeout: float = 10) -> dict[str, Any]:
        return json.loads(await self.recv_raw(timeout))

    async def request(self, kind: str, payload: Any = None, to: str = HUB, **extra: Any) -> dict[str, Any]:
        extra.setdefault("correlationId", f"c{next(_ids)}")
        sent = await self.send(kind, payload, to, **extra)
        reply = await self.recv()
        assert reply.get("correlationId") == sent["correlationId"], (sent, reply)
        return reply

    async def close(self) -> None:
        await self.ws.close()


def run(coroutine: Any, timeout: float = 60) -> Any:
    """Run one test coroutine with a bound on its duration."""
    return asyncio.run(asyncio.wait_for(coroutine, timeout))


async def eventually(probe: Any, timeout: float = 10, interval: float = 0.05, what: str = "condition") -> Any:
    """Await ``probe()`` until it returns a truthy value; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout}s (last value {value!r})")
        await asyncio.sleep(interval)
