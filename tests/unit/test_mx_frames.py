"""A hub consumer's frames for one block, built in one pass (``wire_frames``) or one by one for a
compressed connection (``payload_frames``): byte for byte the PAYLOAD frames protobuf would encode,
each behind its WebSocket header, with the consumer's counters, and no more than the room allows."""

import pytest

from gateways.mx import codec
from gateways.mx.session import payload_frames, wire_frames
from gateways.server import frame_header

TOPIC = codec.EVENTS_TOPIC


def payload_of(length: int) -> bytes:
    return bytes(range(256)) * (length // 256) + bytes(range(length % 256))


def tail_of(length: int) -> bytes:
    return codec.frame_tail(TOPIC, payload_of(length))


def reference(counter: int, lengths: list[int]) -> list[bytes]:
    """What protobuf encodes for each frame (``payload_frame``), counters ``counter + 1``…"""
    return [codec.payload_frame(counter + 1 + i, TOPIC, payload_of(length)) for i, length in enumerate(lengths)]


# Counters around each varint length (1, 2, 3 and 4 bytes) and payloads around each WebSocket
# length form (7 bits, 16 bits, 64 bits), the 16-bit one being the common case.
COUNTERS = [0, 0x7E, 0x3FFE, 0x3FFF, 0x1FFFFE, 0x1FFFFF, 10_000_000]
LENGTHS = [10, 100, 110, 115, 120, 200, 65_400, 65_520, 65_530, 70_000]


@pytest.mark.parametrize("counter", COUNTERS)
def test_wire_frames_are_the_payload_frames_behind_their_websocket_headers(counter):
    tails = [tail_of(length) for length in LENGTHS]
    expected = reference(counter, LENGTHS)

    data, count, size = wire_frames(counter, tuple(tails), 1 << 40)

    assert data == b"".join(frame_header(0x2, len(frame)) + frame for frame in expected)
    assert (count, size) == (len(tails), sum(len(frame) for frame in expected))
    frames, payload_size = payload_frames(counter, tuple(tails), 1 << 40)
    assert frames == expected
    assert payload_size == size


def test_every_frame_length_at_the_edges_of_the_websocket_length_forms():
    """Tails whose frames, with a head of 4, 5 or 6 bytes, are 125/126 and 65,535/65,536 bytes long."""
    wanted = set(range(118, 124)) | set(range(65_528, 65_534))
    lengths = [length for length in range(60, 70_000) if len(tail_of(length)) in wanted]
    assert {len(tail_of(length)) for length in lengths} == wanted
    tails = tuple(tail_of(length) for length in lengths)
    for counter in (0x7F - 2, 0x80 - 1, 0x3FFF - 3, 0x4000 - 1, 0x1FFFFF - 5):
        expected = reference(counter, lengths)
        data, count, size = wire_frames(counter, tails, 1 << 40)
        assert data == b"".join(frame_header(0x2, len(frame)) + frame for frame in expected), counter
        assert (count, size) == (len(tails), sum(len(frame) for frame in expected))


def test_frames_stop_once_the_wire_bytes_reach_the_room():
    tails = tuple(tail_of(200) for _ in range(10))
    frame = reference(0x3FFF, [200])[0]
    on_wire = len(frame) + 4  # a 16-bit length: a 4-byte WebSocket header

    # A frame goes while the bytes before it are under the room: 3 full frames and one byte
    # make room for 4; exactly 3 frames' bytes, for 3.
    for room, expected in [(3 * on_wire + 1, 4), (3 * on_wire, 3), (1, 1), (0, 0), (-5, 0)]:
        data, count, size = wire_frames(0x3FFF, tails, room)
        assert count == expected
        assert len(data) == expected * on_wire
        assert size == expected * len(frame)
        frames, payload_size = payload_frames(0x3FFF, tails, room)
        assert len(frames) == expected and payload_size == size


def test_no_tails_no_frames():
    assert wire_frames(5, (), 1000) == (b"", 0, 0)
    assert payload_frames(5, (), 1000) == ([], 0)
