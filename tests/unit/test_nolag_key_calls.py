"""The NoLag gateway reads its key store off the event loop (``NolagDialect.key_store``): the
frames a connection sends while one of them waits for the store are handled after it, in order,
and the sessions of a key on one gateway share one quota reservation. Over the real store of
``store_settings`` (SQLite and PostgreSQL) and real shards called in-process (no Ray): the
gateway's shard client is replaced by one that runs each command on them at once.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import msgpack

from actors.nolag import contract as nolag
from actors.nolag.keys import month_of, open_key_store
from actors.nolag.shard import NolagActors, NolagTopics
from actors.pubsub import PubSub
from actors.shard import Shard
from gateways.nolag.session import MAX_WAITING_BYTES, NolagDialect
from router import contract
from router.errors import ShardUnavailable
from router.settings import load_settings
from router.shardmap import SESSION, TOPIC

TOPIC_NAME = "chat/room/quota"


class Shards:
    """The shard client's interface, answering each command from one shard per kind, at once."""

    def __init__(self, settings: Any) -> None:
        self.settings = settings
        self.shards: dict[str, Shard] = {}

    def shard(self, kind: str) -> Shard:
        if kind not in self.shards:  # built on first use, as Ray starts them
            components = (NolagActors,) if kind == SESSION else (PubSub, NolagTopics)
            self.shards[kind] = Shard(kind, 0, self.settings, components)
        return self.shards[kind]

    def view(self, timeout_s: float) -> "Shards":
        return self

    def link(self, kind: str, key: str) -> str:
        return kind

    def all(self, kind: str) -> list[str]:
        return [kind]

    def send(self, link: str, command: tuple, callback: Any = None) -> None:
        results, _ = self.shard(link).handle("gw", [command])
        if callback is not None:
            callback(results[0])

    def send_each(self, requests: list[tuple[str, tuple]], on_results: Any) -> None:
        on_results([self.shard(link).handle("gw", [command])[0][0] for link, command in requests])

    def send_all(self, links: list[str], command: tuple, on_results: Any) -> None:
        self.send_each([(link, command) for link in links], on_results)


class Gateway:
    def __init__(self, settings: Any) -> None:
        self.settings = settings
        self.shards = Shards(settings)
        self._seq = itertools.count()

    def event_meta(self, dialect: str, kind: str | None = None, topic: str | None = None) -> tuple:
        return contract.event_meta("gw", next(self._seq), time.time_ns(), dialect, kind, topic)

    def accepted(self, *args: Any) -> None:
        pass

    def rejected(self, *args: Any) -> None:
        pass

    def account_delivery(self, *args: Any) -> None:
        pass


class Wire:
    ids = itertools.count(1)

    def __init__(self) -> None:
        self.id = next(self.ids)
        self.remote, self.path, self.query, self.dropped, self.flushes = "127.0.0.1", "/ws", "", 0, 0
        self.last_activity = time.monotonic()
        self.frames: list[Any] = []  # decoded maps; b"" for a heartbeat
        self.closed: tuple[int, str] | None = None

    def send_binary(self, payload: bytes) -> bool:
        self.frames.append(msgpack.unpackb(payload) if payload else b"")
        return True

    def close(self, code: int = 1000, reason: str = "") -> None:
        self.closed = (code, reason)


def settings_of(store_settings: Any) -> Any:
    url = store_settings.store.postgres
    return load_settings(data_dir=store_settings.data_dir, metrics={"enabled": False},
                         store={} if url is None else {"url": url})


def frame(**fields: Any) -> bytes:
    return msgpack.packb(fields)


async def until(condition: Any, timeout: float = 10, show: Any = None) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out: {show() if show else ''}"
        await asyncio.sleep(0.002)


def replies(wire: Wire) -> list[Any]:
    """The frames without the error hints (texts for people)."""
    return [{k: v for k, v in f.items() if k != "hint"} if isinstance(f, dict) else f for f in wire.frames]


