"""The QoS 1 receivers of ``router bench`` (``_Acker``): each message's id acknowledged in
``batchAck`` frames, and a message counted once, a redelivery (the same frame again, so the same
timestamp) as a duplicate, whether a chunk of frames is read at once or frame by frame."""

from __future__ import annotations

import asyncio
import uuid

import msgpack

from gateways.nolag.codec import message_packed
from gateways.server import frame_header
from router.bench.dialects.nolag import _Acker


class Client:
    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.closed = asyncio.get_running_loop().create_future()

    def send(self, frame: bytes) -> None:
        self.sent.append(frame)


class Counts:
    duplicates = 0
    acks = 0


def message(stamp: int) -> tuple[str, bytes]:
    msg_id = str(uuid.UUID(int=stamp))
    return msg_id, message_packed("app/room/t", msgpack.packb("x" * 20), msg_id, True, timestamp=stamp)


def chunk(payloads: list[bytes]) -> bytearray:
    return bytearray(b"".join(frame_header(0x2, len(p)) + p for p in payloads))


def acked_ids(client: Client) -> list[str]:
    return [msg_id for frame in client.sent for msg_id in msgpack.unpackb(frame)["msgIds"]]


def test_new_messages_are_counted_once_and_every_one_is_acked_redeliveries_included():
    async def main() -> None:
        client, counts = Client(), Counts()
        acker = _Acker(client, counts, 3)  # a batchAck every 3 messages
        T = 1_700_000_000_000
        (a, fa), (b, fb), (c, fc), (d, fd) = (message(T + n) for n in range(4))
        data = chunk([fa, fb])
        assert acker.chunk(data, len(data), 2) == 2
        data = chunk([fc, fa, fd, fb])  # a and b again: late acks, written again
        assert acker.chunk(data, len(data), 4) == 2
        assert counts.duplicates == 2
        assert acker(fc) == 0 and counts.duplicates == 3  # frame by frame, the same
        _, fe = message(T + 10)
        assert acker(fe) == 1
        acker.flush()
        assert acked_ids(client) == [a, b, c, a, d, b, c, str(uuid.UUID(int=T + 10))]
        assert counts.acks == len(client.sent) == 3

    asyncio.run(main())


def test_a_chunk_not_every_frame_of_which_has_one_id_and_one_stamp_goes_frame_by_frame():
    async def main() -> None:
        acker = _Acker(Client(), Counts(), 100)
        _, fa = message(1_700_000_000_000)
        data = chunk([fa, msgpack.packb({"type": "published"})])
        assert acker.chunk(data, len(data), 2) is None
        assert acker(fa) == 1 and acker(msgpack.packb({"type": "published"})) == 0
        acker.flush()

    asyncio.run(main())
