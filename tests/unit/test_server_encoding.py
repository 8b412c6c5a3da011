"""gateways/server.py: WebSocket frame headers and HTTP/1.1 response bytes."""

from __future__ import annotations

import pytest
from websockets.frames import Frame, Opcode

from gateways.dialect import HttpResponse
from gateways.server import encode_http_response, frame_header, json_response


@pytest.mark.parametrize("length", [0, 1, 125, 126, 127, 65535, 65536, 70_000])
@pytest.mark.parametrize("opcode", [Opcode.TEXT, Opcode.BINARY])
def test_frame_header_matches_websockets(opcode, length):
    payload = b"x" * length
    frame = Frame(opcode, payload).serialize(mask=False, extensions=[])
    header = frame_header(opcode, length)
    assert header + payload == frame
    assert frame[: len(frame) - length] == header


@pytest.mark.parametrize(
    ("length", "expected"),
    [
        (0, b"\x81\x00"),
        (125, b"\x81\x7d"),
        (126, b"\x81\x7e\x00\x7e"),
        (65535, b"\x81\x7e\xff\xff"),
        (65536, b"\x81\x7f\x00\x00\x00\x00\x00\x01\x00\x00"),
    ],
)
def test_frame_header_exact_bytes(length, expected):
    assert frame_header(Opcode.TEXT, length) == expected
    assert frame_header(int(Opcode.BINARY), length) == bytes([0x82]) + expected[1:]


def test_ok_response_keep_alive():
    response = HttpResponse(200, b'{"ok":true}')
    assert encode_http_response(response, keep_alive=True) == (
        b"HTTP/1.1 200 OK\r\n"
        b"Content-Type: application/json\r\n"
        b"Content-Length: 11\r\n"
        b"Connection: keep-alive\r\n"
        b"\r\n"
        b'{"ok":true}'
    )


def test_response_with_headers_and_close():
    response = HttpResponse(429, b"slow down", "text/plain", [("Retry-After", "2"), ("X-Trace", "abc")])
    assert encode_http_response(response, keep_alive=False) == (
        b"HTTP/1.1 429 Too Many Requests\r\n"
        b"Content-Type: text/plain\r\n"
        b"Content-Length: 9\r\n"
        b"Retry-After: 2\r\n"
        b"X-Trace: abc\r\n"
        b"Connection: close\r\n"
        b"\r\n"
        b"slow down"
    )


def test_204_has_no_body_or_content_headers():
    response = HttpResponse(204, b"ignored", headers=[("X-Id", "1")])
    assert encode_http_response(response, keep_alive=True) == (
        b"HTTP/1.1 204 No Content\r\nX-Id: 1\r\nConnection: keep-alive\r\n\r\n"
    )


def test_empty_body():
    assert encode_http_response(HttpResponse(404), keep_alive=False) == (
        b"HTTP/1.1 404 Not Found\r\n"
        b"Content-Type: application/json\r\n"
        b"Content-Length: 0\r\n"
        b"Connection: close\r\n"
        b"\r\n"
    )


def test_content_length_counts_bytes_not_characters():
    body = "é€".encode("utf-8")
    encoded = encode_http_response(HttpResponse(200, body, "text/plain; charset=utf-8"), keep_alive=True)
    assert b"\r\nContent-Length: 5\r\n" in encoded
    assert encoded.endswith(b"\r\n\r\n" + body)


@pytest.mark.parametrize(
    ("status", "line"),
    [
        (201, b"HTTP/1.1 201 Created\r\n"),
        (400, b"HTTP/1.1 400 Bad Request\r\n"),
        (401, b"HTTP/1.1 401 Unauthorized\r\n"),
        (405, b"HTTP/1.1 405 Method Not Allowed\r\n"),
        (413, b"HTTP/1.1 413 Content Too Large\r\n"),
        (426, b"HTTP/1.1 426 Upgrade Required\r\n"),
        (503, b"HTTP/1.1 503 Service Unavailable\r\n"),
        (418, b"HTTP/1.1 418 Unknown\r\n"),
    ],
)
def test_status_lines(status, line):
    assert encode_http_response(HttpResponse(status, b"{}"), keep_alive=True).startswith(line)


def test_json_response():
    assert json_response(404, b'{"error":"not found"}') == HttpResponse(404, b'{"error":"not found"}', "application/json")
