"""Signal Hub exhaustion limits: registrations and subscriptions per connection, bounded discovery.

A router of its own with small limits (one gateway, two registry and two topic shards), so each
limit is reached with a handful of requests.
"""

from __future__ import annotations

import json

import pytest

from tests.e2e.client import HUB, HubClient, eventually, run
from tests.e2e.conftest import start_router

pytestmark = pytest.mark.security

ONLY_SIGNAL = {"cashu": {"enabled": False}, "mx": {"enabled": False}, "nolag": {"enabled": False},
               "baqend": {"enabled": False}}
MAX_REGISTRATIONS = 3
MAX_SUBSCRIPTIONS = 3
MAX_LIMIT = 4
MAX_OFFSET = 20
MAX_REPLY_BYTES = 2048


@pytest.fixture(scope="module")
def limited(ray_runtime, tmp_path_factory):
    running = start_router(
        namespace="e2e-signal-limits", port=0, gateways=1, ray_dashboard=False,
        data_dir=tmp_path_factory.mktemp("signal-limits-data"),
        shards={"session": 1, "topic": 2, "registry": 2},
        signal={
            "rate_limit_per_minute": 6_000_000,
            "max_registrations_per_connection": MAX_REGISTRATIONS,
            "max_subscriptions_per_connection": MAX_SUBSCRIPTIONS,
            "discover_default_limit": MAX_LIMIT,
            "discover_max_limit": MAX_LIMIT,
            "max_discover_offset": MAX_OFFSET,
            "max_metadata_bytes": 1024,
            "max_discover_reply_bytes": MAX_REPLY_BYTES,
        },
        **ONLY_SIGNAL,
    )
    yield running
    running.router.stop()


def _over_registrations(to: str, correlation_id: str) -> dict:
    return {"type": "hub:error", "from": HUB, "to": to, "correlationId": correlation_id, "payload": {
        "code": "rate_limited",
        "message": f"This connection holds {MAX_REGISTRATIONS} registrations, the limit; unregister one first",
        "details": {"limit": MAX_REGISTRATIONS, "reason": "registrations_per_connection"},
    }}


def _over_subscriptions(to: str, correlation_id: str) -> dict:
    return {"type": "hub:error", "from": HUB, "to": to, "correlationId": correlation_id, "payload": {
        "code": "rate_limited",
        "message": f"This connection holds {MAX_SUBSCRIPTIONS} subscriptions, the limit; unsubscribe one first",
        "details": {"limit": MAX_SUBSCRIPTIONS, "reason": "subscriptions_per_connection"},
    }}


def _addresses(reply: dict) -> list[str]:
    return [actor["actorAddress"] for actor in reply["payload"]["actors"]]


async def _pipelined(client: HubClient, kind: str, payloads: list[dict], prefix: str) -> list[dict]:
    """Send every request before reading any reply (all are in flight together); replies in order."""
    for index, payload in enumerate(payloads):
        await client.send(kind, payload, correlationId=f"{prefix}{index}")
    return [await client.recv() for _ in payloads]


def test_a_connection_holds_at_most_max_registrations(limited):
    async def scenario():
        owner = await HubClient.open(limited.ws_urls[0], "seag/owner")
        for name in ("a", "b", "c"):
            reply = await owner.request("hub:register", {"actorAddress": f"cap/{name}"})
            assert reply["type"] == "hub:registered", reply
        # Re-registering an address it holds replaces it and takes no new place.
        again = await owner.request("hub:register", {"actorAddress": "cap/a"})
        assert again["type"] == "hub:registered" and again["payload"]["version"] == 2
        refused = await owner.request("hub:register", {"actorAddress": "cap/d"}, correlationId="over")
        assert refused == _over_registrations("seag/owner", "over")
        # Refused at the gateway: the registry never saw it.
        found = await owner.request("hub:discover", {"pattern": "^cap/"})
        assert _addresses(found) == ["cap/a", "cap/b", "cap/c"]

        # Unregistering gives the place back.
        gone = await owner.request("hub:unregister", {"actorAddress": "cap/b"})
        assert gone["type"] == "hub:unregistered"
        assert (await owner.request("hub:register", {"actorAddress": "cap/d"}))["type"] == "hub:registered"
        assert (await owner.request("hub:register", {"actorAddress": "cap/e"}, correlationId="again")) == \
            _over_registrations("seag/owner", "again")

        # The cap is per connection.
        other = await HubClient.open(limited.ws_urls[0], "seag/other")
        assert (await other.request("hub:register", {"actorAddress": "cap/e"}))["type"] == "hub:registered"
        await owner.close()
        await other.close()

    run(scenario())


