"""Random malformed frames (hypothesis): each is answered, none takes the connection or the router down."""

from __future__ import annotations

import asyncio
import itertools
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateways.signal.codec import MESSAGE_TYPES
from tests.e2e.client import HubClient
from tests.e2e.conftest import make_token

ME = "fuzz/client"
ERROR_CODES = {"version_mismatch", "unauthorized", "rate_limited", "unknown_actor", "message_too_large",
               "message_expired", "timeout", "internal_error"}
REPLY_TYPES = {"hub:connected", "hub:heartbeat_ack", "hub:registered", "hub:unregistered", "hub:renewed",
               "hub:discovery_result", "hub:broadcast_ack", "hub:subscribed", "hub:delivery_ack",
               "hub:unsubscribed", "hub:queue_stats_result", "hub:error"}
FORWARDED = {"hub:send", "hub:publish", "hub:broadcast"}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**60, 2**60) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
field_names = st.sampled_from(["actorAddress", "capabilities", "metadata", "ttl", "renewalToken", "pattern",
                               "limit", "offset", "topic", "message", "to", "type", "excludeSelf", "version",
                               "jwt", "timestamp"])
addresses = st.sampled_from([ME, "fuzz/other", "Bad/Address", "", "a/b/c", "@(fuzz/client)", "x" * 80])
envelopes = st.fixed_dictionaries(
    {"type": st.sampled_from(sorted(MESSAGE_TYPES - {"hub:disconnect"})) | st.text(max_size=15)},
    optional={
        "from": addresses | json_values,
        "to": addresses | json_values,
        "payload": st.dictionaries(field_names, json_values | addresses, max_size=5) | json_values,
        "correlationId": st.text(max_size=10) | st.integers() | json_values,
        "timestamp": json_values,
        "ttl": json_values,
    },
)
frames = st.one_of(
    envelopes.map(lambda e: json.dumps(e)),
    json_values.map(lambda v: json.dumps(v)),
    st.text(max_size=200),
    st.binary(max_size=200),
)


@pytest.fixture(scope="module")
def fuzz_connection(hub):
    loop = asyncio.new_event_loop()
    client = loop.run_until_complete(HubClient.open(hub.ws_urls[0], ME, make_token(ME)))
    yield loop, client
    loop.run_until_complete(client.close())
    loop.close()


_markers = itertools.count()
_answered = {"errors": 0, "frames": 0}


async def _exchange(client: HubClient, frame: str | bytes) -> list[dict]:
    marker = f"marker-{next(_markers)}"
    await client.send_raw(frame)
    await client.send("hub:heartbeat", {}, correlationId=marker)
    replies = []
    while True:
        message = await client.recv(timeout=10)
        if message.get("correlationId") == marker and message["type"] == "hub:heartbeat_ack":
            return replies
        if message["type"] in FORWARDED and message.get("from") == ME:
            continue  # its own send/publish/broadcast coming back to it
        replies.append(message)


@settings(max_examples=300, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(frame=frames)
def test_random_frames_are_answered_and_never_break_the_connection(fuzz_connection, frame):
    loop, client = fuzz_connection
    replies = loop.run_until_complete(asyncio.wait_for(_exchange(client, frame), 20))
    assert len(replies) <= 1, replies  # one answer per request, none for a successful hub:send
    for reply in replies:
        assert reply["type"] in REPLY_TYPES, reply
        assert reply["from"] == "cloudflare/signal-hub"
        if reply["type"] == "hub:error":
            assert reply["payload"]["code"] in ERROR_CODES, reply
            assert isinstance(reply["payload"]["message"], str) and reply["payload"]["message"]
            _answered["errors"] += 1
    _answered["frames"] += 1


def test_the_router_still_serves_others_after_the_fuzzing(hub, fuzz_connection):
    from tests.e2e.client import run

    assert _answered["frames"] >= 300 and _answered["errors"] >= 200, _answered

    async def scenario():
        receiver = await HubClient.open(hub.ws_urls[1], "fuzz/after", make_token("fuzz/after"))
        assert (await receiver.request("hub:register", {"actorAddress": "fuzz/after"}))["type"] == "hub:registered"
        sender = await HubClient.open(hub.ws_urls[0], "fuzz/sender", make_token("fuzz/sender"))
        await sender.send("hub:send", {"ok": True}, to="fuzz/after")
        assert (await receiver.recv())["payload"] == {"ok": True}
        await receiver.close()
        await sender.close()

    run(scenario())
