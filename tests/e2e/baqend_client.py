"""Baqend clients for the tests: the real-time WebSocket protocol and the REST API, exact frames."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
from websockets.asyncio.client import ClientConnection, connect


class Events:
    """One connection to ``/v1/events``."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws

    @classmethod
    async def open(cls, url: str, local_addr: tuple[str, int] | None = None) -> "Events":
        """``local_addr`` (e.g. ("127.0.0.5", 0)) makes the connection another client to per-client limits."""
        return cls(await connect(url, open_timeout=10, max_size=None, ping_interval=None, local_addr=local_addr))

    async def subscribe(self, sub_id: str, bucket: str, **fields: Any) -> None:
        for name in ("query", "sort"):
            if name in fields and not isinstance(fields[name], str):
                fields[name] = json.dumps(fields[name])
        await self.send({"id": sub_id, "type": "subscribe", "bucket": bucket, **fields})

    async def unsubscribe(self, sub_id: str) -> None:
        await self.send({"id": sub_id, "type": "unsubscribe"})

    async def send(self, message: Any) -> None:
        await self.ws.send(message if isinstance(message, (str, bytes)) else json.dumps(message))

    async def recv(self, timeout: float = 10) -> dict[str, Any]:
        frame = json.loads(await asyncio.wait_for(self.ws.recv(), timeout))
        assert isinstance(frame.pop("date"), str)
        return frame

    async def result(self, sub_id: str) -> list[dict[str, Any]]:
        frame = await self.recv()
        assert frame["type"] == "result" and frame["id"] == sub_id, frame
        assert set(frame) == {"id", "type", "data"}
        return frame["data"]

    async def matches(self, count: int) -> list[tuple]:
        """The next ``count`` match frames as (matchType, operation, key, index or None)."""
        found = []
        for _ in range(count):
            frame = await self.recv()
            assert frame["type"] == "match", frame
            found.append(brief(frame))
        return found

    async def close(self) -> None:
        await self.ws.close()


def key_of(document: dict[str, Any]) -> str:
    return document["id"].rsplit("/", 1)[1]


def brief(frame: dict[str, Any]) -> tuple:
    assert set(frame) - {"index"} == {"id", "type", "matchType", "operation", "data"}, frame
    return (frame["matchType"], frame["operation"], key_of(frame["data"]), frame.get("index"))


class Rest:
    def __init__(self, base: str, local_addr: tuple[str, int] | None = None) -> None:
        self.base = base  # http://127.0.0.1:PORT/v1
        self.local_addr = local_addr  # as in Events.open
        self.session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> "Rest":
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(local_addr=self.local_addr))
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.session.close()

    async def call(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None,
                   raw: bytes | None = None) -> tuple[int, Any]:
        status, body, _ = await self.exchange(method, path, body, headers, raw)
        return status, body

    async def exchange(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None,
                       raw: bytes | None = None) -> tuple[int, Any, Any]:
        """(status, JSON body, response headers)."""
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        async with self.session.request(method, self.base + path, data=data, headers=headers or {}) as response:
            text = await response.read()
            return response.status, (json.loads(text) if text else None), response.headers

    async def insert(self, bucket: str, key: str, headers: dict[str, str] | None = None,
                     **fields: Any) -> dict[str, Any]:
        status, body = await self.call("POST", f"/db/{bucket}", {"id": f"/db/{bucket}/{key}", **fields}, headers)
        assert status == 201, body
        return body

    async def set(self, bucket: str, key: str, **fields: Any) -> dict[str, Any]:
        status, body = await self.call("POST", f"/db/{bucket}/{key}", {"$set": fields})
        assert status == 200, body
        return body

    async def delete(self, bucket: str, key: str) -> None:
        status, body = await self.call("DELETE", f"/db/{bucket}/{key}")
        assert status == 204, body
