"""Lanes (router/lane.py): framing, the challenge and hello, TLS on TCP lanes, replies in order,
pushes, a broken or hostile peer; and the shard client's move from Ray calls to a lane
(gateways/shardclient.py). Real sockets throughout."""

from __future__ import annotations

import asyncio
import concurrent.futures
import secrets
import socket
import ssl
import struct
import threading
import time
import types

import pytest

from router import contract, lane
from router.errors import CommandError


def test_frames_split_across_reads_and_joined_in_one():
    reader = lane.FrameReader()
    data = lane.encode(["a", 1]) + lane.encode((2, b"x" * 300)) + lane.encode({"k": None})
    frames = []
    for index in range(0, len(data), 7):  # byte dribble
        frames += reader.feed(data[index:index + 7])
    assert [lane.pickle.loads(body) for body in frames] == [["a", 1], (2, b"x" * 300), {"k": None}]
    assert reader.feed(data) and not reader.buffer


def test_a_frame_over_the_limit_is_refused_before_it_is_buffered():
    reader = lane.FrameReader()
    with pytest.raises(lane.LaneError, match="exceeds"):
        reader.feed(struct.pack("!I", lane.MAX_FRAME_BYTES + 1) + b"x")


def test_before_the_hello_frames_are_small_and_taken_one_at_a_time():
    reader = lane.FrameReader(lane.PREAUTH_FRAME_BYTES)
    with pytest.raises(lane.LaneError, match="exceeds"):
        reader.feed(struct.pack("!I", lane.PREAUTH_FRAME_BYTES + 1))
    reader = lane.FrameReader(lane.PREAUTH_FRAME_BYTES)
    big = lane.encode(b"x" * lane.PREAUTH_FRAME_BYTES * 2)
    assert reader.feed(lane.encode("a") + big, 1) == [lane.encode("a")[4:]]  # the big one waits
    reader.limit = lane.MAX_FRAME_BYTES  # authenticated
    assert reader.feed(b"") == [big[4:]]


class _Shard:
    """A stand-in for a shard's state: records the batches, answers each command in order."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, list]] = []
        self.threads: set[str] = set()
        self.server: lane.LaneServer | None = None

    def execute(self, gateway_id: str, commands: list) -> tuple:
        self.threads.add(threading.current_thread().name)
        self.seen.append((gateway_id, commands))
        results = []
        for command in commands:
            if command[0] == "fail":
                results.append(CommandError("nope", "refused", {"n": 1}))
            elif command[0] == "push":  # deliveries for another gateway
                results.append(self.server.push(command[1], ("shard", "e1", 0, [command[2]])))
            else:
                results.append(command)
        return results, ("shard", "e1", len(self.seen), [("for-caller", gateway_id)])


def _address(server: lane.LaneServer, kind: str) -> tuple:
    """What the shard's ``open_lane`` hands a gateway."""
    if kind == "unix":
        return ("unix", server.unix_address(), server.secret)
    host, port = server.tcp_address("127.0.0.1")
    return ("tcp", host, port, server.secret, server.certificate)


async def _client(address: tuple, gateway_id: str):
    loop = asyncio.get_running_loop()
    replies: asyncio.Queue = asyncio.Queue()
    pushes: asyncio.Queue = asyncio.Queue()
    lost = loop.create_future()

    def factory():
        return lane.LaneClient(lambda results, bundle: replies.put_nowait((results, bundle)), pushes.put_nowait,
                               lambda client, exc: lost.done() or lost.set_result(exc))

    client = await lane.connect(loop, address, gateway_id, factory)
    return client, replies, pushes, lost


