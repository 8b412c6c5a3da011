"""Cashu state that outlives the router, and objects fetched from the mint's REST API."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import pytest
from aiohttp import web

from tests.e2e.cashu_client import API_KEY, Y1, Y2, Wallet, feed, mint_quote, proof_state, push
from tests.e2e.client import eventually, run
from tests.e2e.conftest import start_router
from tests.e2e.test_cashu import endpoints

pytestmark = pytest.mark.e2e


def test_last_states_survive_a_restart(ray_runtime, tmp_path):
    settings = dict(namespace="e2e-cashu-restart", data_dir=tmp_path, port=0, gateways=1, ray_dashboard=False,
                    shards={"session": 1, "topic": 2, "registry": 1}, signal={"enabled": False},
                    analytics={"enabled": False}, cashu={"state_api_key": API_KEY})
    first = start_router(**settings)
    try:
        (_, http_url), = endpoints(first)
        client = feed(http_url)
        client.push("bolt11_mint_quote", mint_quote("kept", "UNPAID"))
        client.push("bolt11_mint_quote", mint_quote("kept", "PAID"))
        client.push("proof_state", proof_state(Y1, "SPENT"))
    finally:
        first.router.stop()
    # Fewer topic shards than before: keys are read on demand, whichever shard owns them now.
    second = start_router(**{**settings, "shards": {"session": 1, "topic": 1, "registry": 1}})
    try:
        (ws_url, http_url), = endpoints(second)

        async def scenario():
            wallet = await Wallet.open(ws_url)
            await wallet.expect_ok(await wallet.subscribe("bolt11_mint_quote", ["kept"], "a"), "a")
            assert await wallet.notification() == ("a", mint_quote("kept", "PAID"))
            await wallet.expect_ok(await wallet.subscribe("proof_state", [Y1], "b"), "b")
            assert await wallet.notification() == ("b", proof_state(Y1, "SPENT"))
            result = await push(http_url, "bolt11_mint_quote", mint_quote("kept", "ISSUED"))
            assert (result["version"], result["subscribers"]) == (3, 1)
            assert await wallet.notification() == ("a", mint_quote("kept", "ISSUED"))
            await wallet.close()

        run(scenario())
    finally:
        second.router.stop()


class FakeMint:
    """The mint's REST API as NUT-04/05/06/07 describe it: the router is its client here."""

    def __init__(self) -> None:
        self.quotes = {"known": mint_quote("known", "UNPAID")}
        self.spent = {Y1}
        self.requests: list[str] = []
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/v1/info", self.info)
        app.router.add_get("/v1/mint/quote/bolt11/{quote}", self.quote)
        app.router.add_post("/v1/checkstate", self.checkstate)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"

    async def stop(self) -> None:
        await self.runner.cleanup()

    async def info(self, request: web.Request) -> web.Response:
        self.requests.append("info")
        return web.json_response({"name": "Fake mint", "pubkey": "02" + "11" * 32,
                                  "nuts": {"4": {"disabled": False}, "17": {"supported": []}}})

    async def quote(self, request: web.Request) -> web.Response:
        quote = request.match_info["quote"]
        self.requests.append("quote " + quote)
        if quote not in self.quotes:
            return web.json_response({"detail": "quote not found", "code": 20007}, status=400)
        return web.json_response(self.quotes[quote])

    async def checkstate(self, request: web.Request) -> web.Response:
        ys = (await request.json())["Ys"]
        self.requests.append("checkstate " + ",".join(ys))
        return web.json_response({"states": [proof_state(y, "SPENT" if y in self.spent else "UNSPENT") for y in ys]})


def test_unknown_objects_are_fetched_from_the_mint(ray_runtime, tmp_path):
    async def scenario():
        mint = FakeMint()
        await mint.start()
        running = await asyncio.to_thread(
            start_router, namespace="e2e-cashu-mint", data_dir=tmp_path, port=0, gateways=1, ray_dashboard=False,
            shards={"session": 1, "topic": 1, "registry": 1}, signal={"enabled": False},
            analytics={"enabled": False}, cashu={"state_api_key": API_KEY, "mint_url": mint.url + "/"})
        try:
            (ws_url, http_url), = endpoints(running)
            wallet = await Wallet.open(ws_url)
            await wallet.expect_ok(await wallet.subscribe("bolt11_mint_quote", ["known"], "q"), "q")
            assert await wallet.notification() == ("q", mint_quote("known", "UNPAID"))
            await wallet.expect_ok(await wallet.subscribe("proof_state", [Y1, Y2], "p"), "p")
            states = {(await wallet.notification())[1]["Y"]: None for _ in range(2)}
            assert set(states) == {Y1, Y2}
            await wallet.expect_ok(await wallet.subscribe("bolt11_mint_quote", ["nobody"], "n"), "n")
            await eventually(lambda: _true("quote nobody" in mint.requests))
            await wallet.quiet()
            # What the mint said is stored: the next push is version 2, and nothing is fetched again.
            result = await push(http_url, "bolt11_mint_quote", mint_quote("known", "PAID"))
            assert (result["version"], result["subscribers"]) == (2, 1)
            assert await wallet.notification() == ("q", mint_quote("known", "PAID"))
            second = await Wallet.open(ws_url)
            await second.expect_ok(await second.subscribe("bolt11_mint_quote", ["known"], "again"), "again")
            assert await second.notification() == ("again", mint_quote("known", "PAID"))
            assert mint.requests.count("quote known") == 1
            info = await asyncio.to_thread(lambda: json.loads(urllib.request.urlopen(http_url + "/v1/info", timeout=10).read()))
            assert info["name"] == "Fake mint" and info["nuts"]["4"] == {"disabled": False}
            assert info["nuts"]["17"]["supported"][0]["commands"] == ["bolt11_mint_quote", "bolt11_melt_quote", "proof_state"]
            # The mint is down: an unknown Y is still answered (UNSPENT, the configured default).
            await mint.stop()
            y3 = "02" + "ab" * 32
            await second.expect_ok(await second.subscribe("proof_state", [y3], "down"), "down")
            assert await second.notification() == ("down", proof_state(y3, "UNSPENT"))
            await wallet.close()
            await second.close()
        finally:
            await asyncio.to_thread(running.router.stop)

    run(scenario(), timeout=120)


async def _true(value: bool) -> bool:
    return value
