"""The shared port: HTTP with bodies beside the WebSocket endpoints."""

from __future__ import annotations

import json
from urllib.parse import urlparse

from tests.e2e.client import HubClient, run
from tests.e2e.rawws import http_request


def _port(url: str) -> int:
    return urlparse(url).port


def _parse(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    return status, headers, body


def test_health_on_every_gateway_and_on_a_dialects_own_port(hub, open_hub):
    async def scenario():
        for url, expected_path in [(hub.http_urls[0], "/signal"), (hub.http_urls[1], "/signal"),
                                   (open_hub.http_urls[0], "/ws")]:
            raw = await http_request(_port(url), b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            status, headers, body = _parse(raw)
            assert status == 200 and headers["content-type"] == "application/json"
            assert int(headers["content-length"]) == len(body)
            health = json.loads(body)
            assert health["status"] == "ok" and health["endpoints"] == {
                "signal": expected_path, "cashu": "/v1/ws", "mx": "/hub/ws", "mx-node": "/save",
                "nolag": "/ws", "baqend": "/v1/events"}
            assert isinstance(health["connections"], int) and health["gateway"]

    run(scenario())


def test_http_errors_and_keep_alive(hub):
    port = _port(hub.http_urls[0])

    async def scenario():
        cases = [
            (b"GET /nowhere HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 404, "not_found"),
            (b"POST /health HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}", 405,
             "method_not_allowed"),
            (b"GET /signal HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 426, "upgrade_required"),
            (b"GET /elsewhere HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
             b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n", 404, "not_found"),
            (b"BLAH\r\n\r\n", 400, "bad_request"),
            (b"POST /health HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999\r\n\r\n", 413, "too_large"),
        ]
        for raw, status, error in cases:
            got_status, _, body = _parse(await http_request(port, raw))
            assert (got_status, json.loads(body)["error"]) == (status, error), raw
        # Two requests on one keep-alive connection, answered in order.
        raw = await http_request(port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
                                       b"GET /nowhere HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert raw.count(b"HTTP/1.1 200 OK") == 1 and raw.count(b"HTTP/1.1 404 Not Found") == 1
        assert raw.index(b"200 OK") < raw.index(b"404 Not Found")

    run(scenario())


def test_bad_websocket_handshake_is_refused(hub):
    port = _port(hub.http_urls[0])

    async def scenario():
        raw = await http_request(port, b"GET /signal HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                                       b"Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n\r\n")
        assert raw.startswith(b"HTTP/1.1 400 ")
        assert b"Sec-WebSocket-Key" in raw
        # The endpoint still serves real clients.
        client = await HubClient.open(hub.ws_urls[0], "browser/after", hello=False)
        await client.close()

    run(scenario())
