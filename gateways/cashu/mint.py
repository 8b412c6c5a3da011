"""The mint's REST API, for objects the router has never been told about (optional).

When ``cashu.mint_url`` is set, a subscription to an object without a stored state asks the mint:
NUT-04/05 quote lookups and NUT-07 ``checkstate``; ``GET /v1/info`` merges the mint's own info.
Every call is bounded by ``mint_timeout_s``; a mint that fails or times out means "unknown".
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any
from urllib.parse import quote

import aiohttp
import orjson

from gateways.cashu.codec import PROOF_STATE, is_point_hex

logger = logging.getLogger(__name__)

QUOTE_PATHS = {
    "bolt11_mint_quote": "/v1/mint/quote/bolt11/",
    "bolt12_mint_quote": "/v1/mint/quote/bolt12/",
    "bolt11_melt_quote": "/v1/melt/quote/bolt11/",
    "bolt12_melt_quote": "/v1/melt/quote/bolt12/",
}


class MintClient:
    def __init__(self, base_url: str, timeout_s: float, info_ttl_s: float, max_concurrency: int = 16) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.info_ttl_s = info_ttl_s
        self._session: aiohttp.ClientSession | None = None
        self._slots = asyncio.Semaphore(max_concurrency)
        self._info: tuple[float, dict[str, Any]] | None = None
        self.requests = 0
        self.failures = 0

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self.timeout, raise_for_status=False)
        return self._session

    async def _call(self, method: str, path: str, body: Any = None) -> Any:
        async with self._slots:
            self.requests += 1
            try:
                async with self._client().request(
                    method, self.base_url + path, data=None if body is None else orjson.dumps(body),
                    headers={"Content-Type": "application/json"} if body is not None else None,
                ) as response:
                    if response.status != 200:
                        return None
                    return orjson.loads(await response.read())
            except (aiohttp.ClientError, asyncio.TimeoutError, orjson.JSONDecodeError, ValueError) as error:
                self.failures += 1
                logger.info("mint %s %s failed: %s", method, path, error)
                return None

    async def quote(self, kind: str, quote_id: str) -> dict[str, Any] | None:
        """The quote's current state, or None when the mint does not know it (or cannot say)."""
        body = await self._call("GET", QUOTE_PATHS[kind] + _path_segment(quote_id))
        if isinstance(body, dict) and body.get("quote") == quote_id:
            return body
        return None

    async def proof_states(self, ys: list[str]) -> dict[str, dict[str, Any]]:
        """NUT-07 checkstate: Y (lower case) -> proof state."""
        body = await self._call("POST", "/v1/checkstate", {"Ys": ys})
        states: dict[str, dict[str, Any]] = {}
        if isinstance(body, dict) and isinstance(body.get("states"), list):
            for state in body["states"]:
                if isinstance(state, dict) and isinstance(state.get("Y"), str) and is_point_hex(state["Y"]):
                    states[state["Y"].lower()] = state
        return states

    async def info(self) -> dict[str, Any] | None:
        cached = self._info
        now = time.monotonic()
        if cached is not None and now - cached[0] < self.info_ttl_s:
            return cached[1]
        body = await self._call("GET", "/v1/info")
        if isinstance(body, dict):
            self._info = (now, body)
            return body
        return None if cached is None else cached[1]  # the mint is down: its last known info

    async def fetch(self, kind: str, object_ids: list[str]) -> dict[str, dict[str, Any]]:
        """States of several objects of one kind: object id (as the key uses it) -> payload."""
        if kind == PROOF_STATE:
            return await self.proof_states(object_ids)
        found = await asyncio.gather(*(self.quote(kind, quote_id) for quote_id in object_ids))
        return {quote_id: payload for quote_id, payload in zip(object_ids, found) if payload is not None}

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


def _path_segment(value: str) -> str:
    return quote(value, safe="")
