"""The blocking end of a lane (router/lane.py ``BlockingLane``): what a shard uses to call another
shard (Baqend's document shards forward their writes to every query shard over one). Real sockets
and a real :class:`LaneServer`, in this process or in a child process that is killed."""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import threading
import time

import pytest

from router import lane
from tests.stopping import stop
from tests.unit.test_lane import _address, _Shard

CALLER = "document-shard-0"


def _served(name: str = "query-shard-0") -> tuple[_Shard, lane.LaneServer]:
    shard = _Shard()
    shard.server = lane.LaneServer(name, shard.execute)
    return shard, shard.server


def _soon(seconds: float = 5.0) -> float:
    return time.monotonic() + seconds


@pytest.mark.parametrize("kind", ["unix", "tcp"])
def test_a_blocking_lane_says_hello_and_gets_each_batch_answered_in_order(kind):
    shard, server = _served()
    try:
        blocking = lane.BlockingLane.connect(_address(server, kind), CALLER, 5.0)
        try:
            assert server.connected() == [CALLER] and server.kinds() == {CALLER: kind}
            for n in range(20):
                blocking.send([("op", n), ("op", n + 100)])
                results, bundle = blocking.receive(_soon())
                assert results == [("op", n), ("op", n + 100)]
                assert bundle == ("shard", "e1", n + 1, [("for-caller", CALLER)])
            assert shard.seen == [(CALLER, [("op", n), ("op", n + 100)]) for n in range(20)]
            assert shard.threads == {"lane-query-shard-0"}  # run by the lane's thread, as a gateway's are
            assert blocking.owed == 0 and not blocking.closed
        finally:
            blocking.close()
        assert blocking.closed and server.refused == 0
    finally:
        server.close()


@pytest.mark.parametrize("kind", ["unix", "tcp"])
def test_a_wrong_secret_is_refused_and_nothing_runs(kind):
    shard, server = _served()
    try:
        address = list(_address(server, kind))
        address[3 if kind == "tcp" else 2] = os.urandom(lane.SECRET_BYTES)
        with pytest.raises(lane.LaneError, match="closed by the shard during the hello"):
            lane.BlockingLane.connect(tuple(address), CALLER, 5.0)
        assert server.refused == 1 and server.connected() == [] and shard.seen == []
    finally:
        server.close()


def _fake_shard(answer) -> tuple[str, threading.Thread]:
    """A Unix listener that accepts one peer and runs ``answer(sock)``: a shard that is not one."""
    path = f"\0test-blocking-lane-{os.getpid()}-{time.monotonic_ns()}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)

    def serve() -> None:
        with listener:
            peer, _ = listener.accept()
            with peer:
                answer(peer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return path, thread


def test_a_shard_that_cannot_prove_the_secret_is_refused_before_anything_is_sent():
    seen: list[bytes] = []

    def impostor(peer: socket.socket) -> None:
        peer.sendall(lane._frame(os.urandom(lane.NONCE_BYTES)))
        seen.append(peer.recv(4096))  # the hello
        peer.sendall(lane._frame(os.urandom(lane.MAC_BYTES)))  # not the proof
        peer.settimeout(5)
        seen.append(peer.recv(4096))  # what follows: the caller closes

    path, thread = _fake_shard(impostor)
    with pytest.raises(lane.LaneError, match="did not prove"):
        lane.BlockingLane.connect(("unix", path, os.urandom(lane.SECRET_BYTES)), CALLER, 5.0)
    thread.join(5)
    assert len(seen[0]) == 4 + lane.NONCE_BYTES + lane.MAC_BYTES + len(CALLER) and seen[1] == b""


def test_a_shard_that_says_nothing_times_the_hello_out():
    released = threading.Event()
    path, thread = _fake_shard(lambda peer: released.wait(5))
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        lane.BlockingLane.connect(("unix", path, os.urandom(lane.SECRET_BYTES)), CALLER, 0.2)
    assert 0.2 <= time.monotonic() - started < 2
    released.set()
    thread.join(5)


@pytest.mark.parametrize("kind", ["unix", "tcp"])
def test_a_closed_shard_lane_raises_and_the_lane_is_never_used_again(kind):
    shard, server = _served()
    try:
        blocking = lane.BlockingLane.connect(_address(server, kind), CALLER, 5.0)
        blocking.send([("op", 1)])
        assert blocking.receive(_soon())[0] == [("op", 1)]
    finally:
        server.close()
    with pytest.raises(OSError):  # ConnectionError: closed, reset or a broken pipe
        blocking.send([("op", 2)])
        blocking.receive(_soon())
    assert blocking.closed
    with pytest.raises(ConnectionError, match="lane closed"):
        blocking.send([("op", 3)])
    assert shard.seen == [(CALLER, [("op", 1)])]


def _child_shard(pipe) -> None:
    """A shard process: serves a lane until it is killed."""
    server = lane.LaneServer("query-shard-1", lambda caller, commands: (list(commands), None))
    pipe.send(("unix", server.unix_address(), server.secret))
    threading.Event().wait(60)


def test_a_lane_to_a_shard_whose_process_dies_mid_call_raises():
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    child = context.Process(target=_child_shard, args=(theirs,), daemon=True)
    child.start()
    try:
        assert ours.poll(30)
        blocking = lane.BlockingLane.connect(ours.recv(), CALLER, 5.0)
        blocking.send([("op", 1)])
        assert blocking.receive(_soon()) == ([("op", 1)], None)
        # The next batch is sent but never answered: SIGSTOP wakes one thread of the child, and the
        # lane's thread could still answer until that one runs, so wait until every thread stopped.
        stop(child.pid)
        blocking.send([("op", 2)])
        os.kill(child.pid, signal.SIGKILL)  # and the process dies
        started = time.monotonic()
        with pytest.raises(ConnectionError):
            blocking.receive(_soon())
        assert time.monotonic() - started < 2 and blocking.closed
    finally:
        child.kill()
        child.join(10)


@pytest.mark.parametrize("kind", ["unix", "tcp"])
def test_a_reply_past_the_deadline_raises_and_is_not_taken_for_the_next_batchs(kind):
    """The lane stays open (nothing of the stream was lost): the late reply is read and dropped when
    the next batch's reply is wanted, and both batches ran, in order."""
    release = threading.Event()
    shard, server = _served()
    execute = shard.execute

    def slow(caller: str, commands: list) -> tuple:
        if commands[0][0] == "slow":
            release.wait(5)
        return execute(caller, commands)

    server.execute = slow
    try:
        blocking = lane.BlockingLane.connect(_address(server, kind), CALLER, 5.0)
        blocking.send([("slow", 1)])
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            blocking.receive(started + 0.1)
        assert 0.1 <= time.monotonic() - started < 2
        assert not blocking.closed and blocking.owed == 1
        release.set()
        blocking.send([("op", 2)])
        assert blocking.receive(_soon())[0] == [("op", 2)]
        assert blocking.owed == 0
        assert shard.seen == [(CALLER, [("slow", 1)]), (CALLER, [("op", 2)])]
        blocking.close()
    finally:
        release.set()
        server.close()


def test_a_push_to_the_caller_is_skipped_and_the_reply_after_it_returned():
    shard, server = _served()
    try:
        blocking = lane.BlockingLane.connect(_address(server, "unix"), CALLER, 5.0)
        blocking.send([("push", CALLER, "stray"), ("op", 1)])  # the shard pushes to its caller first
        results, _ = blocking.receive(_soon())
        assert results == [True, ("op", 1)] and blocking.pushes == 1
        blocking.close()
    finally:
        server.close()
