"""``Connection``: a session that ``takes_binaries`` gets the consecutive binary messages of one
read in one ``on_binaries`` call (a text message between them splits the row, and goes in its
place); any other session each message through ``on_message``, as before. A frame cut off by the
end of the read waits for the next, after the row before it was handed over; after a message (or
a row) that closed the connection nothing more of the read is handed over, in either mode."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from websockets.protocol import State
from websockets.server import ServerProtocol
from websockets.utils import apply_mask

from gateways.dialect import DialectSession
from gateways.server import Connection
from tests.unit.test_server_flushes import Transport


class Gateway:
    def cork(self, connection: Connection) -> None:
        pass


class Session:
    """Keeps what it is handed: ("row", [payloads]) or ("one", payload, is_text)."""

    takes_binaries = False

    def __init__(self, connection: Connection, close_on: bytes | None = None) -> None:
        self.connection, self.close_on = connection, close_on
        self.got: list[tuple] = []

    def on_message(self, data: bytes, is_text: bool) -> None:
        self.got.append(("one", data, is_text))
        if data == self.close_on:
            self.connection.close(1000, "bye")

    def on_binaries(self, payloads: list[bytes]) -> None:
        self.got.append(("row", list(payloads)))
        if self.close_on in payloads:
            self.connection.close(1000, "bye")


class RowSession(Session):
    takes_binaries = True


HANDSHAKE = (b"GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
             b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")


def connection_with(session_class: type, close_on: bytes | None = None) -> tuple[Connection, Session]:
    """An open connection whose ``websockets`` protocol went through a real handshake (so that
    what the fast path leaves to it is parsed as frames, as in the server)."""
    connection = Connection(Gateway(), None)  # type: ignore[arg-type]
    protocol = ServerProtocol(max_size=2**20)
    protocol.receive_data(HANDSHAKE)
    (request,) = protocol.events_received()
    protocol.send_response(protocol.accept(request))
    protocol.data_to_send()
    assert protocol.state is State.OPEN
    connection.ws = protocol
    connection.transport = Transport()  # type: ignore[assignment]
    connection.session = session = session_class(connection, close_on)
    return connection, session


def frame(payload: bytes, text: bool = False) -> bytes:
    """A client's frame: FIN, masked."""
    mask = os.urandom(4)
    length = len(payload)
    head = bytes((0x81 if text else 0x82,))
    head += bytes((0x80 | length,)) if length < 126 else bytes((0x80 | 126,)) + length.to_bytes(2, "big")
    return head + mask + apply_mask(payload, mask)


def test_a_reads_binary_messages_go_as_rows_split_by_a_text_one_in_its_place():
    connection, session = connection_with(RowSession)
    big = b"x" * 300  # a 16-bit length
    d = frame(b"d")
    connection.data_received(frame(b"a") + frame(big) + frame(b"t", text=True) + frame(b"c") + d[:3])
    assert session.got == [("row", [b"a", big]), ("one", b"t", True), ("row", [b"c"])]
    connection.data_received(d[3:] + frame(b"e"))  # the cut frame, whole, and the next: one row
    assert session.got[3:] == [("row", [b"d", b"e"])]
    connection.data_received(frame(b"", text=True) + frame(b""))
    assert session.got[4:] == [("one", b"", True), ("row", [b""])]


def test_a_session_that_does_not_take_rows_gets_each_message_as_before():
    connection, session = connection_with(Session)
    connection.data_received(frame(b"a") + frame(b"b") + frame(b"t", text=True) + frame(b"c"))
    assert session.got == [("one", b"a", False), ("one", b"b", False), ("one", b"t", True), ("one", b"c", False)]
    assert DialectSession.takes_binaries is False


@pytest.mark.parametrize("session_class, handed", [
    (Session, [("one", b"a", False), ("one", b"b", False)]),
    (RowSession, [("row", [b"a", b"b"])]),
])
def test_after_what_closed_the_connection_nothing_more_of_the_read_is_handed_over(session_class, handed):
    """Before, the fast path stopped at the close and ``websockets`` handed the rest of the read,
    and every later read, to the session: a NoLag session closed with 1011 went on publishing."""
    connection, session = connection_with(session_class, close_on=b"b")
    connection.data_received(frame(b"a") + frame(b"b") + frame(b"t", text=True) + frame(b"c") + frame(b"c" * 300))
    assert connection.ws.state is State.CLOSING and session.got == handed
    connection.data_received(frame(b"d") + frame(b"e", text=True))
    assert session.got == handed


def test_a_client_that_closes_after_a_message_in_the_same_read_has_the_message_handed_over():
    connection, session = connection_with(RowSession)
    close = bytes((0x88, 0x82)) + b"\x00\x00\x00\x00" + (1000).to_bytes(2, "big")  # masked with zeros
    connection.data_received(bytes((0x82, 0x81)) + b"\x00\x00\x00\x00" + b"a" + close)
    assert session.got == [("row", [b"a"])]  # the client's close, after it, is websockets' to answer
    assert connection.ws.state is State.CLOSING and connection.closing_since is None


def test_a_row_cut_short_by_the_reads_end_is_handed_over_before_the_cut_frame_is_kept():
    connection, session = connection_with(RowSession)
    e = frame(b"e" * 200)
    connection.data_received(frame(b"a") + e[:5])
    assert session.got == [("row", [b"a"])] and connection._partial == e[:5]
    connection.data_received(e[5:])
    assert session.got[1:] == [("row", [b"e" * 200])] and connection._partial == b""


def test_receiving_is_open_and_not_failed():
    connection, _ = connection_with(RowSession)
    assert connection.receiving()
    connection._failed = True
    assert not connection.receiving()
    connection._failed = False
    connection.ws.state = State.CLOSING
    assert not connection.receiving()


class DefaultRowSession(DialectSession):
    """A session that takes rows with ``DialectSession.on_binaries`` as it is (no dialect
    overrides it but NoLag): each message of the row through ``on_message``."""

    takes_binaries = True

    def __init__(self, connection: Connection, close_on: bytes | None = None) -> None:
        super().__init__(SimpleNamespace(config=None, gateway=None, shards=None), connection)  # type: ignore[arg-type]
        self.close_on = close_on
        self.got: list[tuple] = []

    def on_message(self, data: bytes, is_text: bool) -> None:
        self.got.append(("one", data, is_text))
        if data == self.close_on:
            self.wire.close(1000, "bye")


def test_the_default_row_is_each_message_through_on_message_until_one_closes_the_connection():
    connection, session = connection_with(DefaultRowSession, close_on=b"c")
    connection.data_received(frame(b"a") + frame(b"b" * 300) + frame(b"t", text=True) + frame(b"x"))
    assert session.got == [("one", b"a", False), ("one", b"b" * 300, False), ("one", b"t", True),
                           ("one", b"x", False)]
    connection.data_received(frame(b"c") + frame(b"d") + frame(b"e"))
    assert session.got[4:] == [("one", b"c", False)] and connection.ws.state is State.CLOSING
