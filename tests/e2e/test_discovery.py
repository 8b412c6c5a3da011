"""Spec 3.3 (actor discovery): gathered across registry shards, in a stable order."""

from __future__ import annotations

import time

from tests.e2e.client import HubClient, run
from tests.e2e.conftest import make_token

FLEET = [
    ("disc/alpha", ["inference", "analysis"], {"model": "m1", "gpu": True}),
    ("disc/bravo", ["inference"], {"model": "m2", "gpu": False}),
    ("disc/charlie", ["analysis"], {"model": "m1", "gpu": 1}),
    ("disc/delta", ["inference", "analysis", "vision"], {"model": "m1", "zone": {"name": "eu"}}),
    ("disc/echo", ["ui"], {}),
    ("disc/foxtrot", ["inference"], {"model": "m3"}),
    ("disc/golf", ["inference", "analysis"], {"model": "m1"}),
    ("disc/hotel", ["ui", "inference"], {"model": "m2"}),
]


async def _register_fleet(hub) -> list[HubClient]:
    clients = []
    for index, (address, capabilities, metadata) in enumerate(FLEET):
        client = await HubClient.open(hub.ws_urls[index % 2], address, make_token(address))
        reply = await client.request("hub:register", {"actorAddress": address, "capabilities": capabilities,
                                                      "metadata": metadata})
        assert reply["type"] == "hub:registered", reply
        clients.append(client)
    return clients


def _addresses(reply: dict) -> list[str]:
    return [actor["actorAddress"] for actor in reply["payload"]["actors"]]


def test_discovery_filters_pages_and_orders_across_shards(hub):
    async def scenario():
        fleet = await _register_fleet(hub)
        asker = await HubClient.open(hub.ws_urls[1], "browser/asker", make_token("browser/asker"))

        everyone = await asker.request("hub:discover", {"pattern": "^disc/"}, correlationId="d")
        assert everyone["type"] == "hub:discovery_result" and everyone["correlationId"] == "d"
        assert _addresses(everyone) == [address for address, _, _ in FLEET]
        assert everyone["payload"]["count"] == 8 and everyone["payload"]["totalMatches"] == 8
        assert everyone["payload"]["hasMore"] is False
        alpha = everyone["payload"]["actors"][0]
        assert set(alpha) == {"actorAddress", "capabilities", "metadata", "registeredAt"}
        assert alpha["capabilities"] == ["inference", "analysis"]
        assert alpha["metadata"] == {"model": "m1", "gpu": True}

        both = await asker.request("hub:discover", {"pattern": "^disc/", "capabilities": ["inference", "analysis"]})
        assert _addresses(both) == ["disc/alpha", "disc/delta", "disc/golf"]

        by_metadata = await asker.request("hub:discover", {"pattern": "^disc/", "metadata": {"model": "m1"}})
        assert _addresses(by_metadata) == ["disc/alpha", "disc/charlie", "disc/delta", "disc/golf"]
        strict = await asker.request("hub:discover", {"pattern": "^disc/", "metadata": {"gpu": True}})
        assert _addresses(strict) == ["disc/alpha"]  # 1 is not true
        nested = await asker.request("hub:discover", {"metadata": {"zone": {"name": "eu"}}})
        assert _addresses(nested) == ["disc/delta"]

        page = await asker.request("hub:discover", {"pattern": "^disc/", "limit": 3, "offset": 2})
        assert _addresses(page) == ["disc/charlie", "disc/delta", "disc/echo"]
        # A shard looks no further than one match past the page (offset + limit + 1 = 6): seven of
        # the fleet hash to one registry shard, so before the last page totalMatches is a lower
        # bound (6 + 1 here), always above offset + count; the last page has the exact total.
        assert page["payload"] | {"actors": None} == {"actors": None, "count": 3, "hasMore": True, "totalMatches": 7}
        last = await asker.request("hub:discover", {"pattern": "^disc/", "limit": 3, "offset": 6})
        assert _addresses(last) == ["disc/golf", "disc/hotel"]
        assert last["payload"] | {"actors": None} == {"actors": None, "count": 2, "hasMore": False, "totalMatches": 8}

        # A regular expression, searched anywhere in the address (like JavaScript's RegExp.test).
        middle = await asker.request("hub:discover", {"pattern": "o(t|$)"})
        assert _addresses(middle) == ["disc/bravo", "disc/echo", "disc/foxtrot", "disc/hotel"]

        listing = await asker.request("hub:list_actors", {"limit": 100})
        assert listing["type"] == "hub:discovery_result"
        listed = _addresses(listing)
        assert listed == sorted(listed) and set(a for a, _, _ in FLEET) <= set(listed)
        assert listing["payload"]["totalMatches"] == len(listed)
        for client in fleet:
            await client.close()
        await asker.close()

    run(scenario())


def test_discovery_bounds(hub):
    async def scenario():
        asker = await HubClient.open(hub.ws_urls[0], "browser/bounds", make_token("browser/bounds"))
        too_long = await asker.request("hub:discover", {"pattern": "a" * 257})
        assert too_long["payload"] == {"code": "internal_error",
                                       "message": "pattern is 257 characters; the limit is 256",
                                       "details": {"reason": "invalid_pattern", "field": "payload.pattern"}}
        broken = await asker.request("hub:discover", {"pattern": "(a)\\1"})
        assert broken["payload"]["details"] == {"reason": "invalid_pattern", "field": "payload.pattern"}
        assert broken["payload"]["message"].startswith("invalid pattern: ")
        # By default a page holds at most 100 actors (a larger limit is clamped, as the reference hub
        # does) and an offset beyond 10,000 is refused before any shard is asked.
        over = await asker.request("hub:discover", {"limit": 1001})
        assert over["type"] == "hub:discovery_result" and over["payload"]["count"] <= 100
        far = await asker.request("hub:discover", {"offset": 10_001}, correlationId="far")
        assert far["correlationId"] == "far" and far["payload"] == {
            "code": "internal_error", "message": "payload.offset must be an integer from 0 to 10000",
            "details": {"reason": "invalid_message", "field": "payload.offset"}}
        negative = await asker.request("hub:list_actors", {"offset": -1})
        assert negative["payload"]["details"] == {"reason": "invalid_message", "field": "payload.offset"}
        await asker.close()

    run(scenario())


def test_a_catastrophic_backtracking_pattern_cannot_stall_a_shard(hub):
    async def scenario():
        fleet = []
        for i in range(3):
            address = "redos/" + "a" * 40 + str(i)
            client = await HubClient.open(hub.ws_urls[0], address, make_token(address))
            await client.request("hub:register", {"actorAddress": address})
            fleet.append(client)
        asker = await HubClient.open(hub.ws_urls[1], "browser/evil", make_token("browser/evil"))
        started = time.monotonic()
        reply = await asker.request("hub:discover", {"pattern": "^redos/(a+)+$"})
        # Under Python's backtracking engine this search takes longer than the age of the universe.
        assert reply["payload"]["totalMatches"] == 0
        assert time.monotonic() - started < 5
        assert (await asker.request("hub:heartbeat", {}))["type"] == "hub:heartbeat_ack"
        for client in fleet:
            await client.close()
        await asker.close()

    run(scenario())