@pytest.mark.parametrize("kind", ["unix", "tcp"])
def test_batches_are_answered_in_order_and_pushes_reach_the_other_gateway(kind):
    shard = _Shard()
    server = shard.server = lane.LaneServer("topic-shard-0", shard.execute)
    try:
        address = _address(server, kind)

        async def scenario():
            one, replies_one, pushes_one, lost_one = await _client(address, "gw-1")
            two, replies_two, pushes_two, lost_two = await _client(address, "gw-2")
            for n in range(50):
                one.call([("op", n), ("op", n + 1000)])
            two.call([("fail",), ("push", "gw-1", "hello")])
            answers = [await asyncio.wait_for(replies_one.get(), 5) for _ in range(50)]
            assert [results for results, _ in answers] == [[("op", n), ("op", n + 1000)] for n in range(50)]
            assert all(bundle[3] == [("for-caller", "gw-1")] for _, bundle in answers)
            results, bundle = await asyncio.wait_for(replies_two.get(), 5)
            assert isinstance(results[0], CommandError)
            assert (results[0].code, results[0].message, results[0].details) == ("nope", "refused", {"n": 1})
            assert results[1] is True
            assert await asyncio.wait_for(pushes_one.get(), 5) == ("shard", "e1", 0, ["hello"])
            assert pushes_two.empty()
            assert sorted(server.connected()) == ["gw-1", "gw-2"]
            one.close()
            two.close()
            await asyncio.wait_for(asyncio.gather(lost_one, lost_two), 5)  # TLS says goodbye first

        asyncio.run(scenario())
        assert shard.threads == {"lane-topic-shard-0"}  # every batch ran on the lane's thread
        assert server.push("gw-unknown", ("s", "e", 0, [])) is False
        assert server.refused == 0
    finally:
        server.close()


def test_a_push_right_behind_the_shards_proof_is_not_held_to_the_pre_auth_limit():
    """The shard may push to a gateway as soon as it has let it in: a large push can arrive in the
    same read as the proof."""
    shard = _Shard()
    server = shard.server = lane.LaneServer("topic-shard-8", shard.execute)
    address = _address(server, "unix")
    big = "y" * (lane.PREAUTH_FRAME_BYTES * 4)

    def attach_and_push(gateway_id: str, lane_: object, attach=server.attach) -> None:
        attach(gateway_id, lane_)
        server.push(gateway_id, ("shard", "e1", 0, [big]))  # right behind the proof, as a rule in one read

    server.attach = attach_and_push
    try:
        async def scenario():
            client, _, pushes, lost = await _client(address, "gw-1")
            assert await asyncio.wait_for(pushes.get(), 5) == ("shard", "e1", 0, [big])
            client.close()
            await asyncio.wait_for(lost, 5)

        asyncio.run(scenario())
    finally:
        server.close()


# -- peers that do not know the secret ---------------------------------------------------------

def _raw(server: lane.LaneServer, kind: str) -> socket.socket:
    """A plain socket to the server (no TLS, no handshake): what any local or network peer can open."""
    if kind == "unix":
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(server.unix_address())
        return sock
    return socket.create_connection(server.tcp_address("127.0.0.1"), timeout=5)


def _tls(server: lane.LaneServer) -> ssl.SSLSocket:
    """A TLS socket to the server's TCP lane that trusts its certificate, as a gateway does."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.load_verify_locations(cadata=_address(server, "tcp")[4])
    return context.wrap_socket(_raw(server, "tcp"))


def _transport(server: lane.LaneServer, kind: str) -> socket.socket:
    """A socket as far as a gateway's gets before the handshake: plain on Unix, TLS on TCP."""
    return _raw(server, kind) if kind == "unix" else _tls(server)


def _until_closed(sock: socket.socket, timeout: float = 5.0) -> bytes:
    """Everything the peer sends until it closes (raises if it is still open after ``timeout``)."""
    sock.settimeout(timeout)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    return data


def _challenge_only(data: bytes) -> bool:
    """The shard's first frame, a random nonce, and nothing after it."""
    return data[:4] == struct.pack("!I", lane.NONCE_BYTES) and len(data) == 4 + lane.NONCE_BYTES


