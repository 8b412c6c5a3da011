"""Spec 3.7 (flow control), section 4 (error codes) and section 6 (limits), checked before parsing."""

from __future__ import annotations

import json
from urllib.parse import urlparse

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.frames import Frame, Opcode

from tests.e2e.client import HUB, HubClient, eventually, run
from tests.e2e.rawws import client_frame, open_raw_websocket, read_close_code, read_server_frame


def test_queue_stats_reports_the_connections_counters(open_hub):
    async def scenario():
        client = await HubClient.open(open_hub.ws_urls[0], "browser/stats")
        await client.request("hub:heartbeat", {})
        await client.send_raw("{not json")
        assert (await client.recv())["payload"]["code"] == "internal_error"
        reply = await client.request("hub:queue_stats", {}, correlationId="q")
        assert reply == {"type": "hub:queue_stats_result", "from": HUB, "to": "browser/stats",
                         "payload": {"pending": 0, "processed": 4, "failed": 1, "paused": False},
                         "correlationId": "q"}
        await client.close()

    run(scenario())


def test_rate_limit_is_a_token_bucket_with_retry_after(open_hub):
    signal = open_hub.settings.signal

    async def scenario():
        client = await HubClient.open(open_hub.ws_urls[0], "browser/flood")
        for _ in range(signal.rate_limit_burst + 5):
            await client.send("hub:heartbeat", {})
        replies = [await client.recv() for _ in range(signal.rate_limit_burst + 5)]
        acks = [r for r in replies if r["type"] == "hub:heartbeat_ack"]
        limited = [r for r in replies if r["type"] == "hub:error"]
        # The connect took one token; the bucket refills one per second meanwhile.
        assert signal.rate_limit_burst - 1 <= len(acks) <= signal.rate_limit_burst + 1
        assert len(acks) + len(limited) == len(replies)
        for reply in limited:
            payload = reply["payload"]
            assert payload["code"] == "rate_limited"
            assert payload["message"] == "Rate limit of 60 messages per minute exceeded"
            assert set(payload["details"]) == {"retryAfter", "limit", "window"}
            assert payload["details"]["limit"] == 60 and payload["details"]["window"] == "1m"
            assert 1 <= payload["details"]["retryAfter"] <= 1000

        async def accepted_again():
            await client.send("hub:heartbeat", {})
            return (await client.recv())["type"] == "hub:heartbeat_ack"

        await eventually(accepted_again, timeout=5, interval=0.25)
        await client.close()

    run(scenario())


def test_message_too_large_is_refused_before_parsing(open_hub):
    async def scenario():
        client = await HubClient.open(open_hub.ws_urls[0], "browser/big")
        await client.send_raw("x" * 5000)  # not even JSON: the size is checked first
        reply = await client.recv()
        assert reply == {"type": "hub:error", "from": HUB, "to": "browser/big",
                         "payload": {"code": "message_too_large",
                                     "message": "Message of 5000 bytes exceeds the limit of 4096 bytes",
                                     "details": {"size": 5000, "maxSize": 4096}}}
        assert (await client.request("hub:heartbeat", {}))["type"] == "hub:heartbeat_ack"
        await client.close()

    run(scenario())


def test_a_frame_over_the_frame_limit_closes_with_1009(open_hub):
    async def scenario():
        client = await HubClient.open(open_hub.ws_urls[0], "browser/huge")
        await client.send_raw("y" * 9000)
        try:
            await client.recv()
            raise AssertionError("expected a close")
        except ConnectionClosed:
            pass
        assert client.ws.close_code == 1009
        await client.close()

    run(scenario())


def test_invalid_utf8_in_a_text_frame_closes_with_1007(open_hub):
    port = urlparse(open_hub.ws_urls[0]).port

    async def scenario():
        reader, writer = await open_raw_websocket(port, "/ws")
        writer.write(client_frame(Opcode.TEXT, b'{"type":"\xff"}'))
        assert await read_close_code(reader) == 1007
        writer.close()

    run(scenario())


def test_malformed_and_unknown_messages_get_errors_and_the_connection_stays(open_hub):
    async def scenario():
        client = await HubClient.open(open_hub.ws_urls[0], "browser/messy")
        await client.send_raw("{broken")
        reply = await client.recv()
        assert reply["type"] == "hub:error" and reply["to"] == "browser/messy" and "correlationId" not in reply
        assert reply["payload"]["code"] == "internal_error"
        assert reply["payload"]["message"].startswith("Malformed JSON: ")
        assert reply["payload"]["details"] == {"reason": "parse_error"}

        await client.send_raw("[1, 2]")
        assert (await client.recv())["payload"] == {"code": "internal_error",
                                                    "message": "A message must be a JSON object",
                                                    "details": {"reason": "invalid_message"}}

        unknown = await client.request("hub:teleport", {}, correlationId="t")
        assert unknown == {"type": "hub:error", "from": HUB, "to": "browser/messy",
                           "payload": {"code": "internal_error", "message": "Unknown message type: hub:teleport",
                                       "details": {"reason": "unknown_type", "type": "hub:teleport"}},
                           "correlationId": "t"}

        # A binary frame carrying the same JSON is accepted.
        await client.send_raw(json.dumps(client.envelope("hub:heartbeat", {}, correlationId="bin")).encode())
        reply = await client.recv()
        assert reply["type"] == "hub:heartbeat_ack" and reply["correlationId"] == "bin"
        await client.close()

    run(scenario())


