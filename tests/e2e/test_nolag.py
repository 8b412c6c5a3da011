"""NoLag over real sockets: auth and keys, pub/sub with filters, QoS, load balancing, replay,
presence, lobbies, hydration and every error code.

``nolag``: two gateways, two shards of each kind, a hydration webhook (a local HTTP server), two
lobbies, short QoS timers and a 4 KiB message limit so each limit is quick to hit.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import msgpack
import pytest
import ray

from router import contract
from router.shardmap import TOPIC as TOPIC_SHARD, shard_name
from tests.e2e.client import eventually, run
from tests.e2e.conftest import RunningRouter, start_router
from tests.e2e.nolag_client import Client, NolagRouter
from tests.e2e.rawws import Opcode, client_frame, open_raw_websocket, read_server_frame

pytestmark = pytest.mark.e2e

TOPIC = "chat/general/messages"


class Webhook:
    """The hydration webhook: records each POST and answers recent messages."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                hook.requests.append(body)
                answer = json.dumps({"recentMessages": [{"text": "earlier", "room": body["roomName"]}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hydrate"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()


class HydratingRouter(NolagRouter):
    def __init__(self, running: RunningRouter, webhook: Webhook) -> None:
        super().__init__(running)
        self.webhook = webhook


@pytest.fixture(scope="module")
def nolag(ray_runtime, tmp_path_factory) -> HydratingRouter:
    data_dir = tmp_path_factory.mktemp("nolag-data")
    webhook = Webhook()
    running = start_router(
        namespace="e2e-nolag", data_dir=data_dir, port=0, gateways=2, ray_dashboard=False,
        shards={"session": 2, "topic": 2, "registry": 1}, signal={"enabled": False}, cashu={"enabled": False},
        mx={"enabled": False}, baqend={"enabled": False}, gateway={"sweep_interval_s": 0.1},
        nolag={"max_message_bytes": 4096, "ack_timeout_s": 0.5, "ack_backoff": 1, "max_attempts": 3,
               "auth_timeout_s": 1.5, "revocation_poll_s": 0.2, "heartbeat_timeout_s": 4,
               "lobbies": {"trips": {"prefix": "trip-"}, "pair": {"rooms": ["r1", "r2"]}},
               "hydration": [{"topics": "hyd/*/*", "url": webhook.url}]},
    )
    yield HydratingRouter(running, webhook)
    running.router.stop()
    webhook.stop()


async def _value(value):
    return value


def error_of(frame: dict) -> dict:
    """An error frame without its ``hint`` (a human-readable text the SDK shows), which must be there."""
    assert frame["type"] == "error" and isinstance(frame.get("hint"), str) and frame["hint"], frame
    return {key: value for key, value in frame.items() if key != "hint"}


# -- auth, heartbeat --------------------------------------------------------------------------

def test_auth_reply_and_heartbeats(nolag):
    async def scenario():
        token = nolag.token()
        client = await Client.open(nolag.urls[0])
        await client.ws.send(b"")  # a heartbeat before auth is not answered ...
        await client.send({"type": "subscribe", "topic": TOPIC})
        assert error_of(await client.recv()) == {"type": "error", "error": "not_authenticated"}
        await client.send({"type": "auth", "token": token, "reconnect": False, "projectId": "proj_1",
                           "protocolVersion": 2})
        reply = await client.recv()
        key_id = token.split("_", 2)[2].split(".")[0]
        assert reply == {"type": "auth", "success": True, "actorTokenId": f"actor_{key_id}", "projectId": "proj_1",
                         "protocolVersion": 2, "restoredSubscriptions": []}
        assert client.heartbeats == 0
        await client.ws.send(b"")  # ... after auth it is echoed
        assert await asyncio.wait_for(client.ws.recv(), 10) == b""
        await client.close()

    run(scenario())


def test_silent_connection_is_closed_after_missed_heartbeats(nolag):
    async def scenario():
        client = await Client.open(nolag.urls[0], nolag.token())
        started = time.monotonic()
        await asyncio.wait_for(client.ws.wait_closed(), 15)
        assert time.monotonic() - started >= 3.5
        assert (client.ws.close_code, client.ws.close_reason) == (1001, "heartbeat timeout")

    run(scenario())


def test_bad_token_and_missing_auth(nolag):
    async def scenario():
        client = await Client.open(nolag.urls[0])
        await client.send({"type": "auth", "token": "at_live_0123456789abcdef.wrong"})
        assert await client.recv() == {"type": "auth", "success": False, "error": "access_denied"}
        await asyncio.wait_for(client.ws.wait_closed(), 10)
        silent = await Client.open(nolag.urls[1])
        started = time.monotonic()
        assert error_of(await silent.recv()) == {"type": "error", "error": "auth_timeout"}
        await asyncio.wait_for(silent.ws.wait_closed(), 10)
        assert time.monotonic() - started >= 1.4 and silent.ws.close_code == 1008

    run(scenario())


def test_revoking_a_key_disconnects_its_sessions(nolag):
    async def scenario():
        token = nolag.token()
        client = await Client.open(nolag.urls[1], token)
        await client.subscribe(TOPIC)
        assert nolag.keys.revoke(token.split("_", 2)[2].split(".")[0])
        assert await client.recv() == {"type": "disconnect", "reason": "token_invalid"}
        await asyncio.wait_for(client.ws.wait_closed(), 10)
        again = await Client.open(nolag.urls[0])
        await again.send({"type": "auth", "token": token})
        assert (await again.recv())["success"] is False

    run(scenario())


# -- subscribe, publish, filters --------------------------------------------------------------

def test_publish_echo_and_published_ack(nolag):
    async def scenario():
        a = await Client.open(nolag.urls[0], nolag.token())
        b = await Client.open(nolag.urls[1], nolag.token())
        for client in (a, b):
            assert await client.subscribe(TOPIC, qos=0) == {"type": "subscribed", "topic": TOPIC, "loadBalance": False}
        await a.publish(TOPIC, {"text": "hello world", "sender": "user_12"}, qos=0, echo=False, msgRef=1)
        assert await a.recv() == {"type": "published", "topic": TOPIC, "msgRef": 1}
        message = await b.recv()
        assert {k: v for k, v in message.items() if k != "timestamp"} == {
            "type": "message", "topic": TOPIC, "data": {"text": "hello world", "sender": "user_12"}}
        await a.quiet()  # echo false: the sender got nothing
        await a.publish(TOPIC, "again", qos=0)  # echo defaults to true
        assert (await a.recv())["data"] == "again" and (await b.recv())["data"] == "again"
        await a.send({"type": "unsubscribe", "topic": TOPIC})
        assert await a.recv() == {"type": "unsubscribed", "topic": TOPIC}
        for client in (a, b):
            await client.close()

    run(scenario())


def test_filters_route_and_set_filters_replaces_them(nolag):
    topic = "chat/filters/messages"

    async def scenario():
        filtered = await Client.open(nolag.urls[0], nolag.token())
        wildcard = await Client.open(nolag.urls[1], nolag.token())
        sender = await Client.open(nolag.urls[1], nolag.token())
        await filtered.subscribe(topic, qos=0, filters=["user_123", "user_456"])
        await wildcard.subscribe(topic, qos=0)
        await sender.subscribe(topic, qos=0)
        await sender.publish(topic, "to 123", qos=0, echo=False, filter="user_123")
        await sender.publish(topic, "to 789", qos=0, echo=False, filter="user_789")
        await sender.publish(topic, "to all", qos=0, echo=False)
        got = [await filtered.recv()]
        assert (got[0]["data"], got[0]["filter"]) == ("to 123", "user_123")
        assert [(await wildcard.recv())["data"] for _ in range(3)] == ["to 123", "to 789", "to all"]
        await filtered.quiet()  # a filtered subscription gets only its filters (see docs/nolag.md)
        await filtered.send({"type": "setFilters", "topic": topic, "filters": ["user_789"]})
        assert await filtered.recv() == {"type": "filtersUpdated", "topic": topic, "filters": ["user_789"]}
        await sender.publish(topic, "789 again", qos=0, echo=False, filter="user_789")
        assert (await filtered.recv())["data"] == "789 again"
        await filtered.send({"type": "setFilters", "topic": topic, "filters": []})  # wildcard mode
        assert await filtered.recv() == {"type": "filtersUpdated", "topic": topic, "filters": []}
        await sender.publish(topic, "everyone", qos=0, echo=False)
        assert (await filtered.recv())["data"] == "everyone"
        for client in (filtered, wildcard, sender):
            await client.close()

    run(scenario())


def _topic_stamps(nolag) -> int:
    """How many topics the topic shards keep a last stamp of (a ``core.stats`` batch runs their timers first)."""
    settings = nolag.running.settings
    shards = [ray.get_actor(shard_name(TOPIC_SHARD, i), namespace=settings.namespace)
              for i in range(settings.shards.topic)]
    answers = ray.get([shard.handle.remote("stamps-probe", [contract.stats()]) for shard in shards], timeout=30)
    return sum(results[0]["nolag_topic_stamps"] for results, _ in answers)


@pytest.mark.security
def test_topic_stamps_are_forgotten_once_the_clock_has_passed_them(nolag):
    """Each client-chosen topic left a stamp in its shard for ever; now only while it still matters."""
    topics = [f"stamps/r{i}/t" for i in range(200)]

    async def scenario():
        client = await Client.open(nolag.urls[0], nolag.token(rate_limit_per_s=1000))
        for ref, topic in enumerate(topics):
            await client.subscribe(topic, qos=0)
            await client.publish(topic, ref, qos=0, echo=False, msgRef=ref)
            assert await client.recv() == {"type": "published", "topic": topic, "msgRef": ref}
        assert await asyncio.to_thread(_topic_stamps, nolag) >= len(topics)
        await client.close()  # silent for longer than heartbeat_timeout_s while the stamps go stale
        await eventually(lambda: asyncio.to_thread(lambda: _topic_stamps(nolag) == 0), timeout=20, interval=0.5)
        # Stamps of a forgotten topic still increase.
        writer = await Client.open(nolag.urls[0], nolag.token())
        reader = await Client.open(nolag.urls[1], nolag.token())
        for each in (writer, reader):
            await each.subscribe(topics[0], qos=0)
        for data in ("after", "again"):
            await writer.publish(topics[0], data, qos=0, echo=False)
        first, second = await reader.expect("message"), await reader.expect("message")
        assert (first["data"], second["data"]) == ("after", "again")
        assert first["timestamp"] < second["timestamp"]
        for each in (writer, reader):
            await each.close()

    run(scenario(), timeout=90)


def test_error_codes(nolag):
    async def scenario():
        client = await Client.open(nolag.urls[0], nolag.token(publish=["chat/#"], subscribe=["chat/#", "open/#"]))
        await client.subscribe(TOPIC, qos=0)
        await client.send({"type": "subscribe", "topic": "secret/room/x"})
        assert error_of(await client.recv()) == {"type": "error", "error": "not_authorized", "topic": "secret/room/x"}
        await client.send({"type": "subscribe", "topic": TOPIC, "filters": ["a/b"]})
        assert error_of(await client.recv()) == {"type": "error", "error": "invalid_filter_chars", "topic": TOPIC}
        await client.send({"type": "subscribe", "topic": TOPIC, "filters": [f"f{i}" for i in range(101)]})
        assert error_of(await client.recv()) == {"type": "error", "error": "too_many_filters", "topic": TOPIC}
        await client.send({"type": "setFilters", "topic": TOPIC, "filters": ["x#"]})
        assert error_of(await client.recv()) == {"type": "error", "error": "invalid_filter_chars", "topic": TOPIC}
        await client.publish("chat/other/messages", 1, msgRef="r1")
        assert error_of(await client.recv()) == {"type": "error", "error": "not_subscribed", "topic": "chat/other/messages",
                                       "msgRef": "r1"}
        await client.subscribe("open/room/topic", qos=0)
        for ref in ("r2", "r2-again"):  # the first answer is not kept as leave to publish
            await client.publish("open/room/topic", 1, msgRef=ref)
            assert error_of(await client.recv()) == {"type": "error", "error": "not_authorized",
                                                     "topic": "open/room/topic", "msgRef": ref}
        await client.publish(TOPIC, "x" * 5000, msgRef="r3")
        reply = await client.recv()
        assert reply["error"] == "message_too_large" and reply["code"] == 42930 and reply["msgRef"] == "r3"
        assert reply["topic"] == TOPIC and reply["maxSizeBytes"] == 4096
        await client.send({"type": "subscribe", "topic": "not a slug"})
        assert (await client.recv())["error"] == "invalid_topic"
        await client.close()

        limited = await Client.open(nolag.urls[1], nolag.token(rate_limit_per_s=3))
        await limited.subscribe(TOPIC, qos=0)
        for n in range(6):
            await limited.publish(TOPIC, n, qos=0, echo=False, msgRef=n)
        replies = [await limited.recv() for _ in range(6)]
        refused = [r for r in replies if r["type"] == "error"]
        assert refused and all(r["error"] == "rate_limit_exceeded" and r["code"] == 42910 for r in refused)
        await limited.close()

        quota = await Client.open(nolag.urls[0], nolag.token(monthly_quota=2))
        await quota.subscribe(TOPIC, qos=0)
        for n in range(3):
            await quota.publish(TOPIC, n, qos=0, echo=False, msgRef=n)
        replies = {reply["msgRef"]: reply for reply in [await quota.recv() for _ in range(3)]}
        assert replies[0] == {"type": "published", "topic": TOPIC, "msgRef": 0}
        assert replies[1] == {"type": "published", "topic": TOPIC, "msgRef": 1}
        assert error_of(replies[2]) == {"type": "error", "error": "monthly_quota_exceeded", "code": 42920,
                                        "topic": TOPIC, "msgRef": 2}
        await quota.close()

    run(scenario())


# -- load balancing, QoS, replay --------------------------------------------------------------

def test_load_balance_group_across_gateways_gets_each_message_once(nolag):
    topic = "jobs/pool/tasks"

    async def scenario():
        workers = [await Client.open(nolag.urls[i], nolag.token()) for i in (0, 1)]
        for worker in workers:
            assert await worker.subscribe(topic, qos=0, loadBalance=True, loadBalanceGroup="worker-pool-1") == {
                "type": "subscribed", "topic": topic, "loadBalance": True}
        plain = await Client.open(nolag.urls[1], nolag.token())
        await plain.subscribe(topic, qos=0)
        sender = await Client.open(nolag.urls[0], nolag.token())
        await sender.subscribe(topic, qos=0)
        count = 40
        for n in range(count):
            await sender.publish(topic, n, qos=0, echo=False)
        assert [(await plain.recv())["data"] for _ in range(count)] == list(range(count))
        await sender.publish(topic, "end", qos=0, echo=False)
        assert (await plain.recv())["data"] == "end"
        total = count + 1
        shares: list[list] = [[], []]
        complete = asyncio.Event()

        async def read(index: int) -> None:
            while True:
                shares[index].append((await workers[index].recv())["data"])
                if sum(len(share) for share in shares) >= total:
                    complete.set()
                    return

        readers = [asyncio.ensure_future(read(index)) for index in (0, 1)]
        await asyncio.wait_for(complete.wait(), 10)
        for reader in readers:
            reader.cancel()
        everything = sorted(x for share in shares for x in share if x != "end")
        assert everything == list(range(count))  # each message exactly once across the group
        assert [x for share in shares for x in share].count("end") == 1
        assert all(abs(len(share) - (count + 1) / 2) <= 1 for share in shares)  # fair rotation
        for client in (*workers, plain, sender):
            await client.close()

    run(scenario())


def test_qos1_redelivered_until_acked(nolag):
    topic = "chat/qos/one"

    async def scenario():
        sub = await Client.open(nolag.urls[0], nolag.token())
        pub = await Client.open(nolag.urls[1], nolag.token())
        await sub.subscribe(topic, qos=1)
        await pub.subscribe(topic, qos=0)
        await opt_in_to_acks(sub, pub, topic)
        await pub.publish(topic, "important", qos=1, echo=False)
        first = await sub.recv()
        assert first["requiresAck"] is True and first["msgId"] and "isReplay" not in first
        again = await sub.recv(timeout=5)  # no ack: sent again after ack_timeout_s
        assert again == first
        await sub.send({"type": "ack", "msgId": first["msgId"]})
        await pub.publish(topic, "second", qos=1, echo=False)
        second = await sub.recv()
        assert second["data"] == "second"
        await sub.send({"type": "batchAck", "msgIds": [second["msgId"]]})
        await sub.quiet()
        for client in (sub, pub):
            await client.close()

    run(scenario())


def test_a_burst_acked_in_order_is_not_sent_again_and_only_the_message_left_out_is(nolag):
    """A burst of QoS 1 messages reaches two subscribers of one gateway as a run (each window keeps
    it as one shared piece, and a batchAck of its next ids in order is read as bytes). One acks in
    order, then all but one: exactly that one comes again, and nothing after its ack; the other
    acks everything at once and gets nothing again."""
    topic = "chat/qos/burst"
    count = 40

    async def scenario():
        sub = await Client.open(nolag.urls[0], nolag.token())
        other = await Client.open(nolag.urls[0], nolag.token())
        pub = await Client.open(nolag.urls[1], nolag.token(rate_limit_per_s=10_000))
        for client in (sub, other):
            await client.subscribe(topic, qos=1)
        await pub.subscribe(topic, qos=0)
        await opt_in_to_acks(sub, pub, topic)
        first = await other.recv()
        await other.send({"type": "ack", "msgId": first["msgId"]})
        before = (await asyncio.to_thread(_nolag_stats, nolag, 0))["acked_as_bytes"]
        burst = await _publish_burst(nolag.urls[1], nolag.token(rate_limit_per_s=10_000), topic, list(range(count)))
        got = [await sub.recv() for _ in range(count)]
        assert [m["data"] for m in got] == list(range(count))
        ids = [m["msgId"] for m in got]
        await sub.send({"type": "batchAck", "msgIds": ids[:25]})  # in order: read as bytes
        await sub.send({"type": "batchAck", "msgIds": ids[25:30] + ids[31:]})  # one left out: decoded
        assert [await other.recv() for _ in range(count)] == got
        await other.send({"type": "batchAck", "msgIds": ids})
        again = await sub.recv(timeout=5)  # after ack_timeout_s, the oldest unacked first
        assert again == got[30]
        await sub.send({"type": "ack", "msgId": ids[30]})
        await pub.publish(topic, "last", qos=1, echo=False)
        for client in (sub, other):
            last = await client.recv()
            assert last["data"] == "last"
            # not acked: the next frame is it again, and no earlier message comes before it
            assert await client.recv(timeout=5) == last
            await client.send({"type": "ack", "msgId": last["msgId"]})
        # the burst was a run in both windows: the two batchAcks in order were read as bytes
        assert (await asyncio.to_thread(_nolag_stats, nolag, 0))["acked_as_bytes"] == before + 2
        burst.close()
        for client in (sub, other, pub):
            await client.close()

    run(scenario())


async def _publish_burst(url: str, token: str, topic: str, values: list) -> asyncio.StreamWriter:
    """QoS 1 publishes of ``values`` in one write on a raw socket (a client library writes each
    frame apart): the gateway reads them at once and the topic shard takes them as one batch."""
    address = urlsplit(url)
    reader, writer = await open_raw_websocket(address.port, address.path)

    def frame(message: dict) -> bytes:
        return client_frame(Opcode.BINARY, msgpack.packb(message))

    async def reply() -> dict:
        while not (body := (await read_server_frame(reader))[1]):
            pass  # a heartbeat
        return msgpack.unpackb(body)

    writer.write(frame({"type": "auth", "token": token}))
    assert (await reply())["success"] is True
    writer.write(frame({"type": "subscribe", "topic": topic, "qos": 0}))
    assert (await reply())["type"] == "subscribed"
    writer.write(b"".join(frame({"type": "publish", "topic": topic, "data": value, "qos": 1, "echo": False})
                          for value in values))
    await writer.drain()
    return writer


def test_acks_of_outstanding_messages_are_not_rate_limited_but_other_frames_are(nolag):
    """Before: every frame took a token of the connection's rate limit (50 a second), acks too, so a
    subscriber acking each message of a topic that carries more than 50 a second got 42910 errors
    and its acks were dropped: the messages came again."""
    topic = "chat/qos/busy"
    count = 150

    async def scenario():
        sub = await Client.open(nolag.urls[0], nolag.token())  # the default rate: 50 a second
        pub = await Client.open(nolag.urls[1], nolag.token(rate_limit_per_s=10_000))
        await sub.subscribe(topic, qos=1)
        await pub.subscribe(topic, qos=0)
        for n in range(count):
            await pub.publish(topic, n, qos=1, echo=False)
        seen: set[int] = set()
        while len(seen) < count:
            frame = await sub.recv()
            assert frame["type"] == "message", frame  # no rate_limit_exceeded for an ack
            seen.add(frame["data"])
            await sub.send({"type": "ack", "msgId": frame["msgId"]})
        await sub.send({"type": "getPresence", "roomId": "__acked__"})
        while (frame := await sub.recv())["type"] == "message":
            assert frame["data"] in seen  # a redelivery whose ack crossed it: QoS 1 allows it
        assert frame["type"] == "presenceList" and frame["roomId"] == "__acked__", frame

        # An ack of nothing the connection has outstanding is a frame like any other: limited.
        for n in range(80):
            await sub.send({"type": "ack", "msgId": f"never-sent-{n}"})
        while (frame := await sub.recv())["type"] == "message":
            pass
        assert error_of(frame) == {"type": "error", "error": "rate_limit_exceeded", "code": 42910}
        for client in (sub, pub):
            await client.close()

    run(scenario())


def test_reconnect_restores_subscriptions_and_replays_with_live_traffic_after(nolag):
    topic = "chat/replay/messages"

    async def scenario():
        token = nolag.token()
        sub = await Client.open(nolag.urls[0], token)
        await sub.subscribe(topic, qos=1)
        pub = await Client.open(nolag.urls[1], nolag.token())
        await pub.subscribe(topic, qos=0)
        await opt_in_to_acks(sub, pub, topic)
        await pub.publish(topic, "unacked", qos=1, echo=False, msgRef="u")
        assert (await pub.recv())["type"] == "published"
        dropped = await sub.recv()
        assert dropped["data"] == "unacked"
        await sub.ws.close()  # gone without an ack
        for n in range(5):
            await pub.publish(topic, f"missed {n}", qos=1, echo=False, msgRef=n)
            assert (await pub.recv())["type"] == "published"
        back = await Client.open(nolag.urls[1], None)
        await back.send({"type": "auth", "token": token, "reconnect": True})
        live = asyncio.ensure_future(_publish_live(pub, topic))
        auth = await back.recv()
        assert auth["success"] is True and auth["restoredSubscriptions"] == [topic]
        start = await back.expect("replayStart")
        count = start["count"]  # 6, plus live messages already in the log when the replay was read
        assert 6 <= count <= 9
        replayed = [await back.recv() for _ in range(count)]
        assert [m["data"] for m in replayed[:6]] == ["unacked"] + [f"missed {n}" for n in range(5)]
        assert all(m["isReplay"] is True and m["requiresAck"] is True for m in replayed)
        assert replayed[0]["msgId"] == dropped["msgId"]
        assert await back.recv() == {"type": "replayEnd", "replayed": count}
        await live
        after = [await back.recv() for _ in range(9 - count)]
        assert all("isReplay" not in m for m in after)
        # every live message exactly once: in the replay or after it, in publish order
        assert [m["data"] for m in replayed[6:] + after] == ["live 0", "live 1", "live 2"]
        await back.send({"type": "batchAck", "msgIds": [m["msgId"] for m in replayed + after]})
        await back.quiet()
        for client in (back, pub):
            await client.close()

    run(scenario())


async def opt_in_to_acks(sub: Client, pub: Client, topic: str) -> None:
    """The subscriber acknowledges one message: from then on its unacked messages are redelivered."""
    await pub.publish(topic, "first", qos=1, echo=False)
    first = await sub.recv()
    assert first["data"] == "first" and first["requiresAck"] is True
    await sub.send({"type": "ack", "msgId": first["msgId"]})


async def _publish_live(pub: Client, topic: str) -> None:
    for n in range(3):
        await pub.publish(topic, f"live {n}", qos=1, echo=False, msgRef=f"l{n}")
        assert (await pub.recv())["type"] == "published"


def test_an_unsubscribe_sent_before_the_subscribe_is_answered_wins_and_the_replies_keep_their_order(nolag):
    """Both requests sent back to back, so the unsubscribe is handled before the topic shard answers
    the subscribe. Before: `unsubscribed` came first and `subscribed` after it, and the late answer
    saved the subscription again on the session shard, so a reconnect restored a topic the client
    had left."""
    topic = "chat/quick/leave"

    async def scenario():
        token = nolag.token()
        client = await Client.open(nolag.urls[0], token)
        await client.send({"type": "subscribe", "topic": topic, "qos": 1})
        await client.send({"type": "unsubscribe", "topic": topic})
        assert await client.recv() == {"type": "subscribed", "topic": topic, "loadBalance": False}
        assert await client.recv() == {"type": "unsubscribed", "topic": topic}
        pub = await Client.open(nolag.urls[1], nolag.token())
        await pub.subscribe(topic, qos=0)
        await pub.publish(topic, "after it left", qos=1, echo=False, msgRef=1)
        assert await pub.recv() == {"type": "published", "topic": topic, "msgRef": 1}
        await client.send({"type": "unsubscribe", "topic": topic})  # not subscribed: nothing came meanwhile
        reply = await client.recv()
        assert (reply["type"], reply["error"], reply["topic"]) == ("error", "not_subscribed", topic), reply
        await client.ws.close()
        back = await Client.open(nolag.urls[1], token, reconnect=True)
        assert back.auth["restoredSubscriptions"] == []
        await back.quiet()
        for each in (back, pub):
            await each.close()

    run(scenario())


def test_qos2_is_never_duplicated_across_reconnects(nolag):
    topic = "chat/qos/two"

    async def scenario():
        token = nolag.token()
        sub = await Client.open(nolag.urls[0], token)
        await sub.subscribe(topic, qos=2)
        pub = await Client.open(nolag.urls[1], nolag.token())
        await pub.subscribe(topic, qos=0)
        await pub.publish(topic, "once", qos=2, echo=False, msgRef=1)
        await pub.expect("published")
        first = await sub.recv()
        assert first["data"] == "once" and first["requiresAck"] is True
        await pub.publish(topic, "marker", qos=0, echo=False)  # unlogged: later than any resend
        assert (await sub.recv())["data"] == "marker"  # no timer resend in between (qos 2)
        await sub.ws.close()  # never acked
        await pub.publish(topic, "while away", qos=2, echo=False, msgRef=2)
        await pub.expect("published")
        back = await Client.open(nolag.urls[1])
        await back.send({"type": "auth", "token": token, "reconnect": True})
        assert (await back.recv())["restoredSubscriptions"] == [topic]
        assert (await back.expect("replayStart"))["count"] == 1  # the log has both, but "once" was had
        replayed = await back.recv()
        assert replayed["data"] == "while away" and replayed["isReplay"] is True
        assert await back.recv() == {"type": "replayEnd", "replayed": 1}
        await back.send({"type": "ack", "msgId": replayed["msgId"]})
        await back.quiet()
        for client in (back, pub):
            await client.close()

    run(scenario())


# -- presence, lobbies, hydration -------------------------------------------------------------

def test_presence_join_update_leave_and_list(nolag):
    async def scenario():
        watcher = await Client.open(nolag.urls[0], nolag.token())
        await watcher.subscribe("chat/lounge/messages", qos=0)
        token = nolag.token()
        actor = f"actor_{token.split('_', 2)[2].split('.')[0]}"
        member = await Client.open(nolag.urls[1], token)
        await member.send({"type": "presence", "roomId": "lounge", "data": {"status": "online"}})
        join, update = await watcher.recv(), await watcher.recv()
        assert (join["type"], join["event"], join["roomId"]) == ("presence", "join", "lounge")
        data = join["data"]
        assert data["actorTokenId"] == data["actor_token_id"] == actor and data["presence"] == {"status": "online"}
        assert update["event"] == "update"
        await member.send({"type": "presence", "roomId": "lounge", "data": {"status": "away"}})
        assert (await watcher.recv())["data"]["presence"] == {"status": "away"}
        await watcher.send({"type": "getPresence", "roomId": "lounge"})
        listed = await watcher.recv()
        assert listed["type"] == "presenceList" and listed["roomId"] == "lounge"
        assert [(e["actorTokenId"], e["presence"]) for e in listed["data"]] == [(actor, {"status": "away"})]
        await member.close()
        leave = await watcher.recv()
        assert (leave["event"], leave["data"]["actorTokenId"]) == ("leave", actor)
        await watcher.close()

    run(scenario())


def test_lobbies_snapshot_and_updates(nolag):
    async def scenario():
        driver = await Client.open(nolag.urls[0], nolag.token())
        driver_actor = driver.auth["actorTokenId"]
        await driver.send({"type": "presence", "roomId": "trip-7", "data": {"status": "driving"}})
        await driver.expect("presence")  # its own join
        await driver.expect("presence")  # and update
        dispatcher = await Client.open(nolag.urls[1], nolag.token())
        await dispatcher.send({"type": "lobbySubscribe", "lobbyId": "trips"})
        snapshot = await dispatcher.recv()
        assert snapshot == {"type": "lobbySubscribed", "lobbyId": "trips",
                            "presence": {"trip-7": {driver_actor: {"status": "driving"}}}}
        await driver.send({"type": "presence", "roomId": "trip-7", "data": {"status": "arrived"}})
        change = await dispatcher.recv()
        assert {k: change[k] for k in ("type", "event", "lobbyId", "roomId", "actorId", "data")} == {
            "type": "lobbyPresence", "event": "update", "lobbyId": "trips", "roomId": "trip-7",
            "actorId": driver_actor, "data": {"status": "arrived"}}
        await driver.send({"type": "presence", "roomId": "elsewhere", "data": {"status": "x"}})
        await dispatcher.send({"type": "lobbyUnsubscribe", "lobbyId": "trips"})
        assert await dispatcher.recv() == {"type": "lobbyUnsubscribed", "lobbyId": "trips"}
        await dispatcher.send({"type": "lobbySubscribe", "lobbyId": "nope"})
        assert (await dispatcher.recv())["error"] == "unknown_lobby"
        for client in (driver, dispatcher):
            await client.close()

    run(scenario())


def test_hydration_webhook(nolag):
    async def scenario():
        client = await Client.open(nolag.urls[0], nolag.token())
        await client.subscribe("hyd/room9/feed", qos=0)
        hydration = await client.recv()
        assert hydration == {"type": "hydration", "topic": "hyd/room9/feed",
                             "data": {"recentMessages": [{"text": "earlier", "room": "room9"}]}}
        assert nolag.webhook.requests[-1] == {"actorId": client.auth["actorTokenId"], "roomName": "room9",
                                              "topicName": "feed", "scope": "hyd"}
        await client.subscribe("chat/nohyd/feed", qos=0)
        await client.quiet()  # no webhook for that topic
        await client.close()

    run(scenario())


# -- the real SDK: nolag 2.6.0 ------------------------------------------------------------------

def test_nolag_sdk_connects_publishes_receives_and_reconnects(nolag):
    import ray
    from nolag import NoLag, NoLagOptions

    topic = "sdk/lounge/chat"

    async def scenario():
        sdk = NoLag(nolag.token(), NoLagOptions(url=nolag.urls[0], reconnect_interval=0.2, heartbeat_interval=1))
        await sdk.connect()
        assert sdk.connected and sdk.actor_id.startswith("actor_") and sdk.protocol_version == 2
        received: list = []
        sdk.on(topic, lambda data, meta: received.append((data, meta.is_replay if hasattr(meta, "is_replay") else None)))
        await sdk.subscribe(topic)
        published = asyncio.get_running_loop().create_future()
        await sdk.emit(topic, {"text": "from the sdk"}, callback=lambda error: published.set_result(error))
        assert await asyncio.wait_for(published, 10) is None  # `published {topic, msgRef}` settled it
        await eventually(lambda: _value(len(received) == 1))
        assert received[0][0] == {"text": "from the sdk"}

        other = await Client.open(nolag.urls[1], nolag.token())
        await other.subscribe(topic, qos=0)
        await other.publish(topic, {"text": "from a raw client"}, qos=1, echo=False)
        await eventually(lambda: _value(len(received) == 2))
        assert received[1][0] == {"text": "from a raw client"}

        reconnects: list = []
        sdk.on("reconnect", lambda *args: reconnects.append(args))
        sdk.on("connect", lambda *args: reconnects.append(("connect",)))
        # The router drops the SDK's socket; the SDK reconnects with reconnect:true and the router
        # restores its subscription (the SDK does not subscribe again itself).
        # (1012 "service restart": the SDK reconnects on any close but a normal 1000/1001 one)
        dropped = sum(ray.get([g.actor.close_connections.remote("nolag", 1012, "maintenance")
                               for g in nolag.running.router.gateways]))
        assert dropped >= 2
        await eventually(lambda: _value(bool(reconnects) and sdk.connected), timeout=20)
        other = await Client.open(nolag.urls[1], nolag.token())
        await other.subscribe(topic, qos=0)
        await other.publish(topic, {"text": "after the reconnect"}, qos=1, echo=False)
        await eventually(lambda: _value(any(d == {"text": "after the reconnect"} for d, _ in received)), timeout=20)
        sdk.disconnect()
        await other.close()

    run(scenario(), timeout=90)


def test_nolag_sdk_present_clients_see_each_others_presence(nolag):
    """Two SDK clients that only set presence in a room (no subscription there): each sees the
    other's ``presence:join``. Before, only a room's subscribers got its presence events, so A saw
    its own join and update and never B's."""
    from nolag import NoLag, NoLagOptions

    async def scenario():
        clients = [NoLag(nolag.token(), NoLagOptions(url=nolag.urls[i], reconnect=False)) for i in (0, 1)]
        events: list[list] = [[], []]
        for client, seen in zip(clients, events):
            await client.connect()
            for event in ("join", "update", "leave"):
                client.on(f"presence:{event}", lambda actor, event=event, seen=seen: seen.append(
                    (event, actor.actor_token_id, actor.presence)))
        a, b = clients
        await a.set_app("sdk").set_room("porch").set_presence({"name": "a"})
        await eventually(lambda: _value(len(events[0]) == 2))
        await b.set_app("sdk").set_room("porch").set_presence({"name": "b"})
        await eventually(lambda: _value(len(events[0]) == 4 and len(events[1]) == 2))
        assert events[0] == [("join", a.actor_id, {"name": "a"}), ("update", a.actor_id, {"name": "a"}),
                             ("join", b.actor_id, {"name": "b"}), ("update", b.actor_id, {"name": "b"})]
        assert events[1] == [("join", b.actor_id, {"name": "b"}), ("update", b.actor_id, {"name": "b"})]
        await a.set_app("sdk").set_room("porch").set_presence({"name": "a2"})
        await eventually(lambda: _value(len(events[1]) == 3))
        assert events[1][2] == ("update", a.actor_id, {"name": "a2"})
        b.disconnect()
        await eventually(lambda: _value(len(events[0]) == 6))
        assert events[0][4:] == [("update", a.actor_id, {"name": "a2"}), ("leave", b.actor_id, {"name": "b"})]
        a.disconnect()

    run(scenario(), timeout=60)


def test_oversized_frame_error_carries_topic_and_msg_ref(nolag):
    """A publish far above the limit is refused before its data is decoded, and its 42930 still
    carries the request's ``topic`` and ``msgRef`` (read from the frame, the data skipped), so the
    SDK can fail that publish."""
    async def scenario():
        client = await Client.open(nolag.urls[0], nolag.token())
        await client.subscribe(TOPIC, qos=0)
        # msgRef after data, as the SDK packs it: the peek has to skip the data to find it
        await client.send({"type": "publish", "topic": TOPIC, "data": {"blob": "x" * 20_000}, "qos": 0,
                           "echo": False, "msgRef": "big"})
        assert error_of(await client.recv()) == {"type": "error", "error": "message_too_large", "code": 42930,
                                                 "topic": TOPIC, "msgRef": "big", "maxSizeBytes": 4096}
        await client.send({"type": "publish", "data": [1] * 20_000, "msgRef": 7, "topic": TOPIC})
        assert error_of(await client.recv()) == {"type": "error", "error": "message_too_large", "code": 42930,
                                                 "topic": TOPIC, "msgRef": 7, "maxSizeBytes": 4096}
        # not a map, or nothing to echo: the error alone
        await client.ws.send(msgpack.packb(["x" * 20_000]))
        assert error_of(await client.recv()) == {"type": "error", "error": "message_too_large", "code": 42930,
                                                 "maxSizeBytes": 4096}
        await client.publish(TOPIC, "still served", qos=0, echo=False, msgRef="after")
        assert await client.recv() == {"type": "published", "topic": TOPIC, "msgRef": "after"}
        await client.close()

    run(scenario())


# -- QoS 1 is at least once: nothing unacked is skipped; the SDK (never acks) gets nothing twice -------

def _nolag_stats(nolag, index: int) -> dict:
    return ray.get(nolag.running.router.gateways[index].actor.stats.remote(), timeout=30)["dialects"]["nolag"]


def test_qos1_messages_unacked_then_given_up_are_replayed_after_a_reconnect(nolag):
    """A client that acks only later: its first messages wait from their first write, are
    redelivered once it acks, given up after max_attempts (3 sends) — and still replayed from the
    log when it comes back. Before, a given-up message left the window and the resume skipped it."""
    topic = "chat/atleast/given-up"

    async def scenario():
        token = nolag.token()
        sub = await Client.open(nolag.urls[0], token)
        await sub.subscribe(topic, qos=1)
        pub = await Client.open(nolag.urls[1], nolag.token())
        await pub.subscribe(topic, qos=0)
        for n in (1, 2, 3):
            await pub.publish(topic, f"m{n}", qos=1, echo=False, msgRef=n)
            assert await pub.recv() == {"type": "published", "topic": topic, "msgRef": n}
        first = [await sub.expect("message") for _ in range(3)]
        assert [m["data"] for m in first] == ["m1", "m2", "m3"] and all(m["requiresAck"] for m in first)
        await sub.send({"type": "ack", "msgId": first[2]["msgId"]})  # it acks, but only the third one
        again = [await sub.expect("message") for _ in range(4)]  # sends 2 and 3 of m1 and m2
        assert sorted(m["data"] for m in again) == ["m1", "m1", "m2", "m2"]
        await eventually(lambda: asyncio.to_thread(lambda: _nolag_stats(nolag, 0)["unacked"] == 0), timeout=10)
        await sub.close()  # given up, never acked

        back = await Client.open(nolag.urls[1])
        await back.send({"type": "auth", "token": token, "reconnect": True})
        assert (await back.expect("auth"))["restoredSubscriptions"] == [topic]
        start = await back.expect("replayStart")
        replayed = [await back.recv() for _ in range(start["count"])]
        assert await back.recv() == {"type": "replayEnd", "replayed": start["count"]}
        # from just before the oldest unacked message: m1, m2 (and m3 again: at least once)
        assert [m["data"] for m in replayed] == ["m1", "m2", "m3"]
        assert [m["msgId"] for m in replayed[:2]] == [m["msgId"] for m in first[:2]]
        assert all(m["isReplay"] is True and m["requiresAck"] is True for m in replayed)
        await back.send({"type": "batchAck", "msgIds": [m["msgId"] for m in replayed]})
        await back.quiet()
        for client in (back, pub):
            await client.close()

    run(scenario())


def test_qos1_first_messages_of_a_client_that_left_before_its_first_ack_come_once_it_acks(nolag):
    """A spec-following client that had acked nothing yet when its connection dropped: the
    reconnect replays nothing twice at first (it might be the SDK, which never acks), and as soon
    as the new connection acks, what the old one left unacked is replayed from the log."""
    topic = "chat/atleast/first"

    async def scenario():
        token = nolag.token()
        sub = await Client.open(nolag.urls[0], token)
        await sub.subscribe(topic, qos=1)
        pub = await Client.open(nolag.urls[1], nolag.token())
        await pub.subscribe(topic, qos=0)
        for n in (1, 2):
            await pub.publish(topic, f"f{n}", qos=1, echo=False, msgRef=n)
            assert await pub.recv() == {"type": "published", "topic": topic, "msgRef": n}
        first = [await sub.expect("message") for _ in range(2)]
        await sub.close()  # before it acked anything

        back = await Client.open(nolag.urls[1])
        await back.send({"type": "auth", "token": token, "reconnect": True})
        assert (await back.expect("auth"))["restoredSubscriptions"] == [topic]
        await back.quiet()  # no replay yet
        await pub.publish(topic, "f3", qos=1, echo=False, msgRef=3)
        assert await pub.recv() == {"type": "published", "topic": topic, "msgRef": 3}
        live = await back.expect("message")
        assert live["data"] == "f3" and "isReplay" not in live
        await back.send({"type": "ack", "msgId": live["msgId"]})
        start = await back.expect("replayStart")
        assert start["count"] == 2
        replayed = [await back.recv() for _ in range(2)]
        assert [(m["data"], m["msgId"], m["isReplay"]) for m in replayed] == [
            (m["data"], m["msgId"], True) for m in first]
        assert await back.recv() == {"type": "replayEnd", "replayed": 2}
        await back.send({"type": "batchAck", "msgIds": [m["msgId"] for m in replayed]})
        await back.quiet()
        for client in (back, pub):
            await client.close()

    run(scenario())


def test_nolag_sdk_never_acks_and_gets_no_duplicates_across_a_reconnect(nolag):
    from nolag import NoLag, NoLagOptions

    topic = "sdk/atleast/nodup"

    async def scenario():
        sdk = NoLag(nolag.token(), NoLagOptions(url=nolag.urls[0], reconnect_interval=0.2, heartbeat_interval=1))
        await sdk.connect()
        received: list = []
        sdk.on(topic, lambda data, meta: received.append((data, bool(meta.is_replay))))
        await sdk.subscribe(topic)
        pub = await Client.open(nolag.urls[1], nolag.token())
        await pub.subscribe(topic, qos=0)
        for n in (1, 2):
            await pub.publish(topic, f"s{n}", qos=1, echo=False, msgRef=n)
            assert await pub.recv() == {"type": "published", "topic": topic, "msgRef": n}
        await eventually(lambda: _value(len(received) == 2))
        reconnects: list = []
        sdk.on("reconnect", lambda *args: reconnects.append(args))
        dropped = await asyncio.to_thread(
            lambda: ray.get(nolag.running.router.gateways[0].actor.close_connections.remote("nolag", 1012, "x")))
        assert dropped >= 1
        await eventually(lambda: _value(bool(reconnects) and sdk.connected), timeout=20)
        await pub.publish(topic, "s3", qos=1, echo=False, msgRef=3)
        assert await pub.recv() == {"type": "published", "topic": topic, "msgRef": 3}
        await eventually(lambda: _value(len(received) == 3))
        # longer than max_attempts x ack_timeout_s: any redelivery would have come by now
        await asyncio.sleep(3 * 0.5 + 0.5)
        await pub.publish(topic, "marker", qos=0, echo=False, msgRef=4)
        assert await pub.recv() == {"type": "published", "topic": topic, "msgRef": 4}
        await eventually(lambda: _value(len(received) == 4))
        assert received == [("s1", False), ("s2", False), ("s3", False), ("marker", False)]
        sdk.disconnect()
        await pub.close()

    run(scenario(), timeout=60)
