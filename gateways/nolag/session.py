"""NoLag: one client connection's state machine, and the dialect that serves ``/ws``.

Order of checks on every frame, before any work: the empty heartbeat, the size (42930), the rate
(42910), decoding, authentication. A publish then passes the quota (42920), the ACL
(``not_authorized``) and the subscription check (``not_subscribed``), as the broker does.
Presence, ``getPresence`` and lobby requests pass the key's subscribe ACL over their rooms
(``not_authorized``): a room's presence is shared by the subscribers of its topics.

Where the state lives:
- topic shards own topics (``nolag/<project>/<topic>``: subscribers with filters, QoS and
  load-balance groups; the message log), rooms (``nolag-room/<project>/<room>``: presence, who is
  in the room) and lobby listeners;
- session shards own each actor's subscriptions, the points to replay from, whether it acks and
  the QoS 2 ids it has had (durable: SQLite), so a client that reconnects (``reconnect: true``)
  gets its subscriptions back and the messages it missed, on any gateway;
- this session holds what is per connection: its QoS window (``gateways/nolag/qos.py``:
  unacked QoS 1/2 messages, redelivered with backoff; the QoS 2 ids written; the replay
  positions), the replay in progress, the rate limiter, its presence per room, and the messages
  held behind a QoS 2 one until the session shard has recorded it (never written twice, even
  after a crash of this gateway).

When a shard restarts empty, :meth:`NolagSession.reannounce` sends it again what this connection
held there (subscriptions with the last message it got, room memberships, presence, lobby
listeners; to a session shard its subscriptions and positions), quietly.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from functools import partial
from typing import Any, Awaitable, Callable, NamedTuple, TypeVar

import aiohttp

from actors.nolag import contract as nolag
from actors.nolag.contract import (LobbyChange, LobbySpec, PresenceChange, SubscriptionRecord, actor_key, room_key,
                                   topic_key)
from gateways.dialect import Dialect, DialectSession, Wire
from gateways.nolag import codec
from gateways.nolag.codec import NolagError
from gateways.nolag.config import NolagConfig
from gateways.nolag.qos import QosWindow, Run, Unacked
from gateways.server import frame_header, joined_frames
from gateways.shardclient import ShardLink
from router import contract
from router.contract import now_ms
from router.errors import CommandError, ShardUnavailable
from router.ids import uuid7
from actors.nolag.keys import KeyRecord, KeyStore, month_of, open_key_store, pattern_matches
from router.ratelimit import TokenBucket
from router.shardmap import SESSION, TOPIC

logger = logging.getLogger(__name__)
_BINARY = 0x2  # the WebSocket opcode NoLag's frames go out with

DIALECT = "nolag"
HEARTBEAT = b""
AUTH_ATTEMPTS = 3  # reading (or resetting) the actor's kept state, before the auth fails
ENVELOPE_ALLOWANCE = 4096  # a frame may exceed the data limit by this much (its other fields)
QUOTA_BLOCK = 100  # messages of a key's monthly quota a gateway reserves at once
# Frames, and their bytes, a connection may send while one of its frames waits for the key store
# (before the key is read, the rate limit does not apply yet); beyond either it is closed (1008).
MAX_WAITING_FRAMES = 1000
MAX_WAITING_BYTES = 4 * 1024 * 1024
# A session's ``live`` while a live message may not be written to it at once (never written to).
_NOT_LIVE: dict = {}

T = TypeVar("T")


def room_of(topic: str) -> str:
    """``app/room/topic`` → ``room``: presence rooms are the middle segment of topic slugs."""
    return topic.split("/")[1]


def _index(index: dict[str, dict[int, "_Subscription"]], topic: str, connection_id: int,
           sub: "_Subscription") -> None:
    subs = index.get(topic)
    if subs is None:
        subs = index[topic] = {}
    subs[connection_id] = sub


def _unindex(index: dict[str, dict[int, "_Subscription"]], topic: str, connection_id: int) -> None:
    subs = index.get(topic)
    if subs is not None:
        subs.pop(connection_id, None)
        if not subs:
            del index[topic]


class NolagDialect(Dialect):
    name = DIALECT

    def __init__(self, gateway: Any, config: NolagConfig) -> None:
        super().__init__(gateway)
        self.config = config
        self.limits = codec.Limits(max_topic_length=config.max_topic_length, max_filters=config.max_filters)
        self._keys: KeyStore | None = None
        self._keys_lock = threading.Lock()
        self._allowance: dict[str, int] = {}  # key id -> messages reserved from its monthly quota
        self._reserving: dict[str, asyncio.Future] = {}  # key id -> the reservation out for it
        self._poller: asyncio.Task | None = None
        self._http: aiohttp.ClientSession | None = None
        self.hydrations = 0
        self.redelivered = 0
        self.acked_as_bytes = 0  # batchAcks of a window's runs' next ids, read as bytes
        # topic -> {connection id: subscription} of the open sessions that are not replaying: what a
        # fan-out looks its recipients up in, one lookup each (kept by ``NolagSession._relive``,
        # ``_put_subscription`` and ``_drop_subscription``). A session joins or leaves it at a
        # reconnect's replay and at its close, all its subscriptions at once.
        self.live_subs: dict[str, dict[int, _Subscription]] = {}
        # Connection ids of the sessions in it whose writes wait behind a QoS 2 record (``gated``):
        # not written by a fan-out's loop. Apart from the index, since a session enters and leaves
        # this state once per QoS 2 message: one set operation each, whatever its subscriptions.
        self.gated_ids: set[int] = set()

    async def key_store(self, call: Callable[[KeyStore], T]) -> T:
        """``call(store)`` in a worker thread, the store opened there on first use.

        The key store is synchronous (the CLI uses it too) and, on PostgreSQL, every call is a
        network round trip: run on the event loop it would stall every connection of the gateway.
        The calls are few (an ``auth``, a quota block of :data:`QUOTA_BLOCK` messages, a
        revocation poll), so a thread per call costs nothing that matters, and one synchronous
        store serves the CLI, the gateways and the tests alike.
        """
        return await asyncio.to_thread(self._with_keys, call)

    def _with_keys(self, call: Callable[[KeyStore], T]) -> T:
        with self._keys_lock:
            if self._keys is None:
                self._keys = open_key_store(self.gateway.settings)
        return call(self._keys)

    def new_session(self, wire: Wire, request_headers: Any) -> "NolagSession":
        return NolagSession(self, wire)

    async def start(self) -> None:
        self._poller = asyncio.get_running_loop().create_task(self._watch_revocations())

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
        if self._http is not None:
            await self._http.close()
        if self._keys is not None:
            await asyncio.to_thread(self._keys.close)

    def stats(self) -> dict[str, Any]:
        return {"connections": len(self.sessions), "authenticated": sum(1 for s in self.sessions if s.key),
                "unacked": sum(s.qos.size() for s in self.sessions), "redelivered": self.redelivered,
                "acked_as_bytes": self.acked_as_bytes, "hydrations": self.hydrations}

    async def _watch_revocations(self) -> None:
        """Poll the key store: a revoked key's live sessions get ``disconnect {token_invalid}``.
        It asks about the keys in use here, not "revoked since": no two machines' clocks compared."""
        while True:
            await asyncio.sleep(self.config.revocation_poll_s)
            in_use = {session.key.key_id for session in self.sessions if session.key is not None}
            if not in_use:
                continue
            try:
                revoked = set(await self.key_store(lambda keys: keys.revoked_among(in_use)))
            except Exception:
                logger.exception("nolag: reading revoked keys failed")
                continue
            if revoked:
                for session in list(self.sessions):
                    if session.key is not None and session.key.key_id in revoked:
                        session.disconnect("token_invalid")

    def quota_reserved(self, key: KeyRecord) -> bool:
        """Whether a message of the key can be counted without the store: unlimited, or some of
        the block this gateway reserved is left."""
        return key.monthly_quota is None or self._allowance.get(key.key_id, 0) > 0

    def take_quota(self, key: KeyRecord) -> bool:
        """One message against the key's monthly quota, from the block reserved (False: none left)."""
        if key.monthly_quota is None:
            return True
        left = self._allowance.get(key.key_id, 0)
        if left <= 0:
            return False
        self._allowance[key.key_id] = left - 1
        return True

    async def reserve_quota(self, key: KeyRecord) -> bool:
        """Reserve the next block of the key's monthly quota from the store; False when it is used
        up. One reservation per key is out at a time: the key's sessions on this gateway share it."""
        pending = self._reserving.get(key.key_id)
        if pending is None:
            pending = self._reserving[key.key_id] = asyncio.ensure_future(self._reserve(key))
            pending.add_done_callback(lambda _: self._reserving.pop(key.key_id, None))
        return await asyncio.shield(pending)  # a session that closes meanwhile leaves it to the others

    async def _reserve(self, key: KeyRecord) -> bool:
        def reserve(keys: KeyStore) -> int:
            remaining = key.monthly_quota - keys.usage(key.key_id, month_of(time.time()))
            block = min(QUOTA_BLOCK, remaining)
            return block if block > 0 and keys.consume(key.key_id, block) else 0

        block = await self.key_store(reserve)
        if block:
            self._allowance[key.key_id] = self._allowance.get(key.key_id, 0) + block
        return block > 0

    def hydration_url(self, topic: str) -> str | None:
        for hook in self.config.hydration:
            if pattern_matches(hook.topics, topic):
                return hook.url
        return None

    async def hydrate(self, url: str, body: dict[str, Any]) -> Any:
        """POST the subscription to the webhook; its JSON answer, or None (timeouts, retries bounded)."""
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.config.hydration_timeout_s))
        for attempt in range(self.config.hydration_retries + 1):
            try:
                async with self._http.post(url, json=body) as response:
                    if response.status == 200:
                        return await response.json(content_type=None)
                    if response.status < 500:
                        return None
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
                pass
            await asyncio.sleep(0.1 * 2 ** attempt)
        return None