def test_registrations_in_flight_count_against_the_cap(limited):
    async def scenario():
        client = await HubClient.open(limited.ws_urls[0], "seag/burst")
        replies = await _pipelined(client, "hub:register",
                                   [{"actorAddress": f"burst/{i}"} for i in range(MAX_REGISTRATIONS + 2)], "r")
        assert [reply["type"] for reply in replies[:MAX_REGISTRATIONS]] == ["hub:registered"] * MAX_REGISTRATIONS
        assert replies[MAX_REGISTRATIONS:] == [_over_registrations("seag/burst", f"r{i}")
                                               for i in range(MAX_REGISTRATIONS, MAX_REGISTRATIONS + 2)]
        found = await client.request("hub:discover", {"pattern": "^burst/"})
        assert _addresses(found) == [f"burst/{i}" for i in range(MAX_REGISTRATIONS)]
        await client.close()

    run(scenario())


def test_expired_registrations_stop_counting(limited):
    async def scenario():
        client = await HubClient.open(limited.ws_urls[0], "seag/brief")
        payloads = [{"actorAddress": f"ttl/{name}", "ttl": 1500} for name in ("a", "b", "c")]
        replies = await _pipelined(client, "hub:register", payloads + [{"actorAddress": "ttl/d"}], "t")
        assert [reply["type"] for reply in replies[:3]] == ["hub:registered"] * 3
        assert replies[3] == _over_registrations("seag/brief", "t3")

        async def registered() -> bool:
            reply = await client.request("hub:register", {"actorAddress": "ttl/d"})
            assert reply["type"] == "hub:registered" or reply["payload"]["code"] == "rate_limited", reply
            return reply["type"] == "hub:registered"

        await eventually(registered, timeout=15, interval=0.2)
        found = await client.request("hub:discover", {"pattern": "^ttl/"})
        assert _addresses(found) == ["ttl/d"]
        await client.close()

    run(scenario())


def test_a_connection_subscribes_to_at_most_max_subscriptions(limited):
    async def scenario():
        reader = await HubClient.open(limited.ws_urls[0], "browser/reader")
        writer = await HubClient.open(limited.ws_urls[0], "browser/writer")
        for topic in ("news/1", "news/2", "news/3"):
            assert (await reader.request("hub:subscribe", {"topic": topic}))["type"] == "hub:subscribed"
        # Subscribing again to a topic it has is one subscription, not a new one.
        assert (await reader.request("hub:subscribe", {"topic": "news/1"}))["type"] == "hub:subscribed"
        refused = await reader.request("hub:subscribe", {"topic": "news/4"}, correlationId="sub")
        assert refused == _over_subscriptions("browser/reader", "sub")
        ack = await writer.request("hub:publish", {"topic": "news/4", "message": {"n": 1}})
        assert ack["payload"] == {"topic": "news/4", "subscriberCount": 0, "deliveredCount": 0}

        # Unsubscribing gives the place back.
        assert (await reader.request("hub:unsubscribe", {"topic": "news/2"}))["type"] == "hub:unsubscribed"
        assert (await reader.request("hub:subscribe", {"topic": "news/4"}))["type"] == "hub:subscribed"
        publication = writer.envelope("hub:publish", {"topic": "news/4", "message": {"n": 2}}, correlationId="p")
        await writer.send_raw(json.dumps(publication))
        assert await reader.recv() == publication
        assert (await writer.recv())["payload"]["subscriberCount"] == 1

        # Subscriptions in flight count too.
        burst = await HubClient.open(limited.ws_urls[0], "browser/burst")
        replies = await _pipelined(burst, "hub:subscribe",
                                   [{"topic": f"many/{i}"} for i in range(MAX_SUBSCRIPTIONS + 2)], "s")
        assert [reply["type"] for reply in replies[:MAX_SUBSCRIPTIONS]] == ["hub:subscribed"] * MAX_SUBSCRIPTIONS
        assert replies[MAX_SUBSCRIPTIONS:] == [_over_subscriptions("browser/burst", f"s{i}")
                                               for i in range(MAX_SUBSCRIPTIONS, MAX_SUBSCRIPTIONS + 2)]
        for client in (reader, writer, burst):
            await client.close()

    run(scenario())


