"""``Connection.flushes``: a NoLag session decides on a heartbeat by whether its connection wrote
since the last tick (a fan-out writes without the session). Each write of data frames counts:
the corked ones once per write, a compressed connection's at each frame; a refused frame and an
empty flush do not."""

from __future__ import annotations

from websockets.protocol import State
from websockets.server import ServerProtocol

from gateways.server import Connection, frame_header, joined_frames


class Transport:
    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(bytes(data))

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0

    def close(self) -> None:
        pass


class Gateway:
    def __init__(self) -> None:
        self.corked: list[Connection] = []

    def cork(self, connection: Connection) -> None:
        self.corked.append(connection)


def open_connection(compressed: bool) -> Connection:
    connection = Connection(Gateway(), None)  # type: ignore[arg-type]
    connection.ws = ServerProtocol()
    connection.ws.state = State.OPEN
    connection.transport = Transport()  # type: ignore[assignment]
    connection.compressed = compressed
    return connection


FRAME = frame_header(0x2, 3) + b"abc"


def test_corked_frames_count_once_per_write():
    connection = open_connection(compressed=False)
    assert connection.send_frame(FRAME, 0x2, b"abc") and connection.send_frame(FRAME, 0x2, b"abc")
    assert connection.flushes == 0 and connection.transport.written == []
    connection.flush()
    assert connection.flushes == 1 and connection.transport.written == [FRAME + FRAME]
    connection.flush()  # nothing corked: nothing written, nothing counted
    assert connection.flushes == 1


def test_a_compressed_connection_counts_each_frame_it_writes():
    connection = open_connection(compressed=True)
    assert connection.send_frame(FRAME, 0x2, b"abc")
    assert connection.flushes == 1 and connection.transport.written == [FRAME]  # no extension agreed here


def test_a_refused_frame_counts_nothing():
    connection = open_connection(compressed=False)
    connection.ws.state = State.CLOSING
    assert connection.send_frame(FRAME, 0x2, b"abc") is False
    connection.flush()
    assert connection.flushes == 0 and connection.transport.written == []


def test_joined_frames_are_corked_as_one_piece_only_where_each_frame_would_be_taken_as_it_is():
    """``takes_frames``: open, not compressed, writing not paused (a paused connection takes a
    frame only while under its outbound limit, so a run is given frame by frame)."""
    connection = open_connection(compressed=False)
    assert connection.takes_frames()
    connection.cork_frames(FRAME + FRAME)
    connection.send_frame(FRAME, 0x2, b"abc")
    assert connection.gateway.corked == [connection] and connection.outbound_bytes() == 3 * len(FRAME)
    connection.flush()
    assert connection.flushes == 1 and connection.transport.written == [FRAME * 3]
    connection._paused = True
    assert not connection.takes_frames()
    connection._paused = False
    connection.ws.state = State.CLOSING
    assert not connection.takes_frames()
    assert not open_connection(compressed=True).takes_frames()


def test_joined_frames_give_each_payload_its_own_header_across_the_length_encodings():
    """Payloads of one size in a row share a header; a change of size (within one length encoding
    or across the 7-bit, 16-bit and 64-bit ones) gets its own."""
    sizes = [0, 0, 125, 125, 126, 126, 125, 65535, 65535, 65536, 65536, 126, 3]
    payloads = [bytes([n % 251]) * size for n, size in enumerate(sizes)]
    assert joined_frames(0x2, payloads) == b"".join(frame_header(0x2, len(p)) + p for p in payloads)
    assert joined_frames(0x1, payloads[:3]) == b"\x81\x00\x81\x00\x81\x7d" + payloads[2]
    assert joined_frames(0x2, []) == b""