@pytest.mark.parametrize("kind", ["unix", "tcp"])
def test_a_wrong_secret_is_refused_before_anything_is_sent_or_unpickled(kind):
    shard = _Shard()
    server = lane.LaneServer("registry-shard-1", shard.execute)
    try:
        address = list(_address(server, kind))
        address[3 if kind == "tcp" else 2] = b"\x00" * lane.SECRET_BYTES
        forged = tuple(address)

        async def scenario():
            with pytest.raises(lane.LaneError):
                await _client(forged, "intruder")

        asyncio.run(scenario())
        assert shard.seen == []
        assert server.refused == 1
        assert server.connected() == []
    finally:
        server.close()


def test_the_old_hello_with_the_right_secret_is_refused():
    """The secret itself never crosses the lane: a peer that sends it (as the first version's hello
    did, or after sniffing it) is refused."""
    shard = _Shard()
    server = lane.LaneServer("registry-shard-2", shard.execute)
    server.hello_timeout_s = 60  # the refusal is the hello's, not the deadline's
    try:
        with _raw(server, "unix") as sock:
            body = server.secret + b"gw-old"
            sock.sendall(struct.pack("!I", len(body)) + body)
            assert _challenge_only(_until_closed(sock))
        assert server.refused == 1
        assert server.connected() == [] and shard.seen == []
    finally:
        server.close()


@pytest.mark.parametrize("kind", ["unix", "tcp"])
def test_a_peer_that_says_nothing_is_closed_at_the_hello_deadline(kind):
    shard = _Shard()
    server = lane.LaneServer("session-shard-2", shard.execute)
    server.hello_timeout_s = 0.3
    try:
        opened = time.monotonic()
        with _transport(server, kind) as sock:
            assert _challenge_only(_until_closed(sock))
        assert time.monotonic() - opened >= 0.3
        assert server.refused == 1
        assert server.connected() == []
    finally:
        server.close()


def test_a_tcp_peer_that_never_starts_tls_is_closed_at_the_hello_deadline():
    server = lane.LaneServer("session-shard-4", _Shard().execute)
    server.hello_timeout_s = 0.3
    try:
        with _raw(server, "tcp") as sock:
            assert _until_closed(sock) == b""
    finally:
        server.close()


@pytest.mark.parametrize("kind", ["unix", "tcp"])
def test_a_large_frame_before_the_hello_is_refused_at_once(kind):
    """The header alone (1 MiB announced, far under the authenticated limit) closes the lane:
    nothing is buffered for a peer that has not proven it knows the secret."""
    shard = _Shard()
    server = lane.LaneServer("session-shard-3", shard.execute)
    server.hello_timeout_s = 60
    try:
        with _transport(server, kind) as sock:
            sock.sendall(struct.pack("!I", 1 << 20))
            assert _challenge_only(_until_closed(sock))
        assert server.refused == 1
        assert server.connected() == [] and shard.seen == []
    finally:
        server.close()


TRIPPED: list[str] = []


def _trip(what: str) -> None:
    TRIPPED.append(what)


class _Tripwire:
    """Unpickling it calls ``_trip``: any pickle can run code in the process that loads it."""

    def __reduce__(self):
        return (_trip, ("unpickled",))


def _frame(body: bytes) -> bytes:
    return struct.pack("!I", len(body)) + body


