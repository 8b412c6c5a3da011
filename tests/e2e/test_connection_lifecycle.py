"""Spec 3.1 (connection lifecycle) and 1.3 (JWT capabilities), over real sockets."""

from __future__ import annotations

import base64
import json
import re
import time

from websockets.exceptions import ConnectionClosed

from tests.e2e.client import HUB, HubClient, eventually, now_ms, run
from tests.e2e.conftest import SECRET, make_token


def test_connect_with_jwt_returns_session_identity_and_token_capabilities(hub):
    async def scenario():
        client = await HubClient.open(hub.ws_urls[0], "browser/client-ui", hello=False)
        token = make_token("browser/client-ui", ["send", "discover"])
        before = now_ms()
        reply = await client.request("hub:connect", {"version": "1.0", "jwt": token}, correlationId="conn-1")
        assert set(reply) == {"type", "from", "to", "payload", "correlationId"}
        assert reply["type"] == "hub:connected"
        assert reply["from"] == HUB and reply["to"] == "browser/client-ui"
        assert reply["correlationId"] == "conn-1"
        payload = reply["payload"]
        assert set(payload) == {"sessionId", "actorIdentity", "capabilities", "serverTime"}
        assert re.fullmatch(r"sess_[0-9a-f]{24}", payload["sessionId"])
        assert payload["actorIdentity"] == "browser/client-ui"
        assert payload["capabilities"] == ["send", "discover"]
        assert before <= payload["serverTime"] <= now_ms()
        await client.close()

    run(scenario())


def test_version_mismatch_is_refused_with_expected_and_received(hub):
    async def scenario():
        client = await HubClient.open(hub.ws_urls[0], "browser/old", hello=False)
        reply = await client.request("hub:connect", {"version": "0.9", "jwt": make_token("browser/old")},
                                     correlationId="v")
        assert reply == {
            "type": "hub:error", "from": HUB, "to": "browser/old",
            "payload": {"code": "version_mismatch", "message": "Protocol version 1.0 required, got 0.9",
                        "details": {"expected": "1.0", "received": "0.9"}},
            "correlationId": "v",
        }
        await client.close()

    run(scenario())


def _unauthorized(reply: dict, message: str) -> None:
    assert reply["type"] == "hub:error", reply
    assert reply["payload"]["code"] == "unauthorized", reply
    assert reply["payload"]["message"] == message, reply


