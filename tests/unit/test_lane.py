"""Lanes (router/lane.py): framing, the hello, replies in order, pushes, a broken peer; and the shard
client's move from Ray calls to a lane (gateways/shardclient.py)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import socket
import struct
import threading
import types

import pytest

from router import lane
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
        if kind == "unix":
            address = ("unix", server.unix_address(), server.secret)
        else:
            host, port = server.tcp_address("127.0.0.1")
            address = ("tcp", host, port, server.secret)

        async def scenario():
            one, replies_one, pushes_one, _ = await _client(address, "gw-1")
            two, replies_two, pushes_two, _ = await _client(address, "gw-2")
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

        asyncio.run(scenario())
        assert shard.threads == {"lane-topic-shard-0"}  # every batch ran on the lane's thread
        assert server.push("gw-unknown", ("s", "e", 0, [])) is False
    finally:
        server.close()


def test_a_wrong_secret_is_closed_without_unpickling_anything():
    shard = _Shard()
    server = lane.LaneServer("registry-shard-1", shard.execute)
    try:
        address = ("unix", server.unix_address(), b"\x00" * lane.SECRET_BYTES)

        async def scenario():
            client, replies, _, lost = await _client(address, "intruder")
            client.call([("op", 1)])
            await asyncio.wait_for(lost, 5)
            assert replies.empty()

        asyncio.run(scenario())
        assert shard.seen == []
        assert server.refused == 1
        assert server.connected() == []
    finally:
        server.close()


def test_a_peer_announcing_a_huge_frame_is_disconnected():
    shard = _Shard()
    server = lane.LaneServer("session-shard-0", shard.execute)
    try:
        host, port = server.tcp_address("127.0.0.1")
        with socket.create_connection((host, port), timeout=5) as sock:
            sock.sendall(lane.hello(server.secret, "gw-x"))
            sock.sendall(struct.pack("!I", lane.MAX_FRAME_BYTES + 1))
            sock.settimeout(5)
            assert sock.recv(10) == b""  # closed by the shard
        assert shard.seen == []
    finally:
        server.close()


def test_closing_the_server_ends_the_lanes():
    shard = _Shard()
    server = lane.LaneServer("topic-shard-9", shard.execute)
    address = ("unix", server.unix_address(), server.secret)

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
    address = ("unix", server.unix_address(), server.secret)
    handle = types.SimpleNamespace(open_lane=_RayMethod(lambda node_id: address), handle=_RayMethod(None))
    try:
        async def scenario():
            client = ShardClient("gw-1", {"topic": [("topic-shard-3", handle)]}, asyncio.get_running_loop(),
                                 on_bundle=lambda bundle: None, batch_max=100, max_inflight=4, timeout_s=30)
            link = client.links["topic"][0]
            answers: list = []
            client.send(link, ("op", 1), answers.append)
            await _until(lambda: handle.handle.calls)  # no lane yet: a Ray call, left unanswered
            assert await client.open_lanes("node-a") == 1
            assert link.lane is None and link.next_lane is not None  # waits for the Ray call
            await _until(lambda: server.connected() == ["gw-1"])

            server.drop("gw-1")  # lost before it carried anything
            await _until(lambda: client.lanes_lost == 1)
            await _until(lambda: link.next_lane is not None and link.next_lane.open)
            assert len(handle.open_lane.calls) == 2 and link.lane is None

            assert handle.handle.calls == [("gw-1", [("op", 1)])]
            handle.handle.futures[0].set_result(([("op", 1)], None))  # the Ray call answers
            await _until(lambda: answers == [("op", 1)])
            assert link.lane is not None and link.next_lane is None

            client.send(link, ("op", 2), answers.append)
            await _until(lambda: len(answers) == 2)
            assert answers[1] == ("op", 2) and client.lane_batches_sent == 1
            assert len(handle.handle.calls) == 1  # the second batch went over the lane
            client.close()

        asyncio.run(scenario())
    finally:
        server.close()