def test_disconnect_still_cleans_up_what_a_capped_connection_held(limited):
    addresses = [f"held/{name}" for name in ("a", "b", "c")]
    topics = [f"held/{i}" for i in range(MAX_SUBSCRIPTIONS)]

    async def fill(client: HubClient) -> None:
        for address in addresses:
            reply = await client.request("hub:register", {"actorAddress": address})
            assert reply["type"] == "hub:registered", reply
        for topic in topics:
            assert (await client.request("hub:subscribe", {"topic": topic}))["type"] == "hub:subscribed"
        over = await client.request("hub:register", {"actorAddress": "held/d"}, correlationId="full")
        assert over == _over_registrations(client.address, "full")

    async def scenario():
        first = await HubClient.open(limited.ws_urls[0], "seag/first")
        await fill(first)
        bye = await first.request("hub:disconnect", {"reason": "done"})
        assert bye["type"] == "hub:disconnect_ack" and bye["payload"]["cleanedUp"] is True
        publisher = await HubClient.open(limited.ws_urls[0], "seag/publisher")
        ack = await publisher.request("hub:publish", {"topic": topics[0], "message": {}})
        assert ack["payload"]["subscriberCount"] == 0

        # A new connection takes the same addresses (the registry forgot them) and has its own quota.
        second = await HubClient.open(limited.ws_urls[0], "seag/second")
        await fill(second)
        await second.close()  # socket loss, no hub:disconnect: the purge is fire-and-forget

        third = await HubClient.open(limited.ws_urls[0], "seag/third")

        async def taken_over() -> bool:
            reply = await third.request("hub:register", {"actorAddress": addresses[0]})
            assert reply["type"] == "hub:registered" or reply["payload"]["code"] == "unknown_actor", reply
            return reply["type"] == "hub:registered"

        await eventually(taken_over)
        for address in addresses[1:]:
            assert (await third.request("hub:register", {"actorAddress": address}))["type"] == "hub:registered"
        for client in (publisher, third):
            await client.close()

    run(scenario())


def test_discover_clamps_limit_and_bounds_offset_before_any_shard_work(limited):
    fleet = [f"page/{name}" for name in "abcdefgh"]

    async def scenario():
        owners = []
        for start in range(0, len(fleet), MAX_REGISTRATIONS):
            owner = await HubClient.open(limited.ws_urls[0], f"seag/pager-{start}")
            for address in fleet[start:start + MAX_REGISTRATIONS]:
                assert (await owner.request("hub:register", {"actorAddress": address}))["type"] == "hub:registered"
            owners.append(owner)
        asker = await HubClient.open(limited.ws_urls[0], "browser/pager")

        clamped = await asker.request("hub:discover", {"pattern": "^page/", "limit": 1000}, correlationId="big")
        assert clamped["type"] == "hub:discovery_result" and clamped["correlationId"] == "big"
        assert _addresses(clamped) == fleet[:MAX_LIMIT]
        assert clamped["payload"] | {"actors": None} == {"actors": None, "count": MAX_LIMIT, "hasMore": True,
                                                          "totalMatches": len(fleet)}
        rest = await asker.request("hub:discover", {"pattern": "^page/", "limit": 1000, "offset": MAX_LIMIT})
        assert _addresses(rest) == fleet[MAX_LIMIT:]
        assert rest["payload"] | {"actors": None} == {"actors": None, "count": 4, "hasMore": False, "totalMatches": 8}
        listing = await asker.request("hub:list_actors", {"limit": 1000})
        assert listing["payload"]["count"] == MAX_LIMIT

        far = await asker.request("hub:discover", {"pattern": "^page/", "offset": MAX_OFFSET + 1}, correlationId="far")
        assert far == {"type": "hub:error", "from": HUB, "to": "browser/pager", "correlationId": "far", "payload": {
            "code": "internal_error", "message": f"payload.offset must be an integer from 0 to {MAX_OFFSET}",
            "details": {"reason": "invalid_message", "field": "payload.offset"}}}
        zero = await asker.request("hub:list_actors", {"limit": 0}, correlationId="zero")
        assert zero["correlationId"] == "zero" and zero["payload"] == {
            "code": "internal_error", "message": "payload.limit must be an integer of at least 1",
            "details": {"reason": "invalid_message", "field": "payload.limit"}}
        for client in owners + [asker]:
            await client.close()

    run(scenario())


