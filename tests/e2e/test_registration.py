"""Spec 3.2 (actor registration): TTL, renewal tokens, versions, conflicts, limits."""

from __future__ import annotations

import re

from tests.e2e.client import HUB, HubClient, eventually, now_ms, run
from tests.e2e.conftest import make_token


def test_register_returns_token_expiry_and_version(hub):
    async def scenario():
        client = await HubClient.open(hub.ws_urls[0], "seag/reg-a", make_token("seag/reg-a"))
        before = now_ms()
        reply = await client.request("hub:register", {
            "actorAddress": "seag/reg-a", "capabilities": ["inference"], "metadata": {"model": "m1"}, "ttl": 300000,
        }, correlationId="r")
        assert reply["type"] == "hub:registered" and reply["from"] == HUB and reply["to"] == "seag/reg-a"
        assert reply["correlationId"] == "r"
        payload = reply["payload"]
        assert set(payload) == {"actorAddress", "renewalToken", "expiresAt", "version"}
        assert payload["actorAddress"] == "seag/reg-a" and payload["version"] == 1
        assert re.fullmatch(r"tok_[A-Za-z0-9_-]{24}", payload["renewalToken"])
        assert before + 300000 <= payload["expiresAt"] <= now_ms() + 300000
        # The same connection registering again replaces its registration: new version and token.
        again = (await client.request("hub:register", {"actorAddress": "seag/reg-a"}))["payload"]
        assert again["version"] == 2 and again["renewalToken"] != payload["renewalToken"]
        await client.close()

    run(scenario())


def test_conflict_with_a_live_registration_of_another_connection(hub):
    async def scenario():
        owner = await HubClient.open(hub.ws_urls[0], "seag/contested", make_token("seag/contested"))
        held = (await owner.request("hub:register", {"actorAddress": "seag/contested"}))["payload"]
        rival = await HubClient.open(hub.ws_urls[1], "seag/contested", make_token("seag/contested"))
        reply = await rival.request("hub:register", {"actorAddress": "seag/contested"}, correlationId="dup")
        assert reply == {
            "type": "hub:error", "from": HUB, "to": "seag/contested",
            "payload": {
                "code": "unknown_actor",
                "message": "Actor seag/contested already registered",
                "details": {"existingVersion": held["version"], "existingExpiresAt": held["expiresAt"],
                            "hint": "Wait for expiration or use different address"},
            },
            "correlationId": "dup",
        }
        # Once the owner leaves, the address is free again.
        await owner.close()

        async def taken():
            answer = await rival.request("hub:register", {"actorAddress": "seag/contested"})
            return answer["type"] == "hub:registered" and answer

        assert (await eventually(taken))["payload"]["version"] == 1
        await rival.close()

    run(scenario())


def test_unregister_and_its_ownership_rules(hub):
    async def scenario():
        owner = await HubClient.open(hub.ws_urls[0], "seag/unreg", make_token("seag/unreg"))
        await owner.request("hub:register", {"actorAddress": "seag/unreg"})
        other = await HubClient.open(hub.ws_urls[1], "seag/unreg", make_token("seag/unreg"))
        refused = await other.request("hub:unregister", {"actorAddress": "seag/unreg"})
        assert refused["payload"] == {"code": "unauthorized",
                                      "message": "Actor seag/unreg is registered by another connection",
                                      "details": {"actorAddress": "seag/unreg"}}
        before = now_ms()
        reply = await owner.request("hub:unregister", {"actorAddress": "seag/unreg"}, correlationId="u")
        assert reply["type"] == "hub:unregistered" and reply["correlationId"] == "u"
        assert reply["payload"]["actorAddress"] == "seag/unreg"
        assert before <= reply["payload"]["unregisteredAt"] <= now_ms()
        missing = await owner.request("hub:unregister", {"actorAddress": "seag/unreg"})
        assert missing["payload"] == {"code": "unknown_actor", "message": "Actor seag/unreg not registered or expired",
                                      "details": {"actorAddress": "seag/unreg"}}
        await owner.close()
        await other.close()

    run(scenario())


