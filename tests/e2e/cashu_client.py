"""A minimal NUT-17 wallet connection for the tests: real websockets, JSON-RPC frames as sent."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

from gateways.cashu.feed import StateFeed

API_KEY = "cashu-feed-key-0123456789abcdef"
Y1 = "02e208f9a78cd523444aadf854a4e91281d20f67a923d345239c37f14e137c7c3d"
Y2 = "03a5d6c1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e"


class Wallet:
    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.next_id = 0

    @classmethod
    async def open(cls, url: str, **options: Any) -> "Wallet":
        options.setdefault("ping_interval", None)
        return cls(await connect(url, open_timeout=10, max_size=None, **options))

    async def send(self, method: str, params: Any = None, request_id: Any = None) -> int:
        if request_id is None:
            request_id, self.next_id = self.next_id, self.next_id + 1
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        await self.ws.send(json.dumps(message))
        return request_id

    async def subscribe(self, kind: str, filters: list[str], sub_id: str) -> int:
        return await self.send("subscribe", {"kind": kind, "filters": filters, "subId": sub_id})

    async def recv(self, timeout: float = 10) -> dict[str, Any]:
        return json.loads(await asyncio.wait_for(self.ws.recv(), timeout))

    async def expect_ok(self, request_id: int, sub_id: str) -> None:
        assert await self.recv() == {"jsonrpc": "2.0", "result": {"status": "OK", "subId": sub_id}, "id": request_id}

    async def notification(self, timeout: float = 10) -> tuple[str, dict[str, Any]]:
        message = await self.recv(timeout)
        assert set(message) == {"jsonrpc", "method", "params"}, message  # notifications carry no id
        assert message["jsonrpc"] == "2.0" and message["method"] == "subscribe"
        return message["params"]["subId"], message["params"]["payload"]

    async def quiet(self) -> None:
        """Assert nothing is queued: the next frame is the answer to a heartbeat sent now."""
        request_id = await self.send("heartbeat")
        assert await self.recv() == {"jsonrpc": "2.0", "id": request_id, "result": "heartbeat"}

    async def close(self) -> None:
        await self.ws.close()


def feed(http_url: str, api_key: str = API_KEY) -> StateFeed:
    return StateFeed(http_url, api_key)


async def push(http_url: str, kind: str, payload: dict[str, Any], api_key: str = API_KEY) -> dict[str, Any]:
    return await asyncio.to_thread(feed(http_url, api_key).push, kind, payload)


def mint_quote(quote: str, state: str, **extra: Any) -> dict[str, Any]:
    return {"quote": quote, "request": "lnbc100n1p" + quote, "amount": 100, "unit": "sat", "state": state,
            "expiry": 1_900_000_000, **extra}


def melt_quote(quote: str, state: str, **extra: Any) -> dict[str, Any]:
    return {"quote": quote, "request": "lnbc100n1p" + quote, "amount": 100, "unit": "sat", "fee_reserve": 2,
            "state": state, "expiry": 1_900_000_000, "payment_preimage": None, "change": None, **extra}


def proof_state(y: str, state: str, witness: Any = None) -> dict[str, Any]:
    return {"Y": y, "state": state, "witness": witness}