@pytest.mark.security
def test_a_message_nested_too_deep_is_refused_alone(open_hub):
    """Before: the value reached the shard client, pickling it failed, and the whole batch failed
    with it (every other client's command in that batch too)."""
    async def scenario():
        attacker = await HubClient.open(open_hub.ws_urls[0], "browser/deep")
        honest = await HubClient.open(open_hub.ws_urls[0], "browser/plain")
        deep = "[" * 600 + "]" * 600
        raw = ('{"type": "hub:register", "from": "browser/deep", "correlationId": "d", '
               '"payload": {"actorAddress": "browser/deep", "metadata": {"x": ' + deep + '}}}')
        await attacker.send_raw(raw)
        await honest.send("hub:register", {"actorAddress": "browser/plain", "metadata": {"ok": True}},
                          correlationId="p")
        assert await attacker.recv() == {
            "type": "hub:error", "from": HUB, "to": "browser/deep", "correlationId": "d",
            "payload": {"code": "internal_error", "message": "A message may nest at most 32 levels",
                        "details": {"reason": "too_deep"}}}
        reply = await honest.recv()
        assert (reply["type"], reply["correlationId"], reply["payload"]["actorAddress"]) == (
            "hub:registered", "p", "browser/plain")
        await attacker.close()
        await honest.close()

    run(scenario())


def _hub_frame(kind: str, sender: str, **extra) -> bytes:
    return json.dumps({"type": kind, "from": sender, "to": HUB, "payload": {}, **extra}).encode()


def test_frames_of_every_shape_in_one_read_are_answered_in_order(open_hub):
    """Simple frames are unmasked by the gateway itself; a ping, a fragmented message and a
    127-length frame go to the websockets parser; a frame cut by the end of a read (in its
    payload, in its 2-byte length, after its first byte) waits for its end. Mixed in one stream,
    every message is answered once and in order, and the pong comes where the ping was."""
    port = urlparse(open_hub.ws_urls[0]).port
    sender = "browser/shapes"

    def beat(tag: str, pad: int = 0) -> bytes:
        extra = {"pad": "p" * pad} if pad else {}
        return client_frame(Opcode.TEXT, _hub_frame("hub:heartbeat", sender, correlationId=tag, **extra))

    async def replies(reader, count: int) -> list:
        out = []
        for _ in range(count):
            opcode, body = await read_server_frame(reader)
            out.append((opcode, body if opcode == Opcode.PONG else json.loads(body).get("correlationId")))
        return out

    async def scenario():
        reader, writer = await open_raw_websocket(port, "/ws")
        writer.write(client_frame(Opcode.TEXT, _hub_frame("hub:connect", sender, payload={"version": "1.0"})))
        opcode, body = await read_server_frame(reader)
        assert json.loads(body)["type"] == "hub:connected"
        fragmented = _hub_frame("hub:heartbeat", sender, correlationId="c-fragments")
        long_form = Frame(Opcode.TEXT, _hub_frame("hub:heartbeat", sender, correlationId="g-127"))
        long_form = bytes([0x81, 0x80 | 127]) + len(long_form.data).to_bytes(8, "big") + b"\0\0\0\0" + long_form.data
        writer.write(beat("a-1") + client_frame(Opcode.BINARY, _hub_frame("hub:heartbeat", sender, correlationId="b-126",
                                                                           pad="p" * 200))
                     + client_frame(Opcode.PING, b"now") + client_frame(Opcode.TEXT, fragmented[:10], fin=False)
                     + client_frame(Opcode.CONT, fragmented[10:]) + beat("d-after") + long_form)
        assert await replies(reader, 6) == [(Opcode.TEXT, "a-1"), (Opcode.TEXT, "b-126"), (Opcode.PONG, b"now"),
                                            (Opcode.TEXT, "c-fragments"), (Opcode.TEXT, "d-after"),
                                            (Opcode.TEXT, "g-127")]
        # Cut frames: each piece after the reply to the frame written with the previous one, so the
        # gateway has read up to the cut before the rest arrives.
        in_payload, in_length, after_first = beat("e-payload"), beat("f-length", pad=200), beat("h-first")
        writer.write(beat("1") + in_payload[:7])
        assert await replies(reader, 1) == [(Opcode.TEXT, "1")]
        writer.write(in_payload[7:] + beat("2") + in_length[:3])
        assert await replies(reader, 2) == [(Opcode.TEXT, "e-payload"), (Opcode.TEXT, "2")]
        writer.write(in_length[3:] + beat("3") + after_first[:1])
        assert await replies(reader, 2) == [(Opcode.TEXT, "f-length"), (Opcode.TEXT, "3")]
        writer.write(after_first[1:] + beat("4"))
        assert await replies(reader, 2) == [(Opcode.TEXT, "h-first"), (Opcode.TEXT, "4")]
        writer.close()

    run(scenario())


def test_an_unmasked_client_frame_closes_with_1002(open_hub):
    port = urlparse(open_hub.ws_urls[0]).port

    async def scenario():
        reader, writer = await open_raw_websocket(port, "/ws")
        body = _hub_frame("hub:heartbeat", "browser/unmasked")
        writer.write(bytes([0x81, len(body)]) + body)
        assert await read_close_code(reader) == 1002
        writer.close()

    run(scenario())