def _alg_none_token(actor: str) -> str:
    def part(obj: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()

    claims = {"actorId": actor, "capabilities": ["send"], "exp": int(time.time()) + 3600}
    return f"{part({'alg': 'none', 'typ': 'JWT'})}.{part(claims)}."


def test_bad_tokens_are_unauthorized(hub):
    cases = [
        (None, "A JWT is required (payload.jwt)"),
        (make_token("browser/x", expires_in=-30), "JWT expired"),
        (make_token("browser/x", secret="another-secret-0123456789abcdef0123"), "JWT signature is invalid"),
        (_alg_none_token("browser/x"), "JWT algorithm not allowed; accepted: HS256"),
        (make_token("browser/x", algorithm="HS512"), "JWT algorithm not allowed; accepted: HS256"),
        (make_token("browser/someone-else"), "JWT actorId does not match 'from'"),
        ("not-a-jwt", "JWT is invalid: Not enough segments"),
    ]

    async def scenario():
        client = await HubClient.open(hub.ws_urls[0], "browser/x", hello=False)
        for token, message in cases:
            payload = {"version": "1.0"} if token is None else {"version": "1.0", "jwt": token}
            _unauthorized(await client.request("hub:connect", payload), message)
        # Still not connected: every other message is refused.
        _unauthorized(await client.request("hub:heartbeat", {"timestamp": now_ms()}), "Send hub:connect first")
        await client.close()

    run(scenario())


def test_token_without_exp_is_unauthorized(hub):
    import jwt

    token = jwt.encode({"actorId": "browser/x", "capabilities": ["send"]}, SECRET, algorithm="HS256")

    async def scenario():
        client = await HubClient.open(hub.ws_urls[0], "browser/x", hello=False)
        reply = await client.request("hub:connect", {"version": "1.0", "jwt": token})
        _unauthorized(reply, "JWT lacks the required 'exp' claim")
        await client.close()

    run(scenario())


def test_missing_capability_and_wrong_from_are_unauthorized(hub):
    async def scenario():
        token = make_token("browser/limited", ["discover"])
        client = await HubClient.open(hub.ws_urls[0], "browser/limited", token)
        reply = await client.request("hub:send", {"x": 1}, to="seag/agent-1")
        _unauthorized(reply, "Missing capability 'send' for hub:send")
        assert reply["payload"]["details"] == {"required": "send", "capabilities": ["discover"]}
        for kind, payload, capability in [
            ("hub:register", {"actorAddress": "browser/limited"}, "receive"),
            ("hub:broadcast", {"type": "x"}, "broadcast"),
            ("hub:subscribe", {"topic": "t"}, "subscribe"),
            ("hub:publish", {"topic": "t", "message": 1}, "publish"),
        ]:
            _unauthorized(await client.request(kind, payload), f"Missing capability '{capability}' for {kind}")
        client.address = "browser/impostor"
        reply = await client.request("hub:discover", {})
        _unauthorized(reply, "'from' must be the authenticated actor browser/limited")
        await client.close()

    run(scenario())


def test_token_expiring_during_the_session_stops_further_messages(hub):
    async def scenario():
        token = make_token("browser/short", expires_in=2)
        client = await HubClient.open(hub.ws_urls[0], "browser/short", token)

        async def refused():
            reply = await client.request("hub:heartbeat", {})
            return reply["type"] == "hub:error" and reply

        reply = await eventually(refused, timeout=8, interval=0.2)
        _unauthorized(reply, "JWT expired; reconnect with a fresh token")
        await client.close()

    run(scenario())


def test_heartbeat_is_acknowledged_with_server_time(hub):
    async def scenario():
        client = await HubClient.open(hub.ws_urls[1], "browser/beat", make_token("browser/beat"))
        before = now_ms()
        reply = await client.request("hub:heartbeat", {"timestamp": before}, correlationId="hb")
        assert reply["type"] == "hub:heartbeat_ack" and reply["correlationId"] == "hb"
        assert list(reply["payload"]) == ["serverTime"]
        assert before <= reply["payload"]["serverTime"] <= now_ms()
        await client.close()

    run(scenario())


def test_disconnect_acks_before_closing_and_cleans_up(hub):
    async def scenario():
        leaving = await HubClient.open(hub.ws_urls[0], "seag/leaving", make_token("seag/leaving"))
        session = (await leaving.request("hub:connect", {"version": "1.0", "jwt": make_token("seag/leaving")}))
        session_id = session["payload"]["sessionId"]
        assert (await leaving.request("hub:register", {"actorAddress": "seag/leaving"}))["type"] == "hub:registered"
        assert (await leaving.request("hub:subscribe", {"topic": "leaving/t"}))["type"] == "hub:subscribed"
        ack = await leaving.request("hub:disconnect", {"reason": "User logout"}, correlationId="bye")
        assert ack == {"type": "hub:disconnect_ack", "from": HUB, "to": "seag/leaving",
                       "payload": {"sessionId": session_id, "cleanedUp": True}, "correlationId": "bye"}
        try:
            await leaving.recv(timeout=5)
            raise AssertionError("the connection should be closed after the ack")
        except ConnectionClosed:
            pass
        assert leaving.ws.close_code == 1000

        observer = await HubClient.open(hub.ws_urls[1], "browser/observer", make_token("browser/observer"))
        found = await observer.request("hub:discover", {"pattern": "^seag/leaving$"})
        assert found["payload"]["totalMatches"] == 0
        published = await observer.request("hub:publish", {"topic": "leaving/t", "message": "x"})
        assert published["payload"]["subscriberCount"] == 0
        await observer.close()

    run(scenario())


def test_messages_before_connect_are_unauthorized(open_hub):
    async def scenario():
        client = await HubClient.open(open_hub.ws_urls[0], "browser/early", hello=False)
        reply = await client.request("hub:register", {"actorAddress": "browser/early"}, correlationId="early")
        assert reply == {"type": "hub:error", "from": HUB, "to": "browser/early",
                         "payload": {"code": "unauthorized", "message": "Send hub:connect first"},
                         "correlationId": "early"}
        await client.close()

    run(scenario())


def test_anonymous_connect_grants_configured_capabilities(open_hub):
    async def scenario():
        client = await HubClient.open(open_hub.ws_urls[0], "browser/anon", hello=False)
        reply = await client.request("hub:connect", {"version": "1.0"})
        assert reply["payload"]["capabilities"] == ["send", "receive", "discover", "broadcast", "publish", "subscribe"]
        assert reply["payload"]["actorIdentity"] == "browser/anon"
        await client.close()

    run(scenario())


def test_silent_connection_is_closed_after_heartbeat_timeout_and_cleaned_up(open_hub):
    async def scenario():
        silent = await HubClient.open(open_hub.ws_urls[0], "seag/silent")
        assert (await silent.request("hub:register", {"actorAddress": "seag/silent"}))["type"] == "hub:registered"
        started = time.monotonic()
        try:
            await silent.recv(timeout=15)
            raise AssertionError("expected the router to close a silent connection")
        except ConnectionClosed:
            pass
        assert silent.ws.close_code == 1001 and silent.ws.close_reason == "heartbeat timeout"
        assert time.monotonic() - started >= open_hub.settings.signal.heartbeat_timeout_s - 0.5

        observer = await HubClient.open(open_hub.ws_urls[0], "browser/watch")
        reply = await observer.request("hub:send", {"ping": 1}, to="seag/silent", correlationId="gone")
        assert reply["payload"]["code"] == "unknown_actor" and reply["correlationId"] == "gone"
        await observer.close()

    run(scenario())


def test_any_message_keeps_the_connection_alive(open_hub):
    async def scenario():
        client = await HubClient.open(open_hub.ws_urls[0], "browser/chatty")
        timeout = open_hub.settings.signal.heartbeat_timeout_s
        deadline = time.monotonic() + timeout * 1.7
        while time.monotonic() < deadline:  # well past one timeout, sending every third of it
            reply = await client.request("hub:queue_stats", {})
            assert reply["type"] == "hub:queue_stats_result"
            try:
                await client.recv(timeout=timeout / 3)
                raise AssertionError("unexpected frame")
            except TimeoutError:
                pass
        await client.close()

    run(scenario())
