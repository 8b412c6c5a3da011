"""Cashu NUT-17 limits over real sockets: the shard fan-out of one subscription, and what the router
asks the mint for objects it has no state of.

``limits``: one gateway, two topic shards, the state feed on, and a mint (its REST API on its own
event loop) reached with one request at a time and at most two waiting or in flight, so the cap is
quick to hit.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import ray
from aiohttp import web

from router import contract
from router.shardmap import TOPIC, shard_name
from tests.e2e.cashu_client import API_KEY, Wallet, feed, mint_quote
from tests.e2e.client import eventually, run
from tests.e2e.conftest import RunningRouter, start_router
from tests.e2e.test_cashu import endpoints

pytestmark = [pytest.mark.e2e, pytest.mark.security]

MINT_MAX_REQUESTS = 1
MINT_MAX_PENDING = 8
SHARE = MINT_MAX_PENDING // 4  # lookups one subscription may have waiting


class ThreadedMint:
    """The mint's NUT-04 quote lookup on an event loop of its own (the module's tests share it).

    It knows every quote except ``ghost…`` ones (400 "quote not found", as Nutshell answers); while
    held, lookups of ``slow…`` quotes wait until released.
    """

    def __init__(self) -> None:
        self.requests: list[str] = []
        self.loop = asyncio.new_event_loop()
        self.gate = asyncio.Event()
        self.gate.set()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.runner, self.url = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)

    async def _start(self) -> tuple[web.AppRunner, str]:
        app = web.Application()
        app.router.add_get("/v1/mint/quote/bolt11/{quote}", self.quote)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"

    async def quote(self, request: web.Request) -> web.Response:
        quote = request.match_info["quote"]
        self.requests.append(quote)
        if quote.startswith("slow"):
            await self.gate.wait()
        if quote.startswith("ghost"):
            return web.json_response({"detail": "quote not found", "code": 20007}, status=400)
        return web.json_response(mint_quote(quote, "UNPAID"))

    def hold(self) -> None:
        async def clear() -> None:
            self.gate.clear()

        asyncio.run_coroutine_threadsafe(clear(), self.loop).result(10)  # held once this returns

    def release(self) -> None:
        self.loop.call_soon_threadsafe(self.gate.set)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)


class Limits:
    def __init__(self, running: RunningRouter, mint: ThreadedMint) -> None:
        self.running = running
        self.mint = mint
        (self.ws_url, self.http_url), = endpoints(running)

    def shard_commands(self) -> list[int]:
        """Commands each topic shard has run (``info`` is a Ray call: it runs none)."""
        settings = self.running.settings
        shards = [ray.get_actor(shard_name(TOPIC, i), namespace=settings.namespace)
                  for i in range(settings.shards.topic)]
        return [info["commands"] for info in ray.get([shard.info.remote() for shard in shards], timeout=30)]


@pytest.fixture(scope="module")
def limits(ray_runtime, tmp_path_factory) -> Limits:
    mint = ThreadedMint()
    running = start_router(
        namespace="e2e-cashu-limits", data_dir=tmp_path_factory.mktemp("cashu-limits"), port=0, gateways=1,
        ray_dashboard=False, shards={"session": 1, "topic": 2, "registry": 1}, signal={"enabled": False},
        nolag={"enabled": False}, mx={"enabled": False}, baqend={"enabled": False}, analytics={"enabled": False},
        cashu={"state_api_key": API_KEY, "mint_url": mint.url, "mint_max_requests": MINT_MAX_REQUESTS,
               "mint_max_pending": MINT_MAX_PENDING, "mint_unknown_ttl_s": 600},
    )
    yield Limits(running, mint)
    running.router.stop()
    mint.stop()


def unique(prefix: str) -> str:
    return f"{prefix}-{time.monotonic_ns()}"


# -- one subscription, one command per shard ------------------------------------------------------

def test_a_subscription_sends_at_most_one_command_per_shard(limits):
    """1,000 filters were 1,000 shard commands; now one per shard that owns any of them."""
    run_id = unique("fan")
    quotes = [f"{run_id}-{i}" for i in range(1000)]
    feed(limits.http_url).push_many([("bolt11_mint_quote", mint_quote(quote, "PAID")) for quote in quotes])

    async def scenario():
        wallet = await Wallet.open(limits.ws_url)
        before = await asyncio.to_thread(limits.shard_commands)
        # One filter over cashu.max_filters (1000): refused before any work.
        request_id = await wallet.subscribe("bolt11_mint_quote", quotes + ["one-more"], "over")
        assert await wallet.recv() == {"jsonrpc": "2.0", "id": request_id, "error": {
            "code": -32602, "message": "Invalid params: 1001 filters; at most 1000 per subscription"}}
        assert await asyncio.to_thread(limits.shard_commands) == before
        request_id = await wallet.subscribe("bolt11_mint_quote", quotes, "all")
        await wallet.expect_ok(request_id, "all")
        assert [await wallet.notification() for _ in quotes] == [("all", mint_quote(q, "PAID")) for q in quotes]
        after = await asyncio.to_thread(limits.shard_commands)
        assert [a - b for a, b in zip(after, before)] == [1, 1]  # the quotes hash onto both shards
        request_id = await wallet.send("unsubscribe", {"subId": "all"})
        assert await wallet.recv() == {"jsonrpc": "2.0", "result": {"status": "OK", "subId": "all"}, "id": request_id}

        async def unsubscribed() -> bool:
            now = await asyncio.to_thread(limits.shard_commands)
            return [a - b for a, b in zip(now, after)] == [1, 1]

        await eventually(unsubscribed)
        await wallet.quiet()
        assert await asyncio.to_thread(limits.shard_commands) == [a + 1 for a in after]
        await wallet.close()

    run(scenario())


# -- the mint: unknown quotes remembered, pending lookups capped ---------------------------------

def test_a_quote_the_mint_does_not_know_is_not_asked_again_soon(limits):
    """Every subscription to an unknown quote asked the mint again; now its "not found" is remembered."""
    ghost, first, second = unique("ghost"), unique("known"), unique("known")

    async def scenario():
        wallet = await Wallet.open(limits.ws_url)
        # The known quote's notification comes once both lookups of the subscription are answered.
        await wallet.expect_ok(await wallet.subscribe("bolt11_mint_quote", [ghost, first], "a"), "a")
        assert await wallet.notification() == ("a", mint_quote(first, "UNPAID"))
        await wallet.expect_ok(await wallet.subscribe("bolt11_mint_quote", [ghost, second], "b"), "b")
        assert await wallet.notification() == ("b", mint_quote(second, "UNPAID"))
        other = await Wallet.open(limits.ws_url)
        await other.expect_ok(await other.subscribe("bolt11_mint_quote", [ghost, first], "c"), "c")
        assert await other.notification() == ("c", mint_quote(first, "UNPAID"))  # stored: not asked again
        await wallet.quiet()
        await other.quiet()
        assert [quote for quote in limits.mint.requests if quote in (ghost, first, second)] == [ghost, first, second]
        for each in (wallet, other):
            await each.close()

    run(scenario())


def test_lookups_over_the_pending_cap_are_not_made(limits):
    """Lookups queued without bound behind the mint's slow answers; now at most mint_max_pending wait,
    and the rest are unknown at once (as if the mint had not answered)."""
    slow = [unique(f"slow{i}") for i in range(5)]
    later = unique("later")

    async def scenario():
        limits.mint.hold()
        wallet = await Wallet.open(limits.ws_url)
        await wallet.expect_ok(await wallet.subscribe("bolt11_mint_quote", slow, "s"), "s")
        await eventually(lambda: _value(slow[0] in limits.mint.requests))
        limits.mint.release()
        # (stored by the shards that own them, which answer in either order)
        notified = [await wallet.notification() for _ in range(SHARE)]
        assert sorted(notified, key=lambda n: n[1]["quote"]) == [
            ("s", mint_quote(quote, "UNPAID")) for quote in slow[:SHARE]]
        # The cap is free again: the next lookup is made, and the skipped ones never were.
        await wallet.expect_ok(await wallet.subscribe("bolt11_mint_quote", [later], "t"), "t")
        assert await wallet.notification() == ("t", mint_quote(later, "UNPAID"))
        await wallet.quiet()
        asked = [quote for quote in limits.mint.requests if quote in slow or quote == later]
        assert asked == slow[:SHARE] + [later]
        await wallet.close()

    run(scenario())


def test_a_full_lookup_budget_never_makes_a_proof_unspent(limits):
    """A checkstate over the budget used to be answered as if the mint had said nothing: every Y
    got unknown_proof_state ("unspent"). One client filling the budget made the router tell other
    wallets that spent proofs were unspent; now such a Y gets no notification until it is known."""
    held = [unique(f"slow-held{i}") for i in range(MINT_MAX_PENDING)]  # the mint holds "slow" ones
    y = "03" + format(time.monotonic_ns() % 16**64, "064x")

    async def scenario():
        limits.mint.hold()
        hog, victim = await Wallet.open(limits.ws_url), await Wallet.open(limits.ws_url)
        for index in range(0, MINT_MAX_PENDING, SHARE):  # the budget, a share at a time
            sub = f"h{index}"
            await hog.expect_ok(await hog.subscribe("bolt11_mint_quote", held[index:index + SHARE], sub), sub)
        await eventually(lambda: _value(sum(quote in limits.mint.requests for quote in held) >= MINT_MAX_REQUESTS))
        await victim.expect_ok(await victim.subscribe("proof_state", [y], "p"), "p")
        await victim.quiet()  # before: ("p", proof_state(y, "UNSPENT")) came first
        limits.mint.release()
        for _ in range(MINT_MAX_PENDING):
            await hog.notification()
        await hog.close()
        await victim.close()

    run(scenario())


async def _value(value):
    return value