@pytest.mark.parametrize("opening", ["a pickle first", "a made-up proof, then a pickle", "a 1 MiB frame first"])
def test_a_shard_that_does_not_know_the_secret_cannot_make_the_gateway_unpickle(opening):
    """Nor make it buffer a large frame: the gateway hangs up."""
    TRIPPED.clear()
    path = f"\0router-fake-shard-{secrets.token_hex(6)}"
    malicious = lane.encode((lane.REPLY, [_Tripwire()], None))

    async def scenario():
        hung_up = asyncio.get_running_loop().create_future()

        async def fake_shard(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            if opening == "a 1 MiB frame first":
                writer.write(struct.pack("!I", 1 << 20))
            else:
                if opening != "a pickle first":
                    writer.write(_frame(secrets.token_bytes(32)))  # a challenge
                    (length,) = struct.unpack("!I", await reader.readexactly(4))
                    await reader.readexactly(length)  # the gateway's hello
                    writer.write(_frame(secrets.token_bytes(32)))  # a proof made up without the secret
                writer.write(malicious)
            await reader.read()  # until the gateway hangs up
            hung_up.set_result(True)
            writer.close()

        fake = await asyncio.start_unix_server(fake_shard, path)
        try:
            connecting = asyncio.ensure_future(_client(("unix", path, secrets.token_bytes(32)), "gw-1"))
            await asyncio.wait([hung_up, connecting], timeout=5)
            assert TRIPPED == []
            assert hung_up.done()  # the gateway closed the lane
            assert isinstance(connecting.exception(), lane.LaneError)
        finally:
            fake.close()

    asyncio.run(scenario())


# -- TLS on TCP lanes --------------------------------------------------------------------------

def test_a_plaintext_peer_on_a_tcp_lane_sees_nothing_in_the_clear():
    """TCP lanes are TLS: a peer speaking the lane protocol in the clear (here the first version's
    hello, with the right secret) gets no frame, at most a TLS alert, and is closed."""
    shard = _Shard()
    server = lane.LaneServer("topic-shard-5", shard.execute)
    server.hello_timeout_s = 60
    try:
        with _raw(server, "tcp") as sock:
            body = server.secret + b"gw-plain"
            sock.sendall(struct.pack("!I", len(body)) + body)
            data = _until_closed(sock)
            assert data == b"" or data[0] == 0x15  # nothing, or a TLS alert record
        assert server.connected() == [] and shard.seen == []
    finally:
        server.close()


def test_a_tcp_lane_is_tls_pinned_to_the_shards_own_certificate():
    shard = _Shard()
    server = lane.LaneServer("topic-shard-6", shard.execute)
    other = lane.LaneServer("topic-shard-7", shard.execute)
    try:
        with _tls(server) as sock:
            assert sock.version() == "TLSv1.3"
            sock.settimeout(5)
            assert sock.recv(4) == struct.pack("!I", lane.NONCE_BYTES)  # the challenge, inside TLS

        # A gateway handed another shard's certificate (an impostor on this address) stops at TLS.
        impostor = _address(server, "tcp")[:4] + (_address(other, "tcp")[4],)

        async def scenario():
            with pytest.raises(ssl.SSLCertVerificationError):
                await _client(impostor, "gw-1")

        asyncio.run(scenario())
        assert server.connected() == [] and shard.seen == []
    finally:
        server.close()
        other.close()


def test_an_authenticated_peer_announcing_a_huge_frame_is_disconnected():
    shard = _Shard()
    server = lane.LaneServer("session-shard-0", shard.execute)
    try:
        async def scenario():
            client, _, _, lost = await _client(_address(server, "tcp"), "gw-x")
            assert server.connected() == ["gw-x"]
            client.transport.write(struct.pack("!I", lane.MAX_FRAME_BYTES + 1))
            await asyncio.wait_for(lost, 5)  # closed by the shard

        asyncio.run(scenario())
        assert shard.seen == [] and server.refused == 0
    finally:
        server.close()


def test_closing_the_server_ends_the_lanes():
    shard = _Shard()
    server = lane.LaneServer("topic-shard-9", shard.execute)
    address = _address(server, "unix")

    async def scenario():
        client, replies, _, lost = await _client(address, "gw-1")
        client.call([("op", 1)])
        assert (await asyncio.wait_for(replies.get(), 5))[0] == [("op", 1)]
        await asyncio.get_running_loop().run_in_executor(None, server.close)
        await asyncio.wait_for(lost, 5)
        assert not client.open
        with pytest.raises(ConnectionError):
            client.call([("op", 2)])

    asyncio.run(scenario())


class _RayMethod:
    """``actor.method.remote(...)`` as the shard client uses it: a ref whose ``future()`` is awaited."""

    def __init__(self, answer) -> None:
        self.answer = answer
        self.calls: list[tuple] = []
        self.futures: list[concurrent.futures.Future] = []

    def remote(self, *args):
        self.calls.append(args)
        future = concurrent.futures.Future()
        self.futures.append(future)
        if self.answer is not None:
            future.set_result(self.answer(*args))
        return types.SimpleNamespace(future=lambda: future)


async def _until(predicate, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


def test_a_link_moves_to_its_lane_once_ray_calls_are_done_and_reopens_a_lane_lost_before_that():
    from gateways.shardclient import ShardClient

    shard = _Shard()
    server = shard.server = lane.LaneServer("topic-shard-3", shard.execute)
    address = _address(server, "unix")
    handle = types.SimpleNamespace(open_lane_with_epoch=_RayMethod(lambda node_id: (address, "e1")),
                                   call=_RayMethod(None), current_epoch=_RayMethod(lambda: "e1"))
    try:
        async def scenario():
            client = ShardClient("gw-1", {"topic": [("topic-shard-3", handle)]}, asyncio.get_running_loop(),
                                 on_bundle=lambda bundle: None, batch_max=100, max_inflight=4, timeout_s=30)
            link = client.links["topic"][0]
            answers: list = []
            client.send(link, ("op", 1), answers.append)
            await _until(lambda: handle.call.calls)  # no lane yet: a Ray call, left unanswered
            assert await client.open_lanes("node-a") == 1
            assert link.lane is None and link.next_lane is not None  # waits for the Ray call
            await _until(lambda: server.connected() == ["gw-1"])

            server.drop("gw-1")  # lost before it carried anything
            await _until(lambda: client.lanes_lost == 1)
            await _until(lambda: link.next_lane is not None and link.next_lane.open)
            assert len(handle.open_lane_with_epoch.calls) == 2 and link.lane is None

            assert handle.call.calls == [("gw-1", [("op", 1)])]
            handle.call.futures[0].set_result(([("op", 1)], None, "e1"))  # the Ray call answers
            await _until(lambda: answers == [("op", 1)])
            assert link.lane is not None and link.next_lane is None

            client.send(link, ("op", 2), answers.append)
            await _until(lambda: len(answers) == 2)
            assert answers[1] == ("op", 2) and client.lane_batches_sent == 1
            assert len(handle.call.calls) == 1  # the second batch went over the lane
            client.close()

        asyncio.run(scenario())
    finally:
        server.close()


def test_a_lane_opened_to_a_restarted_shard_reannounces_first_even_when_another_call_saw_the_old_epoch():
    """The shard died again between the gateway's epoch probe and its open_lane call (which Ray
    held for the restarted process). Before: the probe's stale epoch was taken for the lane's, so
    the gateway sent over a lane to a fresh shard without re-announcing its connections' state."""
    from gateways.shardclient import ShardClient

    shard = _Shard()
    server = shard.server = lane.LaneServer("topic-shard-3", shard.execute)
    address = _address(server, "unix")
    # current_epoch still answers e1 (the process that then died); the lane's process is e2
    handle = types.SimpleNamespace(open_lane_with_epoch=_RayMethod(lambda node_id: (address, "e2")),
                                   open_lane=_RayMethod(lambda node_id: address),
                                   call=_RayMethod(None), current_epoch=_RayMethod(lambda: "e1"))
    try:
        async def scenario():
            restarts: list[str] = []
            client = ShardClient("gw-1", {"topic": [("topic-shard-3", handle)]}, asyncio.get_running_loop(),
                                 on_bundle=lambda bundle: None, batch_max=100, max_inflight=4, timeout_s=30)

            def reannounce(link) -> None:
                restarts.append(link.epoch)
                client.send(link, ("announce", "sub-1"))

            client.on_restart = reannounce
            link = client.links["topic"][0]
            await client.learn_epochs()
            assert link.epoch == "e1"
            assert await client.open_lanes("node-a") == 1
            answers: list = []
            client.send(link, ("op", 1), answers.append)
            await _until(lambda: answers == [("op", 1)])
            assert restarts == ["e2"] and link.epoch == "e2"
            sent = [command for _, batch in shard.seen for command in batch]
            assert sent == [("announce", "sub-1"), contract.reannounced(), ("op", 1)]  # all over the lane
            assert not handle.call.calls and not handle.open_lane.calls
            client.close()

        asyncio.run(scenario())
    finally:
        server.close()