def test_renew_extends_the_ttl_and_rotates_the_token(hub):
    async def scenario():
        client = await HubClient.open(hub.ws_urls[1], "seag/renewer", make_token("seag/renewer"))
        first = (await client.request("hub:register", {"actorAddress": "seag/renewer", "ttl": 60000}))["payload"]
        before = now_ms()
        reply = await client.request("hub:renew", {"actorAddress": "seag/renewer",
                                                   "renewalToken": first["renewalToken"], "ttl": 600000})
        assert reply["type"] == "hub:renewed"
        payload = reply["payload"]
        assert set(payload) == {"actorAddress", "expiresAt", "newRenewalToken"}
        assert payload["actorAddress"] == "seag/renewer"
        assert before + 600000 <= payload["expiresAt"] <= now_ms() + 600000
        assert payload["newRenewalToken"] != first["renewalToken"]
        stale = await client.request("hub:renew", {"actorAddress": "seag/renewer",
                                                   "renewalToken": first["renewalToken"]})
        assert stale["payload"] == {"code": "unauthorized", "message": "Invalid or expired renewal token",
                                    "details": {"actorAddress": "seag/renewer"}}
        unknown = await client.request("hub:renew", {"actorAddress": "seag/nobody", "renewalToken": "tok_x"})
        assert unknown["payload"]["code"] == "unknown_actor"
        await client.close()

    run(scenario())


def test_registration_expires_after_its_ttl(hub):
    async def scenario():
        target = await HubClient.open(hub.ws_urls[0], "seag/ephemeral", make_token("seag/ephemeral"))
        await target.request("hub:register", {"actorAddress": "seag/ephemeral", "ttl": 300})
        sender = await HubClient.open(hub.ws_urls[1], "browser/sender", make_token("browser/sender"))

        async def expired():
            reply = await sender.request("hub:discover", {"pattern": "^seag/ephemeral$"})
            return reply["payload"]["totalMatches"] == 0

        await eventually(expired, timeout=5)
        reply = await sender.request("hub:send", {"x": 1}, to="seag/ephemeral", correlationId="late")
        assert reply["payload"] == {"code": "unknown_actor",
                                    "message": "Actor seag/ephemeral not registered or disconnected",
                                    "details": {"targetActor": "seag/ephemeral"}}
        await target.close()
        await sender.close()

    run(scenario())


def test_with_auth_an_actor_registers_only_its_own_address(hub):
    async def scenario():
        client = await HubClient.open(hub.ws_urls[0], "seag/honest", make_token("seag/honest"))
        reply = await client.request("hub:register", {"actorAddress": "seag/other"})
        assert reply["payload"] == {"code": "unauthorized", "message": "The token allows registering seag/honest only",
                                    "details": {"actorId": "seag/honest", "actorAddress": "seag/other"}}
        await client.close()

    run(scenario())


def test_invalid_registration_payloads(open_hub):
    async def scenario():
        client = await HubClient.open(open_hub.ws_urls[0], "seag/sloppy")
        bad_address = await client.request("hub:register", {"actorAddress": "Seag/UPPER"})
        assert bad_address["payload"] == {
            "code": "internal_error",
            "message": "payload.actorAddress must be an address matching ^[a-z0-9-]+/[a-z0-9-]+$",
            "details": {"reason": "invalid_address", "field": "payload.actorAddress"},
        }
        bad_ttl = await client.request("hub:register", {"actorAddress": "seag/sloppy", "ttl": -5})
        assert bad_ttl["payload"]["details"] == {"reason": "invalid_message", "field": "payload.ttl"}
        bad_caps = await client.request("hub:register", {"actorAddress": "seag/sloppy", "capabilities": "x"})
        assert bad_caps["payload"]["details"] == {"reason": "invalid_message", "field": "payload.capabilities"}
        big = {"blob": "x" * 3000}
        too_much = await client.request("hub:register", {"actorAddress": "seag/sloppy", "metadata": big})
        assert too_much["payload"] == {  # within the message limit, over the metadata limit
            "code": "internal_error",
            "message": "payload.metadata must encode to at most 1024 bytes",
            "details": {"reason": "invalid_message", "field": "payload.metadata"},
        }
        await client.close()

    run(scenario())


def test_registry_capacity_is_enforced(open_hub):
    limit = open_hub.settings.signal.max_actors

    async def scenario():
        client = await HubClient.open(open_hub.ws_urls[0], "seag/filler")
        for i in range(limit):
            reply = await client.request("hub:register", {"actorAddress": f"seag/fill-{i}"})
            assert reply["type"] == "hub:registered", reply
        full = await client.request("hub:register", {"actorAddress": "seag/fill-extra"})
        assert full["payload"] == {
            "code": "rate_limited",
            "message": f"Registry at capacity ({limit} actors); existing actors can still renew",
            "details": {"limit": limit},
        }
        # Re-registering an address it already holds is still allowed at capacity.
        assert (await client.request("hub:register", {"actorAddress": "seag/fill-0"}))["payload"]["version"] == 2
        await client.close()

    run(scenario())
