"""``codec.envelope``: topic and msgRef of a frame too large to decode, its data skipped."""

from __future__ import annotations

import msgpack

from gateways.nolag import codec
from gateways.nolag.codec import Envelope, Limits


def test_reads_type_topic_and_msg_ref_around_the_data():
    frame = msgpack.packb({"type": "publish", "topic": "a/b/c", "data": {"blob": "x" * 500_000, "n": [1] * 1000},
                           "qos": 1, "echo": True, "msgRef": "r9"})
    assert codec.envelope(frame) == Envelope("publish", "a/b/c", "r9")


def test_msg_ref_may_be_a_number_and_fields_come_in_any_order():
    frame = msgpack.packb({"msgRef": 12, "data": [[1, 2]] * 10_000, "topic": "a/b/c", "type": "publish"})
    assert codec.envelope(frame) == Envelope("publish", "a/b/c", 12)


def test_what_cannot_be_read_is_none():
    assert codec.envelope(msgpack.packb(["x" * 10_000])) == Envelope()  # not a map
    assert codec.envelope(b"\xff\x00") == Envelope()  # not MessagePack
    truncated = msgpack.packb({"type": "publish", "topic": "a/b/c", "data": "x" * 1000, "msgRef": 1})[:-20]
    assert codec.envelope(truncated) == Envelope("publish", "a/b/c", None)
    wrong_types = msgpack.packb({"type": 3, "topic": ["a"], "msgRef": {"x": 1}})
    assert codec.envelope(wrong_types) == Envelope()


def test_values_over_their_limit_are_not_echoed_and_nothing_big_is_built():
    limits = Limits(max_topic_length=16, max_id_length=16)
    frame = msgpack.packb({"type": "publish", "msgRef": "r", "topic": "a/b/" + "c" * 100_000})
    assert codec.envelope(frame, limits) == Envelope("publish", None, "r")
    deep = (msgpack.packb("type") + msgpack.packb("publish") + msgpack.packb("data") + b"\x91" * 100_000 + b"\xc0"
            + msgpack.packb("msgRef") + msgpack.packb(1))
    assert codec.envelope(b"\x83" + deep) == Envelope("publish", None, None)  # nested too deep to walk
