"""router/nesting.py and the codecs that use it: a message nested deeper than 32 levels is refused
at decode with the protocol's own error (before: it was accepted, and pickling it to a shard
failed the whole batch it travelled in)."""

from __future__ import annotations

import json

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateways.cashu import codec as cashu
from gateways.cashu.config import CASHU_KINDS
from gateways.nolag import codec as nolag
from gateways.signal import codec as signal
from router.nesting import MAX_NESTING, json_may_nest_deeper, too_deep


def nested(levels: int) -> list:
    """``levels`` arrays, one in the other."""
    value: list = []
    for _ in range(levels - 1):
        value = [value]
    return value


def test_too_deep_counts_dicts_and_lists_from_the_top():
    assert MAX_NESTING == 32
    assert not too_deep(nested(32)) and too_deep(nested(33))
    assert not too_deep({"a": nested(31)}) and too_deep({"a": nested(32)})
    assert not too_deep("x" * 10) and not too_deep({}) and not too_deep([1, "a", None])
    assert too_deep(nested(100_000))  # iterative: no recursion to exhaust


def test_a_container_among_many_scalars_and_subclasses_of_containers_still_count():
    class Map(dict):
        pass

    assert not too_deep(["id"] * 10_000 + [nested(31)]) and too_deep(["id"] * 10_000 + [nested(32)])
    deep: object = Map()
    for _ in range(40):
        deep = Map(x=deep)
    assert too_deep(["a", 1, deep]) and too_deep((deep,))
    assert not too_deep({"msgIds": ["a"] * 1000, "n": 1.5, "b": b"x"})


def test_json_with_few_brackets_cannot_nest_too_deep_so_the_walk_is_skipped():
    text = json.dumps(nested(32))
    assert not json_may_nest_deeper(text) and not json_may_nest_deeper(text.encode())
    deeper = json.dumps(nested(33))
    assert json_may_nest_deeper(deeper) and json_may_nest_deeper(deeper.encode())
    # Brackets inside strings only overcount: the walk then runs and decides.
    assert json_may_nest_deeper(json.dumps({"s": "{[" * 20})) and not too_deep({"s": "{[" * 20})


@settings(max_examples=300, deadline=None)
@given(text=st.binary(max_size=200) | st.lists(st.sampled_from([b"{", b"[", b"}", b"]", b'"', b"a"]), max_size=80)
       .map(b"".join), limit=st.integers(0, 40))
def test_bytes_may_nest_deeper_exactly_when_they_hold_more_openers_than_the_limit(text, limit):
    assert json_may_nest_deeper(text, limit) == (text.count(b"{") + text.count(b"[") > limit)
    assert json_may_nest_deeper(bytearray(text), limit) == json_may_nest_deeper(text, limit)


def test_signal_refuses_a_message_nested_too_deep():
    message = {"type": "hub:register", "from": "rt/a", "payload": {"metadata": {"x": nested(29)}}}
    signal.decode(json.dumps(message).encode())  # 32 levels: accepted
    message["payload"]["metadata"]["x"] = nested(30)
    with pytest.raises(signal.SignalError) as raised:
        signal.decode(json.dumps(message).encode())
    assert (raised.value.code, raised.value.message, raised.value.details) == (
        "internal_error", "A message may nest at most 32 levels", {"reason": "too_deep"})


def test_cashu_refuses_a_message_nested_too_deep():
    limits = cashu.Limits(frozenset(CASHU_KINDS))
    message = {"jsonrpc": "2.0", "id": 1, "method": "subscribe", "params": {"x": nested(32)}}
    with pytest.raises(cashu.RpcError) as raised:
        cashu.decode(json.dumps(message).encode(), limits)
    assert (raised.value.code, raised.value.message) == (
        cashu.INVALID_REQUEST, "Invalid Request: nested deeper than 32 levels")


def test_nolag_refuses_a_message_nested_too_deep():
    message = {"type": "setPresence", "topic": "app/room/t", "data": {"x": nested(31)}}
    with pytest.raises(nolag.NolagError) as raised:
        nolag.decode(msgpack.packb(message))
    assert (raised.value.error, raised.value.message) == ("invalid_message", "a message may nest at most 32 levels")


def test_nolag_acks_keep_only_their_ids_so_their_nesting_is_not_walked():
    deep = {"x": nested(40)}
    batch = nolag.decode(msgpack.packb({"type": "batchAck", "msgIds": ["a", "b"], "extra": deep}))
    assert batch == nolag.BatchAck(("a", "b"))
    assert nolag.decode(msgpack.packb({"type": "ack", "msgId": "a", "extra": deep})) == nolag.Ack("a")
    with pytest.raises(nolag.NolagError):  # an id must be a string: nothing nested gets through
        nolag.decode(msgpack.packb({"type": "batchAck", "msgIds": ["a", nested(40)]}))
    with pytest.raises(nolag.NolagError):
        nolag.decode(msgpack.packb({"type": "subscribe", "topic": "app/room/t", "extra": deep}))


def test_nolag_a_type_that_is_not_a_string_is_its_own_error_whatever_it_holds():
    for kind in ([], {}, [nested(40)], {"a": 1}):
        with pytest.raises(nolag.NolagError) as raised:
            nolag.decode(msgpack.packb({"type": kind}))
        assert raised.value.error == "invalid_message"
