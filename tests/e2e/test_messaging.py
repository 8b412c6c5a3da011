"""Spec 3.4 (point-to-point) and 3.5 (broadcast), across two gateways."""

from __future__ import annotations

import json

from tests.e2e.client import HUB, HubClient, now_ms, run
from tests.e2e.conftest import make_token


async def _registered(url: str, address: str) -> HubClient:
    client = await HubClient.open(url, address, make_token(address))
    reply = await client.request("hub:register", {"actorAddress": address})
    assert reply["type"] == "hub:registered", reply
    return client


def test_send_reaches_an_actor_on_another_gateway_byte_for_byte(hub):
    async def scenario():
        agent = await _registered(hub.ws_urls[1], "seag/agent-1")
        ui = await HubClient.open(hub.ws_urls[0], "browser/client-ui", make_token("browser/client-ui"))
        message = json.dumps({
            "type": "hub:send", "from": "browser/client-ui", "to": "seag/agent-1",
            "payload": {"type": "inference_request", "prompt": "Analyze this data...", "sessionId": "sess_user_123"},
            "correlationId": "req_abc123",
        })
        await ui.send_raw(message)
        assert await agent.recv_raw() == message  # forwarded exactly as sent
        # The target may also be named in payload.to (the reference client's form).
        await ui.send("hub:send", {"to": "seag/agent-1", "type": "ping", "data": 1})
        forwarded = await agent.recv()
        assert forwarded["payload"] == {"to": "seag/agent-1", "type": "ping", "data": 1}
        assert forwarded["from"] == "browser/client-ui"
        await agent.close()
        await ui.close()

    run(scenario())


def test_send_keeps_per_connection_order_across_gateways(hub):
    async def scenario():
        sink = await _registered(hub.ws_urls[0], "seag/sink")
        source = await HubClient.open(hub.ws_urls[1], "browser/source", make_token("browser/source"))
        for i in range(2000):
            await source.send("hub:send", {"n": i}, to="seag/sink")
        received = [(await sink.recv())["payload"]["n"] for _ in range(2000)]
        assert received == list(range(2000))
        await sink.close()
        await source.close()

    run(scenario())


def test_send_to_an_unknown_actor_answers_with_the_correlation_id(hub):
    async def scenario():
        ui = await HubClient.open(hub.ws_urls[0], "browser/client-ui", make_token("browser/client-ui"))
        reply = await ui.request("hub:send", {"type": "x"}, to="seag/agent-404", correlationId="req_abc123")
        assert reply == {
            "type": "hub:error", "from": HUB, "to": "browser/client-ui",
            "payload": {"code": "unknown_actor", "message": "Actor seag/agent-404 not registered or disconnected",
                        "details": {"targetActor": "seag/agent-404"}},
            "correlationId": "req_abc123",
        }
        bad = await ui.request("hub:send", {"type": "x"}, to="NOT AN ADDRESS")
        assert bad["payload"] == {"code": "internal_error",
                                  "message": "'to' must be an address matching ^[a-z0-9-]+/[a-z0-9-]+$",
                                  "details": {"reason": "invalid_address", "field": "to"}}
        await ui.close()

    run(scenario())


def test_expired_messages_are_refused(hub):
    async def scenario():
        agent = await _registered(hub.ws_urls[1], "seag/ttl")
        ui = await HubClient.open(hub.ws_urls[0], "browser/ttl", make_token("browser/ttl"))
        stamp = now_ms() - 10_000
        reply = await ui.request("hub:send", {"x": 1}, to="seag/ttl", timestamp=stamp, ttl=5000, correlationId="old")
        assert reply["type"] == "hub:error" and reply["correlationId"] == "old"
        assert reply["payload"]["code"] == "message_expired"
        assert reply["payload"]["message"] == "Message TTL exceeded before it reached the hub"
        assert reply["payload"]["details"]["timestamp"] == stamp and reply["payload"]["details"]["ttl"] == 5000
        # A fresh one with the same TTL goes through; the expired one never arrived.
        await ui.send("hub:send", {"x": 2}, to="seag/ttl", timestamp=now_ms(), ttl=5000)
        assert (await agent.recv())["payload"] == {"x": 2}
        await agent.close()
        await ui.close()

    run(scenario())


def test_broadcast_reaches_every_registered_actor_and_counts_them(hub):
    async def scenario():
        actors = [await _registered(hub.ws_urls[i % 2], f"bcast/member-{i}") for i in range(4)]
        speaker = await _registered(hub.ws_urls[0], "bcast/speaker")
        listing = await speaker.request("hub:list_actors", {"limit": 1000})
        registered = listing["payload"]["totalMatches"]  # other tests may hold registrations too

        sent = speaker.envelope("hub:broadcast", {"type": "system_announcement", "message": "Maintenance"},
                                correlationId="b1")
        await speaker.send_raw(json.dumps(sent))
        first = [json.loads(await speaker.recv_raw()) for _ in range(2)]  # own copy and the ack, any order
        ack = next(m for m in first if m["type"] == "hub:broadcast_ack")
        assert next(m for m in first if m["type"] == "hub:broadcast") == sent
        assert ack == {"type": "hub:broadcast_ack", "from": HUB, "to": "bcast/speaker",
                       "payload": {"recipientCount": registered, "successCount": registered, "failureCount": 0},
                       "correlationId": "b1"}
        for actor in actors:
            assert await actor.recv() == sent

        # excludeSelf: everyone but the sender's connection.
        quiet = await speaker.request("hub:broadcast", {"type": "again", "excludeSelf": True})
        assert quiet["payload"] == {"recipientCount": registered - 1, "successCount": registered - 1,
                                    "failureCount": 0}
        for actor in actors:
            assert (await actor.recv())["payload"]["type"] == "again"
        # Marker: a later broadcast from someone else is the next thing the speaker sees.
        await actors[1].request("hub:broadcast", {"type": "marker", "excludeSelf": True})
        assert (await speaker.recv())["payload"]["type"] == "marker"
        for client in actors + [speaker]:
            await client.close()

    run(scenario())


def test_messages_written_just_before_the_close_frame_are_still_routed(open_hub):
    from urllib.parse import urlparse

    from websockets.frames import Close, Opcode

    from tests.e2e.rawws import client_frame, open_raw_websocket

    port = urlparse(open_hub.ws_urls[0]).port

    async def scenario():
        sink = await HubClient.open(open_hub.ws_urls[0], "seag/last-words")
        await sink.request("hub:register", {"actorAddress": "seag/last-words"})
        reader, writer = await open_raw_websocket(port, "/ws")
        hello = {"type": "hub:connect", "from": "browser/leaving", "to": HUB, "payload": {"version": "1.0"}}
        writer.write(client_frame(Opcode.TEXT, json.dumps(hello).encode()))
        await reader.readexactly(2)  # the start of hub:connected; the rest is not needed
        burst = b"".join(
            client_frame(Opcode.TEXT, json.dumps({"type": "hub:send", "from": "browser/leaving",
                                                  "to": "seag/last-words", "payload": {"n": n}}).encode())
            for n in range(10)
        )
        writer.write(burst + client_frame(Opcode.CLOSE, Close(1000, "bye").serialize()))  # one write
        assert [(await sink.recv())["payload"]["n"] for _ in range(10)] == list(range(10))
        writer.close()
        await sink.close()

    run(scenario())
