"""gateways/mx/ingest.py and keepalive.py, the pure parts: who may push to /save, when a quiet
connection is pinged and when it is idle, and the work a frame needs before the shards."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gateways.mx import generator, node
from gateways.mx.config import MxConfig, MxIngestConfig
from gateways.mx.ingest import NO_TOKEN, NOT_LOOPBACK, block_items, decode, ingest_refusal, is_loopback
from gateways.keepalive import IDLE, PING, Keepalive
from gateways.mx.node import Ignored, InvalidNodeFrame

TOKEN = b"node-token-0123456789abcdef"


@pytest.mark.parametrize("remote", [
    "127.0.0.1:40000", "127.8.9.10:1", "127.255.255.254:65535", "::1:40000", "[::1]:40000",
    "::ffff:127.0.0.1:40000",
])
def test_loopback_peers(remote):
    assert is_loopback(remote)


@pytest.mark.parametrize("remote", [
    "192.0.2.2:40000", "10.0.0.1:1", "0.0.0.0:1", "128.0.0.1:1", "fd00::2:40000", "::ffff:10.0.0.1:1",
    "::2:1", "localhost:80", "", "garbage", "127.0.0.1",  # no port: its host part "127.0.0" is no address
])
def test_other_peers_are_not_loopback(remote):
    assert not is_loopback(remote)


def test_without_a_token_only_loopback_peers_may_push():
    assert ingest_refusal(None, None, "127.0.0.1:5000") is None
    assert ingest_refusal(None, None, "::1:5000") is None
    assert ingest_refusal(None, None, "192.0.2.2:5000") == NOT_LOOPBACK
    # Relayed by a proxy on this machine: local in appearance only.
    assert ingest_refusal(None, None, "127.0.0.1:5000", forwarded=True) == NOT_LOOPBACK
    assert ingest_refusal(b"a-node-token-of-16+", "Bearer a-node-token-of-16+", "127.0.0.1:5000", forwarded=True) is None
    # a credential means nothing while no token is configured
    assert ingest_refusal(None, "Bearer " + TOKEN.decode(), "192.0.2.2:5000") == NOT_LOOPBACK


@pytest.mark.parametrize("authorization", [
    "Bearer " + TOKEN.decode(), "bearer " + TOKEN.decode(), "BEARER  " + TOKEN.decode() + " ",
])
def test_with_a_token_the_bearer_credential_admits_from_anywhere(authorization):
    for remote in ("127.0.0.1:1", "192.0.2.2:5000", "fd00::2:5000"):
        assert ingest_refusal(TOKEN, authorization, remote) is None


@pytest.mark.parametrize("authorization", [
    None, "", "Bearer", "Bearer ", "Bearer " + TOKEN.decode()[:-1], "Bearer " + TOKEN.decode() + "x",
    "Bearer x" + TOKEN.decode(), "Basic " + TOKEN.decode(), TOKEN.decode(), "Token " + TOKEN.decode(),
])
def test_with_a_token_anything_else_is_refused_even_on_loopback(authorization):
    assert ingest_refusal(TOKEN, authorization, "127.0.0.1:1") == NO_TOKEN
    assert ingest_refusal(TOKEN, authorization, "192.0.2.2:1") == NO_TOKEN


def test_node_token_is_secret_and_not_too_short():
    config = MxConfig(node_token="t" * 16)
    assert "t" * 16 not in repr(config) and config.node_token.get_secret_value() == "t" * 16
    assert MxConfig().node_token is None
    with pytest.raises(ValidationError):
        MxConfig(node_token="short")


def test_ping_interval_must_be_shorter_than_the_idle_timeout():
    assert (MxConfig().ping_interval_s, MxConfig().idle_timeout_s) == (30, 120)
    with pytest.raises(ValidationError):
        MxConfig(idle_timeout_s=10, ping_interval_s=10)


def test_waiting_bytes_hold_at_least_one_frame():
    assert MxIngestConfig().offload_frame_bytes == 64 * 1024
    with pytest.raises(ValidationError):
        MxIngestConfig(max_frame_bytes=8 << 20, max_waiting_bytes=4 << 20)


def test_keepalive_pings_a_quiet_connection_once_per_interval_and_calls_a_silent_one_idle():
    keepalive = Keepalive(ping_interval_s=30, idle_timeout_s=120)
    assert keepalive.due(last_activity=0, now=29.9) is None
    assert keepalive.due(0, 30) == PING
    assert keepalive.due(0, 45) is None  # pinged 15 s ago
    assert keepalive.due(0, 60) == PING
    assert keepalive.due(61, 70) is None  # the pong came: quiet again from 61
    assert keepalive.due(61, 90) is None  # quiet 29 s
    assert keepalive.due(61, 91) == PING
    assert keepalive.due(61, 180) == PING
    assert keepalive.due(61, 181) is None  # 120 s without a byte: not more yet
    assert keepalive.due(61, 181.5) == IDLE
    assert keepalive.reason() == "idle for 120 s"
    assert Keepalive(0.5, 2.5).reason() == "idle for 2.5 s"


def test_decode_does_all_the_work_before_the_shards():
    block = generator.generate_save_block(3, transactions=4)
    frame, output = decode(generator.save_block_frame(block, 7), node.AUTO)
    assert (frame.counter, frame.topic, frame.with_acknowledge) == (7, node.SAVE_BLOCK, True)
    assert output == block_items(node.normalize_save_block(block))
    frame, output = decode(generator.save_block_frame(block, 8, node.JSON), node.AUTO)
    assert frame.marshaller == node.JSON and output == block_items(node.normalize_save_block(block))
    frame, output = decode(node.node_ack_frame(3), node.AUTO)
    assert frame.type == node.ACK and output is None
    frame, output = decode(node.encode_node_frame("SaveAccounts", b"x", 9), node.AUTO)
    assert output == Ignored("SaveAccounts", True)
    frame, output = decode(b"\xff\xff", node.AUTO)
    assert frame is None and isinstance(output, InvalidNodeFrame) and output.reason == node.UNDECODABLE
    frame, output = decode(node.encode_node_frame(node.SAVE_BLOCK, b"\xff\xff", 10), node.AUTO)
    assert frame.counter == 10 and output.reason == node.UNDECODABLE_PAYLOAD


def test_keepalive_tend_pings_a_quiet_wire_and_hands_over_the_reason_when_it_is_silent():
    class Wire:
        last_activity = 0.0
        pings = 0

        def ping(self):
            self.pings += 1

    wire, closed = Wire(), []
    keepalive = Keepalive(ping_interval_s=30, idle_timeout_s=120)
    keepalive.tend(wire, 29.9, closed.append)
    keepalive.tend(wire, 30, closed.append)
    keepalive.tend(wire, 59, closed.append)
    assert (wire.pings, closed) == (1, [])
    keepalive.tend(wire, 120.1, closed.append)
    assert (wire.pings, closed) == (1, ["idle for 120 s"])