class _Subscription:
    __slots__ = ("topic", "qos", "filters", "load_balance", "group", "pending", "then", "position", "publishing",
                 "session", "wire")

    def __init__(self, topic: str, qos: int, filters: tuple[str, ...], load_balance: bool, group: str | None) -> None:
        self.topic, self.qos, self.filters, self.load_balance, self.group = topic, qos, filters, load_balance, group
        self.pending = False  # a subscribe request the topic shard has not answered yet
        self.then: Callable[[], None] | None = None  # a reply that must follow its answer
        # The shard timestamp of the last message the fan-out's live loop wrote on it (0: none); the
        # window's positions take it up in NolagSession.positions_now.
        self.position = 0
        # Set once the key's publish patterns were seen to allow the topic (the key never changes):
        # the topic's shard key and link, and the start of its ``published`` answer, made once.
        self.publishing: tuple[str, ShardLink, bytes] | None = None
        # Its session and that session's wire, set when the session holds it: what a fan-out
        # writes to, found by one lookup in ``NolagDialect.live_subs``.
        self.session: NolagSession | None = None
        self.wire: Any = None

    def record(self) -> SubscriptionRecord:
        return SubscriptionRecord(self.qos, self.filters, self.load_balance, self.group)


class _Item(NamedTuple):
    """A message on its way to this connection (live, held during a replay, or replayed)."""

    topic: str
    packed: bytes
    msg_id: str | None
    qos: int
    filter: str | None
    ts_ms: int
    meta: tuple | None
    is_replay: bool