def test_frames_sent_behind_an_auth_wait_for_the_key_and_keep_their_order(store_settings):
    settings = settings_of(store_settings)
    keys = open_key_store(settings)
    token, record = keys.create("p")

    async def scenario():
        dialect = NolagDialect(Gateway(settings), settings.nolag)
        wire = Wire()
        session = dialect.open_session(wire, [])
        for data in (frame(type="auth", token=token), frame(type="subscribe", topic=TOPIC_NAME), b"",
                     frame(type="publish", topic=TOPIC_NAME, data=1, msgRef="r", echo=False),
                     frame(type="auth", token=token)):
            session.on_message(data, False)  # one loop turn: the key is not read yet
        assert wire.frames == [] and session.waiting is not None and len(session.waiting) == 4
        await until(lambda: len(wire.frames) == 5, show=lambda: wire.frames)
        assert replies(wire) == [
            {"type": "auth", "success": True, "actorTokenId": f"actor_{record.key_id}", "projectId": "p",
             "protocolVersion": 1, "restoredSubscriptions": []},
            {"type": "subscribed", "topic": TOPIC_NAME, "loadBalance": False},
            b"",  # the heartbeat, echoed: it came after the auth
            {"type": "published", "topic": TOPIC_NAME, "msgRef": "r"},
            {"type": "error", "error": "already_authenticated"},
        ]
        assert session.waiting is None
        session.release()
        await dialect.close()

    asyncio.run(asyncio.wait_for(scenario(), 30))
    keys.close()


def test_the_sessions_of_a_key_share_reservations_and_never_pass_the_quota(store_settings):
    """Two connections of one key publish 100 messages each in one loop turn; the quota is 150
    (a block of 100, then the last 50): exactly 150 are published, every frame is answered in the
    order it was sent, and the store counted exactly the quota."""
    settings = settings_of(store_settings)
    keys = open_key_store(settings)
    token, record = keys.create("p", rate_limit_per_s=1_000_000, monthly_quota=150)

    async def scenario():
        dialect = NolagDialect(Gateway(settings), settings.nolag)
        wires = [Wire(), Wire()]
        sessions = [dialect.open_session(wire, []) for wire in wires]
        for session in sessions:
            session.on_message(frame(type="auth", token=token), False)
            session.on_message(frame(type="subscribe", topic=TOPIC_NAME, qos=0), False)
        await until(lambda: all(len(wire.frames) == 2 for wire in wires))
        for wire in wires:
            wire.frames.clear()
        for n in range(100):
            for session in sessions:
                session.on_message(frame(type="publish", topic=TOPIC_NAME, data=n, msgRef=n, echo=False), False)
        await until(lambda: all(len(wire.frames) == 100 for wire in wires))
        answered = [[(f["msgRef"], f["type"] if f["type"] == "published" else f["error"]) for f in wire.frames]
                    for wire in wires]
        for frames in answered:
            assert [ref for ref, _ in frames] == list(range(100))  # in the order sent
            outcomes = [outcome for _, outcome in frames]
            granted = outcomes.count("published")
            assert outcomes == ["published"] * granted + ["monthly_quota_exceeded"] * (100 - granted)
        assert sum(outcome == "published" for frames in answered for _, outcome in frames) == 150
        assert keys.usage(record.key_id, month_of(time.time())) == 150
        for session in sessions:
            session.release()
        await dialect.close()

    asyncio.run(asyncio.wait_for(scenario(), 60))
    keys.close()