def test_each_registry_shard_stops_one_match_past_the_page(limited):
    """Shards walk their addresses in order and stop at offset + limit + 1 matches instead of
    matching the whole registry; totalMatches shows where they stopped (exact on the last page)."""
    fleet = [f"walk/{name}" for name in "abcdefghi"]  # six hash to one registry shard, three to the other

    async def scenario():
        owners = []
        for start in range(0, len(fleet), MAX_REGISTRATIONS):
            owner = await HubClient.open(limited.ws_urls[0], f"seag/walker-{start}")
            for address in fleet[start:start + MAX_REGISTRATIONS]:
                assert (await owner.request("hub:register", {"actorAddress": address}))["type"] == "hub:registered"
            owners.append(owner)
        asker = await HubClient.open(limited.ws_urls[0], "browser/walker")

        first = await asker.request("hub:discover", {"pattern": "^walk/", "limit": 2})
        assert _addresses(first) == ["walk/a", "walk/b"]
        # Each shard counted 3 = offset + limit + 1 matches and looked no further.
        assert first["payload"] | {"actors": None} == {"actors": None, "count": 2, "hasMore": True, "totalMatches": 6}
        middle = await asker.request("hub:discover", {"pattern": "^walk/", "limit": 2, "offset": 4})
        assert _addresses(middle) == ["walk/e", "walk/f"]
        assert middle["payload"] | {"actors": None} == {"actors": None, "count": 2, "hasMore": True, "totalMatches": 9}
        last = await asker.request("hub:discover", {"pattern": "^walk/", "limit": 2, "offset": 8})
        assert _addresses(last) == ["walk/i"]
        assert last["payload"] | {"actors": None} == {"actors": None, "count": 1, "hasMore": False, "totalMatches": 9}
        for client in owners + [asker]:
            await client.close()

    run(scenario())


def test_a_discovery_reply_is_cut_to_max_discover_reply_bytes(limited):
    fleet = [f"big/{name}" for name in "abcd"]
    metadata = {"blob": "x" * 900}  # an entry encodes to about 1 KB: two fit in 2 KiB, three do not

    async def scenario():
        owners = []
        for start in range(0, len(fleet), MAX_REGISTRATIONS):
            owner = await HubClient.open(limited.ws_urls[0], f"seag/big-{start}")
            for address in fleet[start:start + MAX_REGISTRATIONS]:
                reply = await owner.request("hub:register", {"actorAddress": address, "metadata": metadata})
                assert reply["type"] == "hub:registered", reply
            owners.append(owner)
        asker = await HubClient.open(limited.ws_urls[0], "browser/big")

        first = await asker.request("hub:discover", {"pattern": "^big/"})
        assert _addresses(first) == fleet[:2]
        assert first["payload"]["actors"][0]["metadata"] == metadata
        assert first["payload"] | {"actors": None} == {"actors": None, "count": 2, "hasMore": True, "totalMatches": 4}
        assert len(json.dumps(first["payload"]["actors"], separators=(",", ":"))) <= MAX_REPLY_BYTES
        second = await asker.request("hub:discover", {"pattern": "^big/", "offset": 2})
        assert _addresses(second) == fleet[2:]
        assert second["payload"] | {"actors": None} == {"actors": None, "count": 2, "hasMore": False,
                                                         "totalMatches": 4}
        for client in owners + [asker]:
            await client.close()

    run(scenario())
