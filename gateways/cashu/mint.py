"""The mint's REST API, for objects the router has never been told about (optional).

When ``cashu.mint_url`` is set, a subscription to an object without a stored state asks the mint:
NUT-04/05 quote lookups and NUT-07 ``checkstate``; ``GET /v1/info`` merges the mint's own info.
Every call is bounded by ``mint_timeout_s``; a mint that fails or times out means "unknown".

Wallets choose what is looked up, so the lookups are bounded per gateway: at most
``mint_max_requests`` in flight and ``mint_max_pending`` waiting or in flight (one per quote, one
per ``checkstate``); a lookup beyond that is not made and its object is unknown, as if the mint had
timed out. A quote the mint answered it does not know (400, 404) is not asked again for
``mint_unknown_ttl_s``, so subscribing to made-up ids again and again does not reach the mint.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from typing import Any, Callable, Hashable
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

# How mints answer a lookup of a quote they do not know (Nutshell: 400, code 20007). Not 429 or
# 5xx: those say nothing about the quote.
NOT_FOUND = (400, 404)


class RecentlyUnknown:
    """Ids the mint said it does not know, each remembered for ``ttl_s`` (0: none); at most ``size``,
    the oldest forgotten first."""

    def __init__(self, ttl_s: float, size: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.size = size
        self._clock = clock
        self._until: OrderedDict[Hashable, float] = OrderedDict()  # oldest first: one ttl for all

    def __contains__(self, item: Hashable) -> bool:
        until = self._until.get(item)
        if until is None:
            return False
        if self._clock() < until:
            return True
        del self._until[item]
        return False

    def add(self, item: Hashable) -> None:
        if self.ttl_s <= 0:
            return
        now = self._clock()
        entries = self._until
        entries[item] = now + self.ttl_s
        entries.move_to_end(item)
        while entries and (len(entries) > self.size or next(iter(entries.values())) <= now):
            entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._until)


class MintClient:
    def __init__(self, base_url: str, timeout_s: float, info_ttl_s: float, max_requests: int = 16,
                 max_pending: int = 256, unknown_ttl_s: float = 30, unknown_size: int = 10_000) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.info_ttl_s = info_ttl_s
        self._session: aiohttp.ClientSession | None = None
        self._slots = asyncio.Semaphore(max_requests)
        self._info: tuple[float, dict[str, Any]] | None = None
        self.max_pending = max_pending
        self.pending = 0  # lookups waiting for a slot or in flight
        self.unknown = RecentlyUnknown(unknown_ttl_s, unknown_size)  # (kind, quote id)
        self.requests = 0
        self.failures = 0
        self.skipped = 0  # lookups not made: over max_pending

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self.timeout, raise_for_status=False)
        return self._session

    async def _call(self, method: str, path: str, body: Any = None) -> tuple[int | None, Any]:
        """The mint's HTTP status and, for a 200, its JSON body; no status if it could not be asked
        or its answer was not JSON."""
        async with self._slots:
            self.requests += 1
            try:
                async with self._client().request(
                    method, self.base_url + path, data=None if body is None else orjson.dumps(body),
                    headers={"Content-Type": "application/json"} if body is not None else None,
                ) as response:
                    if response.status != 200:
                        return response.status, None
                    return 200, orjson.loads(await response.read())
            except (aiohttp.ClientError, asyncio.TimeoutError, orjson.JSONDecodeError, ValueError) as error:
                self.failures += 1
                logger.info("mint %s %s failed: %s", method, path, error)
                return None, None

    async def quote(self, kind: str, quote_id: str) -> dict[str, Any] | None:
        """The quote's current state, or None when the mint does not know it (or cannot say)."""
        status, body = await self._call("GET", QUOTE_PATHS[kind] + _path_segment(quote_id))
        if isinstance(body, dict) and body.get("quote") == quote_id:
            return body
        if status in NOT_FOUND:
            self.unknown.add((kind, quote_id))
        return None

    async def proof_states(self, ys: list[str]) -> dict[str, dict[str, Any]]:
        """NUT-07 checkstate: Y (lower case) -> proof state."""
        _, body = await self._call("POST", "/v1/checkstate", {"Ys": ys})
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
        _, body = await self._call("GET", "/v1/info")
        if isinstance(body, dict):
            self._info = (now, body)
            return body
        return None if cached is None else cached[1]  # the mint is down: its last known info

    async def fetch(self, kind: str, object_ids: list[str]) -> dict[str, dict[str, Any]] | None:
        """States of several objects of one kind: object id (as the key uses it) -> payload. Leaves
        out quotes the mint recently said it does not know, and lookups over ``max_pending``; None
        when a checkstate was over the budget and not made (nothing may be assumed of those Ys)."""
        if kind == PROOF_STATE:
            if not self._admit(1):  # one checkstate for all the Ys
                return None
            try:
                return await self.proof_states(object_ids)
            finally:
                self.pending -= 1
        wanted = [quote_id for quote_id in object_ids if (kind, quote_id) not in self.unknown]
        # One request takes at most a quarter of the budget: one client cannot use it all up.
        share = min(len(wanted), max(1, self.max_pending // 4))
        self.skipped += len(wanted) - share
        admitted = wanted[:self._admit(share)]
        try:
            found = await asyncio.gather(*(self.quote(kind, quote_id) for quote_id in admitted))
        finally:
            self.pending -= len(admitted)
        return {quote_id: payload for quote_id, payload in zip(admitted, found) if payload is not None}

    def _admit(self, count: int) -> int:
        """How many of ``count`` lookups may wait for the mint now; the others are not made."""
        admitted = max(0, min(count, self.max_pending - self.pending))
        self.pending += admitted
        self.skipped += count - admitted
        return admitted

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


def _path_segment(value: str) -> str:
    return quote(value, safe="")