def test_a_key_store_that_cannot_be_reached_fails_the_auth_and_closes(tmp_path):
    """PostgreSQL down (nothing listens at the URL): the auth is answered ``internal_error`` and
    the connection closed 1011, and the gateway's loop was never blocked meanwhile."""
    settings = load_settings(data_dir=tmp_path, metrics={"enabled": False},
                             store={"url": "postgresql://router@127.0.0.1:9/none", "connect_timeout_s": 1})
    gateway = Gateway(settings)

    async def scenario():
        dialect = NolagDialect(gateway, settings.nolag)
        wire = Wire()
        session = dialect.open_session(wire, [])
        session.on_message(frame(type="auth", token="at_live_0123456789abcdef.secret"), False)
        ticks = 0
        while wire.closed is None:
            await asyncio.sleep(0.01)
            ticks += 1
            assert ticks < 1000, "timed out"
        assert ticks >= 20  # the loop ran while the store was tried for about a second
        assert replies(wire) == [{"type": "auth", "success": False, "error": "internal_error"}]
        assert wire.closed == (1011, "the router could not read the key")
        await dialect.close()

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_frames_waiting_behind_the_key_store_are_bounded_in_bytes_too(tmp_path):
    """Before: at most 1,000 frames waited, whatever their size (up to 1 GiB per connection, with
    no key needed). Past MAX_WAITING_BYTES the connection is closed with 1008."""
    settings = load_settings(data_dir=tmp_path, metrics={"enabled": False})
    token, _ = open_key_store(settings).create("p")

    async def scenario():
        dialect = NolagDialect(Gateway(settings), settings.nolag)
        wire = Wire()
        session = dialect.open_session(wire, [])
        session.on_message(frame(type="auth", token=token), False)
        big = frame(type="publish", topic=TOPIC_NAME, data=b"x" * 200_000, msgRef="r")
        sent = 0
        while wire.closed is None and sent < 100:  # one loop turn: the key is not read yet
            session.on_message(big, False)
            sent += 1
        assert wire.closed == (1008, "too much sent while the key was read")
        assert sent == MAX_WAITING_BYTES // len(big) + 1
        await dialect.close()

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_a_publish_is_answered_by_its_own_outcome_and_only_if_it_has_a_msg_ref(store_settings):
    """A publish with a ``msgRef`` gets ``published`` (for its topic and that ref) or, when its
    topic shard fails it, ``internal_error``; one without a ``msgRef`` gets nothing either way; a
    session closed before the answer gets nothing. The topic's shard key, link and answer head
    are kept on the subscription from its first publish: a second topic has its own."""
    settings = settings_of(store_settings)
    keys = open_key_store(settings)
    token, _ = keys.create("p")
    other = "chat/room/other"

    class FailingShards(Shards):
        fail: set[Any] = set()  # msgRefs whose publish the shard fails
        held: list[Any] = []  # (callback, result) kept back while ``holding``
        holding = False

        def link(self, kind: str, key: str) -> Any:
            return (kind, key)  # the key's own link, so that a link kept for another key shows

        def shard(self, link: Any) -> Shard:
            return super().shard(link[0] if isinstance(link, tuple) else link)

        def send(self, link: str, command: tuple, callback: Any = None) -> None:
            if command[0] == nolag.Op.PUBLISH and (command[2], command[3]) in self.fail:
                result: Any = ShardUnavailable("topic shard unavailable")
            else:
                result = self.shard(link).handle("gw", [command])[0][0]
            if callback is None:
                return
            if self.holding:
                self.held.append((callback, result))
            else:
                callback(result)

    async def scenario():
        gateway = Gateway(settings)
        gateway.shards = shards = FailingShards(settings)
        dialect = NolagDialect(gateway, settings.nolag)
        wire = Wire()
        session = dialect.open_session(wire, [])
        for data in (frame(type="auth", token=token), frame(type="subscribe", topic=TOPIC_NAME),
                     frame(type="subscribe", topic=other)):
            session.on_message(data, False)
        await until(lambda: len(wire.frames) == 3, show=lambda: wire.frames)
        shards.fail = {(TOPIC_NAME, msgpack.packb(2)), (TOPIC_NAME, msgpack.packb(4))}
        for ref, topic in ((1, TOPIC_NAME), (2, TOPIC_NAME), ("r3", other), (None, TOPIC_NAME), (5, other)):
            fields = {"type": "publish", "topic": topic, "data": 4 if ref is None else ref, "echo": False}
            if ref is not None:
                fields["msgRef"] = ref
            session.on_message(msgpack.packb(fields), False)
        assert replies(wire)[3:] == [
            {"type": "published", "topic": TOPIC_NAME, "msgRef": 1},
            {"type": "error", "error": "internal_error"},
            {"type": "published", "topic": other, "msgRef": "r3"},
            {"type": "published", "topic": other, "msgRef": 5},
        ]
        assert [sub.publishing[:2] for sub in (session.subs[TOPIC_NAME], session.subs[other])] == [
            (f"nolag/p/{TOPIC_NAME}", (TOPIC, f"nolag/p/{TOPIC_NAME}")), (f"nolag/p/{other}", (TOPIC, f"nolag/p/{other}"))]
        shards.holding = True
        session.on_message(frame(type="publish", topic=TOPIC_NAME, data=6, msgRef=6, echo=False), False)
        assert len(shards.held) == 1  # the publish's answer, kept back
        session.release()
        for callback, result in shards.held:
            callback(result)
        assert len(wire.frames) == 7  # nothing written after the close
        await dialect.close()

    asyncio.run(asyncio.wait_for(scenario(), 30))
    keys.close()