class NolagSession(DialectSession):
    def __init__(self, dialect: NolagDialect, wire: Wire) -> None:
        super().__init__(dialect, wire)
        self.opened = time.monotonic()
        self.last_sent = self.opened  # what this session wrote itself; a fan-out's writes are seen in on_tick
        self.flushes_seen = 0  # the wire's flushes at the last tick
        self.key: KeyRecord | None = None
        self.actor = ""
        self.project = ""
        self.authenticating = False
        self.bucket = TokenBucket(self.config.rate_limit_per_s, self.config.rate_limit_per_s, self.opened)
        self.subs: dict[str, _Subscription] = {}
        # ``subs`` itself while a live message may be written at once (open, no replay in progress,
        # nothing gated), else an empty dict (kept by :meth:`_relive`).
        self.live: dict[str, _Subscription] = self.subs
        self.indexed = True  # its subscriptions are in the dialect's ``live_subs`` (open, not replaying)
        self.rooms: dict[str, int] = {}  # rooms this connection is in through its subscriptions
        self.lobbies: set[str] = set()
        config = self.config
        # unacked QoS 1/2 frames, the QoS 2 ids written, the positions a reconnect replays from
        self.qos = QosWindow(config.ack_timeout_s, config.ack_backoff, config.max_attempts, config.max_unacked)
        self.positions = self.qos.positions  # the window's, read by a fan-out without the window
        self.replaying: list | None = None  # live deliveries held while a replay is sent
        self.carrying = False  # replaying what an earlier connection left unacked (once this one acks)
        # Behind a QoS 2 message until its session shard has recorded it: that message, and every
        # frame after it, in order (messages as _Items, other frames as bytes).
        self.gated: deque = deque()
        self.to_record: list[tuple[str, str, int]] = []  # (msg_id, topic, ts_ms) not yet sent
        self.recording = False  # a record is out
        self.record_scheduled = False
        self.present: dict[str | None, tuple[Any, int]] = {}  # room -> (presence data, joinedAt)
        self.tasks: set[asyncio.Task] = set()
        # Frames (with their meta, taken on arrival) that came while one waits for the key store:
        # handled in order after it.
        self.waiting: deque[tuple[bytes, tuple | None]] | None = None
        self.waiting_bytes = 0
        self.last_checkpoint = 0.0
        self.checkpointed: tuple | None = None  # what the session shard was last told

    def positions_now(self) -> dict[str, int]:
        """The window's positions, with what the fan-out's live loop wrote on each subscription
        since (kept there, not in the window: the hot path). Read before the positions are."""
        positions = self.positions
        for topic, sub in self.subs.items():
            if sub.position > positions.get(topic, 0):
                positions[topic] = sub.position
        return positions

    def _relive(self) -> None:
        """After ``closed``, ``replaying`` or ``gated`` changed: whether live messages go straight
        out, and the dialect's index (``live_subs``, ``gated_ids``) as the fan-out reads it."""
        dialect, connection_id = self.dialect, self.wire.id
        open_ = not self.closed
        indexed = open_ and self.replaying is None
        self.live = self.subs if indexed and not self.gated else _NOT_LIVE
        if open_ and self.gated:
            dialect.gated_ids.add(connection_id)
        else:
            dialect.gated_ids.discard(connection_id)
        if indexed != self.indexed:
            self.indexed = indexed
            index = dialect.live_subs
            for topic, sub in self.subs.items():
                if indexed:
                    _index(index, topic, connection_id, sub)
                else:
                    _unindex(index, topic, connection_id)

    def _put_subscription(self, sub: _Subscription) -> None:
        """``sub`` is this session's subscription to its topic (a new one, or in place of the old)."""
        sub.session, sub.wire = self, self.wire
        self.subs[sub.topic] = sub
        if self.indexed:
            _index(self.dialect.live_subs, sub.topic, self.wire.id, sub)

    # -- frames in ------------------------------------------------------------------------------

    takes_binaries = True

    def on_binaries(self, payloads: list[bytes]) -> None:
        """The binary frames of one read: a row of them that are ``batchAck`` frames of the next ids
        this connection was written, in order (as a client acks what it reads, several acks to a
        write), is acked and logged together (:meth:`_acked_row`); every other frame goes through
        :meth:`on_message`, in its place. After a frame that closed the connection the rest are
        dropped, as ``DialectSession.on_binaries`` does (an ack read as bytes closes nothing)."""
        index, count = 0, len(payloads)
        wire = self.wire
        while index < count and not self.closed:
            if self.waiting is None and self.qos.runs and self.key is not None:
                end = self._acked_row(payloads, index)
                if end > index:
                    index = end
                    continue
            data = payloads[index]
            index += 1
            if self.waiting is None:
                self._receive(data)  # not an ack read as bytes: _acked_row just looked
            else:
                self.on_message(data, False)  # behind the frame that waits for the key store
            if not wire.receiving():
                return

    def _acked_row(self, payloads: list[bytes], start: int) -> int:
        """The one place a ``batchAck`` is read as bytes: frame after frame from ``start``, while
        each is a ``batchAck`` of the runs' next ids within the size limit (``batch_ack_packed``,
        ``QosWindow.acked_packed``), ack it; they are accepted as ``BatchAck`` frames, with one
        clock read (``Gateway.accepted_row``). Returns where the row ends (``start``: not one; the
        frame then goes through :meth:`_receive`, which decodes it). For an authenticated session
        whose window holds runs."""
        qos, limits = self.qos, self.dialect.limits
        largest = self.config.max_message_bytes + ENVELOPE_ALLOWANCE
        sizes: list[int] = []
        index, count = start, len(payloads)
        while index < count and qos.runs:
            data = payloads[index]
            size = len(data)
            if size > largest:
                break
            found = codec.batch_ack_packed(data, limits)
            if found is None or not qos.acked_packed(data, *found):
                break
            sizes.append(size)
            index += 1
        if sizes:
            self.dialect.acked_as_bytes += len(sizes)
            self.gateway.accepted_row(DIALECT, "BatchAck", sizes, self.wire.id)
        return index

    def on_message(self, data: bytes, is_text: bool) -> None:
        if self.closed:
            return
        waiting = self.waiting
        if waiting is not None:  # a frame waits for the key store: this one keeps its place behind it
            self.waiting_bytes += len(data)
            if len(waiting) >= MAX_WAITING_FRAMES or self.waiting_bytes > MAX_WAITING_BYTES:
                self._shut(1008, "too much sent while the key was read")
                return
            waiting.append((data, self.gateway.event_meta(DIALECT) if data else None))
            return
        if self.qos.runs and self.key is not None and self._acked_row([data], 0):
            return
        self._receive(data)

    def _receive(self, data: bytes, meta: tuple | None = None, reserved: Any = None) -> None:
        """One frame (``meta``: taken when it arrived, if it waited). ``reserved``: the store's
        answer when it waited for a block of the key's quota (True, False: used up, or the
        exception); its rate was counted then."""
        if not data:  # the heartbeat: echoed once authenticated
            if self.key is not None:
                self._send(HEARTBEAT)
            return
        gateway = self.gateway
        if meta is None:
            meta = gateway.event_meta(DIALECT)
        size = len(data)
        try:
            if size > self.config.max_message_bytes + ENVELOPE_ALLOWANCE:
                # Not decoded: far above the limit (publish data is checked exactly after decoding);
                # only its topic and msgRef are read, the data skipped, for the error to carry them.
                head = codec.envelope(data, self.dialect.limits)
                raise codec.nolag_error("message_too_large", f"message of {size} bytes exceeds "
                                        f"{self.config.max_message_bytes}", head.topic, head.msg_ref)
            request = codec.decode(data, self.dialect.limits)
            kind = type(request).__name__
            meta = contract.retag(meta, kind, getattr(request, "topic", None))
            if (self.key is not None and reserved is None and not self._answers_outstanding(request)
                    and self.bucket.take(time.monotonic())):
                raise codec.nolag_error("rate_limit_exceeded", f"more than {self.bucket.rate:g} messages per second",
                                        getattr(request, "topic", None), getattr(request, "msg_ref", None))
            if kind == "Publish" and self.key is not None and not self.dialect.quota_reserved(self.key):
                if reserved is None or reserved is True:  # True: another session took the block first
                    # the gateway's block of the key's quota is used up: this frame waits for the next
                    key, dialect = self.key, self.dialect
                    self._wait(lambda: dialect.reserve_quota(key), lambda answer: self._receive(data, meta, answer))
                    return
                if isinstance(reserved, Exception):
                    raise codec.nolag_error("internal_error", "the router could not read the key's quota; retry",
                                            request.topic, request.msg_ref)
            if isinstance(request, codec.Auth):
                self._auth(request)
            elif self.key is None:
                raise NolagError("not_authenticated", None, "send auth first")
            else:
                self._handle(request, meta)
        except NolagError as failure:
            extra = {"maxSizeBytes": self.config.max_message_bytes} if failure.error == "message_too_large" else {}
            gateway.rejected(meta, failure.msg_ref, size, self.wire.id, failure.error)
            self._send(codec.error_frame(failure, **extra))
            return
        gateway.accepted(meta, None, size, self.wire.id)

    def _answers_outstanding(self, request: Any) -> bool:
        """An ``ack`` or ``batchAck`` of a message this connection has outstanding: an answer the
        router asked for, so not counted against the rate limit (a subscriber acking each message
        of a busy topic would be refused, and its messages sent again). Each such frame retires at
        least one outstanding message, so they are bounded by what the router wrote; an ack of
        nothing outstanding counts like any other frame."""
        kind = type(request)
        if kind is codec.Ack:
            return self.qos.holds(request.msg_id)
        if kind is codec.BatchAck:
            return self.qos.holds_any(request.msg_ids)
        return False

    def _handle(self, request: Any, meta: tuple) -> None:
        if isinstance(request, codec.Publish):
            self._publish(request, meta)
        elif isinstance(request, codec.Subscribe):
            self._subscribe(request)
        elif isinstance(request, codec.Unsubscribe):
            self._unsubscribe(request.topic)
        elif isinstance(request, codec.SetFilters):
            self._set_filters(request)
        elif isinstance(request, codec.Ack):
            self._acked(request.msg_id)
        elif isinstance(request, codec.BatchAck):
            self._acked(*request.msg_ids)
        elif isinstance(request, codec.Presence):
            self._presence(request)
        elif isinstance(request, codec.GetPresence):
            self._check_room(request.room_id)
            key = room_key(self.project, request.room_id)
            room = request.room_id
            self._ask(key, nolag.presence_list(key), lambda entries: self._send(codec.presence_list(room, entries)))
        elif isinstance(request, codec.LobbySubscribe):
            self._lobby(request.lobby_id, subscribe=True)
        elif isinstance(request, codec.LobbyUnsubscribe):
            self._lobby(request.lobby_id, subscribe=False)
        elif isinstance(request, codec.GetLobbyPresence):
            self._lobby(request.lobby_id, subscribe=None)

    # -- auth and reconnect ---------------------------------------------------------------------

    def _auth(self, request: codec.Auth) -> None:
        """The token is checked by the key store off the event loop; frames sent behind the
        ``auth`` wait for the answer, as if it had been immediate."""
        if self.key is not None or self.authenticating:
            raise NolagError("already_authenticated", None, "this connection is authenticated")
        token = request.token
        self._wait(lambda: self.dialect.key_store(lambda keys: keys.verify(token)),
                   lambda key: self._verified(request, key))

    def _verified(self, request: codec.Auth, key: Any) -> None:
        if isinstance(key, Exception):
            self._send(codec.auth_failed("internal_error"))
            self._shut(1011, "the router could not read the key")
            return
        if key is None or (request.project_id is not None and request.project_id != key.project_id):
            self._send(codec.auth_failed("access_denied"))
            self._shut(1008, "access denied")
            return
        self.authenticating = True
        self.key = key
        self.actor = f"actor_{key.key_id}"
        self.project = key.project_id
        self.bucket = TokenBucket(key.rate_limit_per_s or self.config.rate_limit_per_s,
                                  key.rate_limit_per_s or self.config.rate_limit_per_s, time.monotonic())
        version = min(request.protocol_version, codec.MAX_PROTOCOL_VERSION)
        if not request.reconnect:
            self._ask_actor(nolag.actor_reset(self.actor), lambda _: self._authenticated(version, []))
            return
        self._ask_actor(nolag.actor_get(self.actor), lambda state: self._restore(version, state))

    def _ask_actor(self, command: tuple, on_result: Any, attempt: int = 1) -> None:
        """The actor's kept state, needed to answer ``auth``: asked again if its session shard
        failed (it may be restarting); after :data:`AUTH_ATTEMPTS` the auth fails and the client
        reconnects."""
        shards = self.shards

        def done(result: Any) -> None:
            if self.closed:
                return
            if not isinstance(result, (ShardUnavailable, CommandError)):
                on_result(result)
            elif attempt < AUTH_ATTEMPTS:
                self._ask_actor(command, on_result, attempt + 1)
            else:
                self._send(codec.auth_failed("internal_error"))
                self._shut(1011, "the router could not read the session")

        shards.send(shards.link(SESSION, actor_key(self.actor)), command, done)

    def _authenticated(self, version: int, restored: list[str]) -> None:
        self.authenticating = False
        self._send(codec.auth_ok(self.actor, self.project, version, restored))

    def _restore(self, version: int, state: Any) -> None:
        """Reconnect: subscribe again to what the actor held, then replay what it missed."""
        if not state:
            self._authenticated(version, [])
            return
        subscriptions, positions, floors, seen, acks = state
        self.qos.restore(seen, acks)
        if acks:  # it acks: replayed from before the oldest message it had not acked
            resume = {topic: min(floors.get(topic, position), position) for topic, position in positions.items()}
        else:  # it may never ack (the SDK): nothing twice; what it left unacked waits for its first ack
            resume = positions
            self.qos.carry(floors, positions)
        self.replaying = []
        self._relive()
        pending = [len(subscriptions)]
        restored = sorted(subscriptions)

        def done(_: Any = None) -> None:
            pending[0] -= 1
            if pending[0] == 0:
                self._authenticated(version, restored)
                self._replay(resume)

        if not subscriptions:
            self._authenticated(version, [])
            self._replay(resume)
            return
        for topic, (qos, filters, load_balance, group) in subscriptions.items():
            def joined(result: Any, topic: str = topic) -> None:
                if topic not in resume and isinstance(result, int):
                    self.positions_now()
                    self.qos.joined(topic, result)
                done()

            self._add_subscription(_Subscription(topic, qos, tuple(filters), load_balance, group), joined)

    def _replay(self, resume: dict[str, int]) -> None:
        """Ask each topic's shard for what it logged after this actor's position in the topic."""
        topics = self.qos.replay_topics(resume, self.subs)
        if not topics or not self.config.max_replay:
            self._end_replay([])
            return

        def collected(results: list) -> None:
            if self.closed:
                return
            records = [record for result in results if not isinstance(result, (ShardUnavailable, CommandError))
                       for record in result]
            records.sort(key=lambda record: record.ts_ms)
            self._end_replay(records[: self.config.max_replay])

        shards, keys = self.shards, [topic_key(self.project, topic) for topic in topics]
        self.shards.send_each([(shards.link(TOPIC, key), nolag.log(key, resume[topic], self.config.max_replay))
                               for key, topic in zip(keys, topics)], collected)

    def _end_replay(self, records: list) -> None:
        """Send what was missed (replayStart, messages, replayEnd), then the live ones held meanwhile."""
        held, self.replaying = self.replaying or [], None
        # exactly once: QoS 2 ids the actor had before it went away are left out, and live ones in the replay
        items, held = self.qos.replayed(self._replayable(records), held)
        self._send_replay(items)
        for item in held:
            self._deliver(item)
        self._relive()
        if self.qos.acks_seen:
            self._replay_carried()

    def _replayable(self, records: list, upto: dict[str, int] | None = None) -> list[_Item]:
        """Logged records as replayed items: those the subscriptions select (and at most ``upto``)."""
        items = []
        for topic, msg_id, ts_ms, packed, qos, filter_ in records:
            sub = self.subs.get(topic)
            if sub is None or not _selects(sub, filter_) or (upto is not None and ts_ms > upto[topic]):
                continue
            items.append(_Item(topic, packed, msg_id, min(qos, sub.qos), filter_, ts_ms, None, True))
        return items

    def _send_replay(self, items: list[_Item]) -> None:
        items = [item for item in items if self.qos.deliverable(item.msg_id, item.qos)]
        if items:
            self._frame(codec.replay_start(len(items), items[0].ts_ms, items[-1].ts_ms))
            for item in items:
                self._deliver(item)
            self._frame(codec.replay_end(len(items)))

    def _acked(self, *msg_ids: str) -> None:
        if self.qos.acked(*msg_ids):  # the first sign that the actor acks: its session shard learns it
            self._checkpoint()
            if self.replaying is None:
                self._replay_carried()

    def _replay_carried(self) -> None:
        """This connection acks: replay what earlier connections of the actor (which had not shown
        that it acks) left unacked, from the log (the range between each floor and position)."""
        carried = self.qos.carried
        topics = [topic for topic in carried if topic in self.subs]
        if self.carrying or not topics:
            return
        self.carrying = True
        limit = self.config.max_replay
        keys = [topic_key(self.project, topic) for topic in topics]

        def collected(results: list) -> None:
            self.carrying = False
            if self.closed:
                return
            records, upto = [], {}
            for topic, result in zip(topics, results):
                if isinstance(result, (ShardUnavailable, CommandError)) or topic not in carried:
                    continue  # kept: asked again on a later tick
                upto[topic] = carried.pop(topic)[1]
                records.extend(result)
            records.sort(key=lambda record: record.ts_ms)
            self._send_replay(self.qos.replayed(self._replayable(records, upto)[:limit], [])[0])

        self.shards.send_each([(self.shards.link(TOPIC, key), nolag.log(key, carried[topic][0], limit))
                               for key, topic in zip(keys, topics)], collected)

    # -- subscriptions --------------------------------------------------------------------------

    def _subscribe(self, request: codec.Subscribe) -> None:
        topic = request.topic
        if not self.key.can_subscribe(topic):
            raise codec.nolag_error("not_authorized", f"the key may not subscribe to {topic}", topic)
        if topic not in self.subs and len(self.subs) >= self.config.max_subscriptions:
            raise codec.nolag_error("too_many_subscriptions", f"at most {self.config.max_subscriptions}", topic)
        group = request.group if request.load_balance else None
        if request.load_balance and group is None:
            group = self.actor  # the broker's default group: the actor token
        sub = _Subscription(topic, request.qos, request.filters, request.load_balance, group)
        sub.pending = True

        def done(result: Any) -> None:
            sub.pending = False
            if isinstance(result, (ShardUnavailable, CommandError)):
                # Told it is not subscribed, it is not: a restarted shard would otherwise get the
                # subscription again from the re-announce, and a timed-out one may yet have run it.
                if self.subs.get(topic) is sub:
                    self._drop_subscription(topic)
                self._send(codec.error("internal_error", topic=topic, hint="the router could not subscribe; retry"))
            else:
                self._send(codec.subscribed(topic, request.load_balance))
                # Unsubscribed (or subscribed again) before this answer: the later request decided
                # the position and what the session shard keeps; this one only gets its reply.
                if self.subs.get(topic) is sub:
                    self.positions_now()
                    position = self.qos.joined(topic, result)  # the topic's last message when we joined
                    self.checkpointed = None
                    self._ask_session(nolag.actor_save(self.actor, topic, sub.record(), position), None)
                    url = self.dialect.hydration_url(topic)
                    if url is not None:
                        self._spawn(self._hydrate(url, topic))
            if sub.then is not None:
                then, sub.then = sub.then, None
                then()

        self._add_subscription(sub, done)

    def _add_subscription(self, sub: _Subscription, done: Any) -> None:
        topic = sub.topic
        old = self.subs.get(topic)
        fresh = old is None
        if old is not None:
            sub.position = old.position
        self._put_subscription(sub)
        key = topic_key(self.project, topic)
        self._ask(key, nolag.subscribe(key, self.wire.id, self.actor, sub.filters, sub.qos, sub.group), done,
                  failures=True)  # answers the topic's position
        if fresh:
            room = room_of(topic)
            self.rooms[room] = self.rooms.get(room, 0) + 1
            if self.rooms[room] == 1:
                rkey = room_key(self.project, room)
                self._ask(rkey, nolag.room(rkey, self.wire.id, True), None)

    def _unsubscribe(self, topic: str) -> None:
        sub = self.subs.get(topic)
        if sub is None:
            raise codec.nolag_error("not_subscribed", f"not subscribed to {topic}", topic)
        self._drop_subscription(topic)
        if sub.pending:  # replies in the order of the requests: after the subscribe's
            sub.then = lambda: self._send(codec.unsubscribed(topic))
        else:
            self._send(codec.unsubscribed(topic))

    def _drop_subscription(self, topic: str) -> None:
        """The connection no longer has ``topic``: on its topic shard, in its window, on its session
        shard (a reconnect does not restore it), in its rooms."""
        del self.subs[topic]
        if self.indexed:
            _unindex(self.dialect.live_subs, topic, self.wire.id)
        key = topic_key(self.project, topic)
        self._ask(key, nolag.unsubscribe(key, self.wire.id), None)
        self.qos.left(topic)
        self._ask_session(nolag.actor_save(self.actor, topic, None, None), None)
        room = room_of(topic)
        self.rooms[room] -= 1
        if not self.rooms[room]:
            del self.rooms[room]
            rkey = room_key(self.project, room)
            self._ask(rkey, nolag.room(rkey, self.wire.id, False), None)

    def _set_filters(self, request: codec.SetFilters) -> None:
        sub = self.subs.get(request.topic)
        if sub is None:
            raise codec.nolag_error("not_subscribed", f"not subscribed to {request.topic}", request.topic)
        sub.filters = request.filters
        key = topic_key(self.project, request.topic)
        self._ask(key, nolag.set_filters(key, self.wire.id, request.filters),
                  lambda _: self._send(codec.filters_updated(request.topic, request.filters)))
        self._ask_session(nolag.actor_save(self.actor, request.topic, sub.record(), None), None)

    async def _hydrate(self, url: str, topic: str) -> None:
        app, room, name = topic.split("/")
        data = await self.dialect.hydrate(url, {"actorId": self.actor, "roomName": room, "topicName": name,
                                                "scope": app})
        if data is not None and not self.closed and topic in self.subs:
            self.dialect.hydrations += 1
            self._send(codec.hydration(topic, data))

    # -- publish and deliver --------------------------------------------------------------------

    def _publish(self, request: codec.Publish, meta: tuple) -> None:
        topic, ref = request.topic, request.msg_ref
        if request.data_size > self.config.max_message_bytes:
            raise NolagError("message_too_large", 42930, f"data of {request.data_size} bytes exceeds "
                             f"{self.config.max_message_bytes}", topic, ref)
        if not self.dialect.take_quota(self.key):
            raise NolagError("monthly_quota_exceeded", 42920, "the key's monthly message quota is used up",
                             topic, ref)
        sub = self.subs.get(topic)
        publishing = None if sub is None else sub.publishing
        if publishing is None:
            if not self.key.can_publish(topic):
                raise codec.nolag_error("not_authorized", f"the key may not publish to {topic}", topic, ref)
            if sub is None:
                raise codec.nolag_error("not_subscribed", f"subscribe to {topic} before publishing to it", topic, ref)
            key = topic_key(self.project, topic)
            publishing = sub.publishing = (key, self.shards.link(TOPIC, key), codec.published_head(topic))
        key, link, head = publishing
        stored = request.qos >= 1 and self.config.log_retention_s > 0
        msg_id = uuid7() if stored else None  # time-ordered: the log's index grows at its end
        exclude = None if request.echo else self.wire.id
        # The subscription's topic, not the frame's equal string: a batch's commands then share one
        # object, which its pickle carries once.
        command = nolag.publish(key, sub.topic, request.data_packed, request.qos, request.filter, exclude, msg_id,
                                self.actor, meta)
        # Without a msgRef nothing is answered, a failure included (as before: no callback).
        self.shards.send(link, command, None if ref is None else partial(self._published, head, ref))

    def _published(self, head: bytes, ref: Any, result: Any) -> None:
        """A publish's answer: ``published`` with its msgRef, or the error ``_ask`` would send."""
        if self.closed:
            return
        if isinstance(result, (ShardUnavailable, CommandError)):
            self._send(codec.error("internal_error", hint="the router could not complete the request; retry"))
            return
        self._send(codec.published_frame(head, ref))

    def on_event(self, payload: Any) -> None:
        if self.closed:
            return
        if type(payload) is tuple:  # a nolag.Message layout: the hot path
            topic, packed, msg_id, qos, filter_, ts_ms, sender, meta = payload
            sub = self.subs.get(topic)
            if sub is None:
                return
            item = _Item(topic, packed, msg_id, min(qos, sub.qos), filter_, ts_ms, meta, False)
            if self.replaying is not None:
                self.replaying.append(item)
            else:
                self._deliver(item)
        elif isinstance(payload, PresenceChange):
            room, event, actor, presence, joined_at = payload
            self._frame(codec.presence_event(event, actor, presence, joined_at, room))
        elif isinstance(payload, LobbyChange):
            lobby, room, event, actor, data = payload
            if lobby in self.lobbies:
                self._frame(codec.lobby_presence(event, lobby, room, actor, data))

    def _deliver(self, item: _Item) -> None:
        """Write a message, unless the actor had it; a QoS 2 one (and all behind it) waits until
        its session shard has recorded it, so that no replay, even after a crash of this gateway,
        writes it twice."""
        window = self.qos
        msg_id = item.msg_id
        if not window.deliverable(msg_id, item.qos):
            return
        if window.needs_record(msg_id, item.qos):
            window.recording.add(msg_id)
            self.to_record.append((msg_id, item.topic, item.ts_ms))
            self.gated.append(item)
            self._relive()
            if not self.record_scheduled and not self.recording:
                self.record_scheduled = True
                asyncio.get_running_loop().call_soon(self._record)
        elif self.gated:
            self.gated.append(item)
        else:
            self._write(item)

    def _write(self, item: _Item) -> None:
        topic, packed, msg_id, qos, filter_, ts_ms, meta, is_replay = item
        window = self.qos
        requires_ack = window.requires_ack(msg_id, qos)
        frame = codec.message_packed(topic, packed, msg_id, requires_ack, is_replay, filter_, None, ts_ms)
        sent = self._send(frame)
        window.delivered(topic, msg_id, qos, ts_ms, frame, sent, time.monotonic() if requires_ack else 0.0)
        if meta is not None:
            self.gateway.account_delivery(meta, len(frame), self.wire.id, sent)

    def fan_out(self, payload: Any, connection_ids: tuple, gateway: Any) -> None:
        """One event for several connections of this dialect (``Gateway._fan_out``, on the session
        of one of them), in one loop over their ids. A message that nobody acks (QoS 0, or without
        an id) is one frame for every recipient: those whose session is open, subscribed and not
        replaying or gated (``live``) get it in the loop below; the others (gone, not subscribed,
        another dialect's, a replay or a gated write in progress) go through :meth:`_fan_out_others`
        after it. One to be acked goes to :meth:`_fan_out_acked`."""
        if type(payload) is not tuple:
            gateway.each_event(payload, connection_ids)
            return
        topic, packed, msg_id, qos, filter_, ts_ms, _, meta = payload
        if qos != 0 and msg_id is not None:
            self._fan_out_acked(payload, connection_ids, gateway)
            return
        dialect = self.dialect
        live, gated = dialect.live_subs.get(topic, _NOT_LIVE), dialect.gated_ids
        frame = codec.message_packed(topic, packed, msg_id, False, False, filter_, None, ts_ms)
        wire_frame = frame_header(_BINARY, len(frame)) + frame
        others: list[int] | None = None  # not written here: the rest of the group
        refused: list[int] | None = None  # live, but the socket did not take the frame
        for connection_id in connection_ids:
            sub = live.get(connection_id)
            if sub is None or (gated and connection_id in gated):
                if others is None:
                    others = []
                others.append(connection_id)
                continue
            if sub.wire.send_frame(wire_frame, 2, frame):  # 2: a binary frame
                if ts_ms > sub.position:  # the topic's position (see positions_now)
                    sub.position = ts_ms
            else:
                if refused is None:
                    refused = []
                refused.append(connection_id)
        NolagSession._fan_out_rest(payload, connection_ids, gateway, len(frame), others, refused, None)

    def fan_out_run(self, payloads: list, connection_ids: tuple, gateway: Any) -> None:
        """Events in a row for one delivery group (``Gateway._fan_out_run``): a topic shard's reply
        to a window of publishes. When every recipient would take every message as the live loop
        of :meth:`fan_out` writes it, the messages' frames are joined once and each recipient gets
        them as one piece, its window (at QoS 1) all their entries in one update; else each
        message goes through :meth:`fan_out`. Either way each recipient gets the same frames in
        the same order, its window the same entries, and each message one accounting group."""
        if not self._fan_out_joined(payloads, connection_ids, gateway):
            for payload in payloads:
                self.fan_out(payload, connection_ids, gateway)

    def _fan_out_joined(self, payloads: list, connection_ids: tuple, gateway: Any) -> bool:
        """:meth:`fan_out_run`'s one piece per recipient, if it applies: messages of one topic,
        all to be acked at QoS 1 (distinct ids) or none to be acked, and every recipient live,
        not gated, its socket taking frames as they are (``Wire.takes_frames``) and, at QoS 1,
        subscribed at QoS 1 or 2 with room in its window for all of them and none of their ids
        out already, no recipient twice in the group. False (nothing done) otherwise."""
        first = payloads[0]
        if type(first) is not tuple:
            return False
        topic = first[0]
        acked = first[3] != 0 and first[2] is not None
        count = len(payloads)
        ids: list[str] = []
        for payload in payloads:
            if type(payload) is not tuple or payload[0] != topic:
                return False
            if acked:
                if payload[3] != 1 or payload[2] is None:
                    return False
                ids.append(payload[2])
            elif payload[3] != 0 and payload[2] is not None:
                return False
        if len(set(connection_ids)) != len(connection_ids):
            return False  # a recipient twice gets each message twice in a row
        id_set = set(ids)
        if acked and len(id_set) != count:
            return False  # a repeated id is written once
        dialect = self.dialect
        live, gated = dialect.live_subs.get(topic), dialect.gated_ids
        if live is None:
            return False
        subs = []
        clear: dict[Run, bool] = {}  # a run a window holds -> none of its ids is among these
        for connection_id in connection_ids:
            sub = live.get(connection_id)
            if sub is None or (gated and connection_id in gated) or not sub.wire.takes_frames():
                return False
            if acked:
                window = sub.session.qos
                unacked = window.unacked
                if (sub.qos == 0 or len(unacked) + window.in_runs + count > window.max_unacked
                        or (unacked and not unacked.keys().isdisjoint(id_set))):
                    return False
                for held, _ in window.runs:
                    fine = clear.get(held)
                    if fine is None:
                        fine = clear[held] = id_set.isdisjoint(held.ids)
                    if not fine:
                        return False
            subs.append(sub)
        # The frames as message_packed builds them one by one, with the ids packed (at QoS 1 one a
        # message, in order) for the run's batchAck comparison (QosWindow.acked_packed)
        frames, packed_ids = codec.message_run(topic, [(payload[1], payload[2], payload[4], payload[5])
                                                       for payload in payloads], acked)
        joined = joined_frames(_BINARY, frames)
        last_ms = max(payload[5] for payload in payloads)
        if acked:
            due = time.monotonic() + self.qos.ack_timeout_s  # one clock read for the run (each message read its own)
            # One run, shared by every window (as the live loop shares an entry).
            run = Run(tuple(ids), tuple(Unacked(frame, payload[5], 1, due, 1, topic)
                                        for payload, frame in zip(payloads, frames)), due,
                      codec.joined_ids(packed_ids))
        for sub in subs:
            sub.wire.cork_frames(joined)
            if last_ms > sub.position:
                sub.position = last_ms
            if acked:
                sub.session.qos.add_run(run)
        gateway.account_written([(contract.DELIVER_BINARY, frame, connection_ids, payload[-1])
                                 for payload, frame in zip(payloads, frames) if payload[-1] is not None])
        return True

    def _fan_out_acked(self, payload: tuple, connection_ids: tuple, gateway: Any) -> None:
        """A message to be acked (QoS 1 or 2, with an id), in one loop over the group: a live
        session that acks it at QoS 1 gets the frame with ``requiresAck`` (built once) and tracks it
        in its window, every such window sharing one entry, unless it is out there already; the
        rest (a QoS 0 subscription, QoS 2 on both sides, not live) go through :meth:`_fan_out_others`
        after it."""
        topic, packed, msg_id, qos, filter_, ts_ms, _, meta = payload
        dialect = self.dialect
        live, gated = dialect.live_subs.get(topic, _NOT_LIVE), dialect.gated_ids
        frame = codec.message_packed(topic, packed, msg_id, True, False, filter_, None, ts_ms)
        wire_frame = frame_header(_BINARY, len(frame)) + frame
        now = time.monotonic()
        # The recipients whose socket takes the frame share one window entry (level 1 here; every
        # window of a gateway has its ack timeout).
        entry = Unacked(frame, ts_ms, 1, now + self.qos.ack_timeout_s, 1, topic)
        due = entry.due
        others: list[int] | None = None
        refused: list[int] | None = None
        out: list[int] | None = None  # out already, waiting for its ack: not written again
        for connection_id in connection_ids:
            sub = live.get(connection_id)
            if sub is None or sub.qos == 0 or (qos == 2 and sub.qos == 2) or (gated and connection_id in gated):
                if others is None:
                    others = []
                others.append(connection_id)
                continue
            window = sub.session.qos
            unacked = window.unacked
            if msg_id in unacked or (window.runs and window.in_a_run(msg_id)):  # QosWindow.deliverable
                if out is None:
                    out = []
                out.append(connection_id)
                continue
            if sub.wire.send_frame(wire_frame, 2, frame):  # 2: a binary frame
                if ts_ms > sub.position:  # the topic's position (see positions_now)
                    sub.position = ts_ms
                if not window.runs and len(unacked) < window.max_unacked:  # QosWindow.track, inlined
                    unacked[msg_id] = entry
                    if due < window.next_due:
                        window.next_due = due
                else:
                    window.track(msg_id, entry)  # the oldest leaves the window
            else:
                window.delivered(topic, msg_id, 1, ts_ms, frame, False, now)
                if refused is None:
                    refused = []
                refused.append(connection_id)
        NolagSession._fan_out_rest(payload, connection_ids, gateway, len(frame), others, refused, out)

    @staticmethod
    def _fan_out_rest(payload: tuple, connection_ids: tuple, gateway: Any, nbytes: int, others: list[int] | None,
                      refused: list[int] | None, out: list[int] | None) -> None:
        """After a live loop: the recipients written (all of the group but ``others``, ``refused``
        and ``out``) as one accounting group of ``nbytes``, each refused one apart; then
        ``others`` through :meth:`_fan_out_others`."""
        meta = payload[-1]
        if meta is not None:
            if others is None and refused is None and out is None:
                gateway.account_fanout(meta, nbytes, connection_ids)
            else:
                skipped = set(others or ()).union(refused or (), out or ())
                written = [connection_id for connection_id in connection_ids if connection_id not in skipped]
                if written:
                    gateway.account_fanout(meta, nbytes, written)
                for connection_id in refused or ():
                    gateway.account_delivery(meta, nbytes, connection_id, False)
        if others is not None:
            NolagSession._fan_out_others(payload, tuple(others), gateway)

    @staticmethod
    def _fan_out_others(payload: tuple, connection_ids: tuple, gateway: Any) -> None:
        """The rest of a group after a live loop: a live session subscribed at QoS 0 to a message
        to be acked gets the frame without ``requiresAck`` (built once, one accounting group); any
        other session (not live, QoS 2 on both sides, another dialect's) gets the message through
        ``on_event``, which holds, records or drops it as its state asks. A connection that is gone
        counts as undeliverable on ``gateway``."""
        connections = gateway.connections
        topic, packed, msg_id, _, filter_, ts_ms, _, meta = payload
        plain: bytes | None = None  # the frame without requiresAck
        plain_wire = b""  # it with its WebSocket header
        written: list[int] = []
        gone = 0
        for connection_id in connection_ids:
            wire = connections.get(connection_id)
            session = None if wire is None else wire.session
            if session is None:
                gone += 1
                continue
            sub = session.live.get(topic) if type(session) is NolagSession else None
            if sub is None or sub.qos != 0:
                session.on_event(payload)
                continue
            if plain is None:
                plain = codec.message_packed(topic, packed, msg_id, False, False, filter_, None, ts_ms)
                plain_wire = frame_header(_BINARY, len(plain)) + plain
            if wire.send_frame(plain_wire, _BINARY, plain):
                if ts_ms > sub.position:  # the topic's position (see positions_now)
                    sub.position = ts_ms
                written.append(connection_id)
            elif meta is not None:
                gateway.account_delivery(meta, len(plain), connection_id, False)
        if gone:
            gateway.undeliverable += gone
        if meta is not None and written:
            gateway.account_fanout(meta, len(plain), written)

    def _frame(self, frame: bytes) -> None:
        """A frame that keeps its place behind messages waiting for their record."""
        if self.gated:
            self.gated.append(frame)
        else:
            self._send(frame)

    def _record(self) -> None:
        """Send the QoS 2 ids waiting to be recorded, one record out at a time (they batch up meanwhile)."""
        self.record_scheduled = False
        if self.closed or self.recording or not self.to_record:
            return
        records, self.to_record = tuple(self.to_record), []
        self.recording = True

        def done(result: Any) -> None:
            self.recording = False
            if self.closed:
                return
            if isinstance(result, (ShardUnavailable, CommandError)):
                self.to_record[0:0] = records  # sent again on the next tick
                return
            self.qos.seen(*(msg_id for msg_id, _, _ in records))
            self._release()
            self._record()

        shards = self.shards
        shards.send(shards.link(SESSION, actor_key(self.actor)), nolag.actor_seen(self.actor, records), done)

    def _release(self) -> None:
        """Write what waited behind recorded QoS 2 messages, up to the next one still being recorded."""
        gated, recording = self.gated, self.qos.recording
        while gated:
            entry = gated[0]
            if type(entry) is bytes:
                self._send(entry)
            elif entry.msg_id in recording:
                return
            else:
                self._write(entry)
            gated.popleft()
        self._relive()

    # -- presence and lobbies -------------------------------------------------------------------

    def _presence(self, request: codec.Presence) -> None:
        room = request.room_id
        self._check_room(room)
        key = room_key(self.project, room)
        data = request.data

        def done(joined_at: Any) -> None:  # kept to re-announce it to a restarted shard
            if isinstance(joined_at, int) and not isinstance(joined_at, bool):
                self.present[room] = (data, joined_at)
            else:
                self.present.pop(room, None)

        self._ask(key, nolag.presence(key, self.wire.id, self.actor, data, now_ms()), done)

    def _check_room(self, room: str | None) -> None:
        """The key's ACL, as for a subscribe: presence is shared by the subscribers of the room's topics."""
        if not self.key.can_subscribe_room(room):
            where = "every room" if room is None else f"room {room!r}"
            raise codec.nolag_error("not_authorized", f"the key may not subscribe to a topic of {where}")

    def _lobby(self, lobby_id: str, subscribe: bool | None) -> None:
        lobby = self.config.lobbies.get(lobby_id)
        if lobby is None:
            raise NolagError("unknown_lobby", None, f"no lobby {lobby_id!r} is configured")
        if subscribe is False:  # leaving reads nothing: no ACL
            self.lobbies.discard(lobby_id)
            self._ask_all(nolag.lobby_unsubscribe(lobby_id, self.wire.id),
                          lambda _: self._send(codec.lobby_unsubscribed(lobby_id)))
            return
        for room in lobby.rooms if lobby.rooms is not None else [None]:  # a prefix lobby: every room
            self._check_room(room)
        spec = LobbySpec(self.project, tuple(lobby.rooms) if lobby.rooms is not None else None, lobby.prefix)
        command = nolag.lobby_subscribe(lobby_id, spec, self.wire.id, bool(subscribe))
        if subscribe:
            self.lobbies.add(lobby_id)

        def merged(parts: list) -> None:
            presence: dict[str, dict[str, Any]] = {}
            for part in parts:
                if isinstance(part, dict):
                    presence.update(part)
            frame = codec.lobby_subscribed if subscribe else codec.lobby_presence_list
            self._send(frame(lobby_id, presence))

        self._ask_all(command, merged)

    # -- timers and close -----------------------------------------------------------------------

    def on_tick(self, now: float) -> None:
        if self.closed:
            return
        config = self.config
        if self.key is None and now - self.opened > config.auth_timeout_s:
            self._send(codec.error("auth_timeout", hint=f"send auth within {config.auth_timeout_s:g} s"))
            self._shut(1008, "no auth within the time limit")
            return
        if now - self.wire.last_activity > config.heartbeat_timeout_s:
            self._shut(1001, "heartbeat timeout")
            return
        if self.key is None:
            return
        flushes = self.wire.flushes
        if flushes != self.flushes_seen:  # written since the last tick (a fan-out does not stamp last_sent)
            self.flushes_seen = flushes
            self.last_sent = now
        if now - self.last_sent > config.heartbeat_interval_s:
            self._send(HEARTBEAT)
        # unacked ones, once the connection acks (and frames the socket did not take)
        self.dialect.redelivered += self.qos.resend_due(now, self._send)
        if self.to_record and not self.recording:
            self._record()  # a record that failed: again
        if self.qos.acks_seen and self.qos.carried and self.replaying is None:
            self._replay_carried()  # a carried replay that failed: again
        if now - self.last_checkpoint >= config.checkpoint_interval_s and self.subs:
            self._checkpoint()

    def _checkpoint(self) -> None:
        """Tell the actor's session shard where to replay from (when that changed)."""
        self.last_checkpoint = time.monotonic()
        self.positions_now()
        state = (self.qos.resume(), self.qos.floors(), self.qos.acks_seen)
        if state == self.checkpointed:
            return
        self.checkpointed = state

        def done(result: Any) -> None:
            if result is None and self.checkpointed is state:
                self.checkpointed = None  # not stored: told again on the next tick

        self._ask_session(nolag.actor_checkpoint(self.actor, *state), done)

    def disconnect(self, reason: str) -> None:
        self._send(codec.disconnect(reason))
        self._shut(1008, reason)

    def _shut(self, code: int, reason: str) -> None:
        self.release()
        self.wire.close(code, reason)

    def released(self) -> None:
        self._relive()  # closed: out of the fan-out's index
        for task in self.tasks:
            task.cancel()
        if self.key is None:
            return
        shards, connection_id = self.shards, self.wire.id
        for link in shards.all(TOPIC):
            shards.send(link, contract.purge(connection_id))
        if self.authenticating:
            return  # the kept state was not read yet: nothing to add to it
        # QoS 2 messages recorded (or on their way) but never written: a replay may write them
        unwritten = tuple(entry.msg_id for entry in self.gated if type(entry) is not bytes
                          and self.qos.needs_record(entry.msg_id, entry.qos))
        if unwritten:
            self._ask_session(nolag.actor_unseen(self.actor, unwritten), None)
        self.positions_now()
        self._ask_session(nolag.actor_checkpoint(self.actor, self.qos.resume(), self.qos.floors(),
                                                 self.qos.acks_seen), None)

    def reannounce(self, link: ShardLink) -> None:
        """The shard behind ``link`` restarted empty: send it what this connection held there.
        Nobody hears of it: subscriptions come back with the last message the connection got on
        each (the shard delivers what its log holds after it), presence comes back quietly."""
        if self.key is None:
            return
        self.positions_now()
        shards, project, connection_id = self.shards, self.project, self.wire.id
        if shards.link(SESSION, actor_key(self.actor)) is link:
            for topic, sub in self.subs.items():
                shards.send(link, nolag.actor_save(self.actor, topic, sub.record(), self.qos.positions.get(topic)))
            self.checkpointed = None
            self._checkpoint()
        positions = self.qos.positions
        for topic, sub in self.subs.items():
            key = topic_key(project, topic)
            if shards.link(TOPIC, key) is link:
                shards.send(link, nolag.subscribe(key, connection_id, self.actor, sub.filters, sub.qos, sub.group,
                                                  positions.get(topic)))
        for room in self.rooms:
            key = room_key(project, room)
            if shards.link(TOPIC, key) is link:
                shards.send(link, nolag.room(key, connection_id, True))
        for room, (data, joined_at) in self.present.items():
            key = room_key(project, room)
            if shards.link(TOPIC, key) is link:
                shards.send(link, nolag.presence_restore(key, connection_id, self.actor, data, joined_at))
        for lobby_id in self.lobbies:
            lobby = self.config.lobbies[lobby_id]
            spec = LobbySpec(project, tuple(lobby.rooms) if lobby.rooms is not None else None, lobby.prefix)
            shards.send(link, nolag.lobby_subscribe(lobby_id, spec, connection_id, True))

    # -- plumbing -------------------------------------------------------------------------------

    def _send(self, frame: bytes) -> bool:
        """The server writes a connection's frames of one loop turn together (``Connection._cork``)."""
        self.last_sent = time.monotonic()
        return self.wire.send_binary(frame)

    def _ask(self, key: str, command: tuple, on_result: Any, failures: bool = False) -> None:
        shards = self.shards

        def done(result: Any) -> None:
            if self.closed or on_result is None:
                return
            if isinstance(result, (ShardUnavailable, CommandError)) and not failures:
                self._send(codec.error("internal_error", hint="the router could not complete the request; retry"))
                return
            on_result(result)

        shards.send(shards.link(TOPIC, key), command, done)

    def _ask_all(self, command: tuple, on_results: Any) -> None:
        def collected(results: list) -> None:
            if not self.closed:
                on_results(results)

        self.shards.send_all(self.shards.all(TOPIC), command, collected)

    def _ask_session(self, command: tuple, on_result: Any) -> None:
        shards = self.shards

        def done(result: Any) -> None:
            if not self.closed and on_result is not None:
                on_result(None if isinstance(result, (ShardUnavailable, CommandError)) else result)

        shards.send(shards.link(SESSION, actor_key(self.actor)), command, done)

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _wait(self, call: Callable[[], Awaitable], resume: Callable[[Any], None]) -> None:
        """A frame needs the key store (off the event loop): it goes on with ``resume(answer)`` of
        ``await call()`` (the exception, if it failed), and the frames that arrive meanwhile wait
        behind it, so the connection's frames are still handled in the order they came."""
        self.waiting, self.waiting_bytes = deque(), 0
        self._spawn(self._resume(call, resume))

    async def _resume(self, call: Callable[[], Awaitable], resume: Callable[[Any], None]) -> None:
        try:
            answer = await call()
        except Exception as failure:
            logger.warning("nolag: the key store failed: %r", failure)
            answer = failure
        if self.closed:
            return
        waiting, self.waiting = self.waiting, None
        try:
            resume(answer)
            while waiting and self.waiting is None and not self.closed:
                self._receive(*waiting.popleft())
        except Exception:  # as the server does when a frame fails
            logger.exception("connection %s: nolag failed on a message", self.wire.id)
            self._shut(1011, "internal error")
            return
        if self.waiting is not None:  # a frame waits again: the rest stay behind it
            self.waiting.extend(waiting)
            self.waiting_bytes += sum(len(data) for data, _ in waiting)


def _selects(sub: _Subscription, filter_: str | None) -> bool:
    """As the topic shard routes: wildcard subscriptions get everything, filtered ones their filters."""
    return not sub.filters or (filter_ is not None and filter_ in sub.filters)


def endpoints(gateway: Any, config: Any) -> list[Dialect]:
    """What a gateway serves of this dialect (the dialect table calls it)."""
    return [NolagDialect(gateway, config)]
