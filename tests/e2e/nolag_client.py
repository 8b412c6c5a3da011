"""A NoLag client for the tests: real websockets, MessagePack maps exactly as sent and received."""

from __future__ import annotations

import asyncio
from typing import Any

import msgpack
from websockets.asyncio.client import ClientConnection, connect

from actors.nolag.keys import open_key_store


class Client:
    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.heartbeats = 0

    @classmethod
    async def open(cls, url: str, token: str | None = None, reconnect: bool = False, **auth: Any) -> "Client":
        client = cls(await connect(url, open_timeout=10, max_size=None, ping_interval=None))
        if token is not None:
            await client.send({"type": "auth", "token": token, "reconnect": reconnect, **auth})
            reply = await client.recv()
            assert reply["type"] == "auth" and reply["success"] is True, reply
            client.auth = reply
        return client

    async def send(self, message: dict[str, Any]) -> None:
        await self.ws.send(msgpack.packb(message, use_bin_type=True))

    async def recv(self, timeout: float = 10) -> dict[str, Any]:
        """The next MessagePack map (heartbeats are counted and skipped)."""
        while True:
            data = await asyncio.wait_for(self.ws.recv(), timeout)
            assert isinstance(data, bytes), "NoLag frames are binary"
            if not data:
                self.heartbeats += 1
                continue
            return msgpack.unpackb(data, raw=False)

    async def expect(self, kind: str, timeout: float = 10) -> dict[str, Any]:
        message = await self.recv(timeout)
        assert message["type"] == kind, message
        return message

    async def subscribe(self, topic: str, **options: Any) -> dict[str, Any]:
        await self.send({"type": "subscribe", "topic": topic, **options})
        return await self.expect("subscribed")

    async def publish(self, topic: str, data: Any, **options: Any) -> None:
        await self.send({"type": "publish", "topic": topic, "data": data, **options})

    async def quiet(self) -> None:
        """Nothing queued: a getPresence on an empty room answers next."""
        await self.send({"type": "getPresence", "roomId": "__quiet__"})
        reply = await self.recv()
        assert reply["type"] == "presenceList" and reply.get("roomId") == "__quiet__", reply

    async def close(self) -> None:
        await self.ws.close()


class NolagRouter:
    """A router the NoLag tests talk to: its key store, opened as `router keys` opens it with the
    router's settings, and its gateways' URLs (read from the router each time: a replaced gateway
    keeps its port)."""

    def __init__(self, running: Any, project: str = "proj_1") -> None:
        self.running = running
        self.project = project
        self.keys = open_key_store(running.settings)

    @property
    def router(self) -> Any:
        return self.running.router

    @property
    def urls(self) -> list[str]:
        return [f"ws://127.0.0.1:{gateway['listeners'][0]['port']}/ws" for gateway in self.router.endpoints()]

    def token(self, **options: Any) -> str:
        """A new key's token (``options``: its ACL, rate, quota)."""
        token, _ = self.keys.create(self.project, **options)
        return token
