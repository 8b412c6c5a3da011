"""Signal Hub: one connection's state machine, and the dialect that serves it.

Per connection: connect (version, JWT) -> connected -> disconnect/close. Each message passes, in
this order and before any expensive work: the size check (on the raw frame), the rate limit
(token bucket), JSON parsing, envelope validation, TTL expiry, authentication and capability.

Replies leave in the order the requests came (a request answered by a shard holds a slot in the
reply queue); messages delivered from other actors are written as they arrive.
"""

from __future__ import annotations

import heapq
import logging
import math
import secrets
import time
from collections import deque
from itertools import islice
from typing import Any, Callable

from actors.signal import contract as signal
from actors.signal.contract import REGISTRY, topic_key
from gateways.dialect import Dialect, DialectSession, Wire
from gateways.signal import codec
from gateways.signal.auth import AuthError, Identity, TokenVerifier
from gateways.signal.codec import Request, SignalError
from gateways.signal.config import SignalHubConfig
from gateways.signal.quota import Holdings
from router.errors import CommandError, ShardUnavailable
from router.patterns import PatternError, compile_pattern
from router.ratelimit import TokenBucket
from router import contract
from router.contract import DELIVER_TEXT, now_ms
from router.shardmap import TOPIC

logger = logging.getLogger(__name__)

DIALECT = "signal"
_EMPTY = b""  # a reply slot that ends without a frame
# Per connection, for its publishes: (address, topic) pairs whose delivery-ack start it keeps, and
# topics whose key and shard link it keeps; for its hub:sends, the addresses whose registry shard
# link it keeps. A client uses a few; at 16 a connection keeps at most about 20 KB for the first two
# with topics of max_topic_length (256) characters, and about 3 KB for the third.
ACK_HEADS_MAX = 16
ROUTES_MAX = 16

# Which capability each message type needs (auth enabled or not; anonymous sessions get
# `anonymous_capabilities`). Connection control needs none.
REQUIRED_CAPABILITY = {
    "hub:register": "receive",
    "hub:renew": "receive",
    "hub:discover": "discover",
    "hub:list_actors": "discover",
    "hub:send": "send",
    "hub:broadcast": "broadcast",
    "hub:subscribe": "subscribe",
    "hub:unsubscribe": "subscribe",
    "hub:publish": "publish",
}


class SignalHubDialect(Dialect):
    name = DIALECT

    def __init__(self, gateway: Any, config: SignalHubConfig) -> None:
        super().__init__(gateway)
        self.config = config
        self.verifier = TokenVerifier(config.auth) if config.auth.enabled else None
        self.hub = config.hub_address
        burst = config.rate_limit_burst or max(1, int(config.rate_limit_per_minute))
        self.bucket_rate = config.rate_limit_per_minute / 60.0
        self.bucket_capacity = float(burst)

    def new_session(self, wire: Wire, request_headers: Any) -> "SignalSession":
        return SignalSession(self, wire)

    def stats(self) -> dict[str, Any]:
        return {"connections": len(self.sessions), "connected": sum(1 for s in self.sessions if s.connected)}


class SignalSession(DialectSession):
    def __init__(self, dialect: SignalHubDialect, wire: Wire) -> None:
        super().__init__(dialect, wire)
        self.hub = dialect.hub
        self._seq = 0
        self._t0 = 0
        self._current_meta: tuple | None = None
        self._topic: str | None = None
        self.session_id: str | None = None
        self.identity: str | None = None
        self.capabilities: frozenset[str] = frozenset()
        self.token_expires_ms: int | None = None
        self.closing = False
        self.cleaned = False
        self.last_seen = time.monotonic()
        self.bucket = TokenBucket(dialect.bucket_rate, dialect.bucket_capacity, self.last_seen)
        self.replies: deque[list] = deque()
        self._ack_heads: dict[tuple[str, str], bytes] = {}  # (to, topic) -> codec.delivery_ack_head
        self._routes: dict[str, tuple[str, str, Any]] = {}  # topic -> (topic, key, link): _route
        self._targets: dict[str, Any] = {}  # address -> its registry shard's link: _target_link
        self._close_when_answered: tuple[int, str] | None = None
        self.in_flight = 0
        self.processed = 0
        self.failed = 0
        self.registrations = Holdings(self.config.max_registrations_per_connection)
        self.subscriptions = Holdings(self.config.max_subscriptions_per_connection)
        # What this connection holds in the shards, as last answered, to re-announce to one that
        # restarted empty: address -> Registration, topic -> subscriber address.
        self.registered: dict[str, Any] = {}
        self.subscribed: dict[str, str] = {}
        self._handlers: dict[str, Callable[[Request], None]] = {
            "hub:connect": self._connect,
            "hub:heartbeat": self._heartbeat,
            "hub:disconnect": self._disconnect,
            "hub:register": self._register,
            "hub:unregister": self._unregister,
            "hub:renew": self._renew,
            "hub:discover": self._discover,
            "hub:list_actors": self._list_actors,
            "hub:send": self._send,
            "hub:broadcast": self._broadcast,
            "hub:subscribe": self._subscribe,
            "hub:publish": self._publish,
            "hub:unsubscribe": self._unsubscribe,
            "hub:queue_stats": self._queue_stats,
        }

    @property
    def connected(self) -> bool:
        return self.session_id is not None

    # -- transport events -----------------------------------------------------------------

    def on_message(self, data: bytes, is_text: bool) -> None:
        now = time.monotonic()
        self.last_seen = now
        if self.closing:
            return
        self.processed += 1
        self._seq = self.gateway.next_seq()
        self._t0 = time.time_ns()
        self._topic = None
        self._current_meta = None
        if len(data) > self.config.max_message_bytes:
            self._refuse(SignalError(
                codec.MESSAGE_TOO_LARGE,
                f"Message of {len(data)} bytes exceeds the limit of {self.config.max_message_bytes} bytes",
                {"size": len(data), "maxSize": self.config.max_message_bytes},
            ), None, len(data))
            return
        wait = self.bucket.take(now)
        if wait:
            limit = self.config.rate_limit_per_minute
            limit = int(limit) if float(limit).is_integer() else limit
            self._refuse(SignalError(
                codec.RATE_LIMITED,
                f"Rate limit of {limit:g} messages per minute exceeded",
                {"retryAfter": TokenBucket.retry_after_ms(wait), "limit": limit, "window": "1m"},
            ), None, len(data))
            return
        try:
            request = codec.decode(data)
        except SignalError as error:
            self._refuse(error, None, len(data))
            return
        try:
            self._check(request)
            self._handlers[request.type](request)
        except SignalError as error:
            if error.reply_id is None:
                error.reply_id = request.reply_id
            if error.reply_to is None:
                error.reply_to = request.sender
            self._refuse(error, request, len(data))
            return
        meta = self._current_meta  # the handler's, when it built one
        self.gateway.accepted(self._meta(request.type) if meta is None else meta, request.reply_id, len(data),
                              self.wire.id)

    def _meta(self, kind: str | None) -> tuple:
        """Where and when the current message entered: travels with its deliveries (event log, latency).

        Built once per message: by its handler (after it has set the topic) or, for messages that go
        nowhere, when the message is counted as accepted or refused.
        """
        meta = self._current_meta
        if meta is None:
            meta = self._current_meta = contract.event_meta(self.gateway.id, self._seq, self._t0, DIALECT, kind,
                                                            self._topic)
        return meta

    def on_tick(self, now: float) -> None:
        if not self.closing and now - self.last_seen > self.config.heartbeat_timeout_s:
            self.closing = True
            self._cleanup()
            self.wire.close(1001, "heartbeat timeout")

    def released(self) -> None:
        self.closing = True
        self._cleanup()

    def reannounce(self, link: Any) -> None:
        """Registrations (same token, version and remaining TTL) and subscriptions this connection
        holds on the restarted shard behind ``link``."""
        if self.closing or self.cleaned:
            return
        shards, connection_id, now = self.shards, self.wire.id, now_ms()
        for address, registration in list(self.registered.items()):
            if registration.expires_at <= now:
                del self.registered[address]
            elif shards.link(REGISTRY, address) is link:
                shards.send(link, signal.restore(
                    address, connection_id, registration.session_id, registration.capabilities, registration.metadata,
                    registration.registered_at, registration.expires_at, registration.version,
                    registration.renewal_token))
        for topic, address in self.subscribed.items():
            key = topic_key(topic)
            if shards.link(TOPIC, key) is link:
                shards.send(link, contract.subscribe(key, connection_id, address))

    # -- checks ---------------------------------------------------------------------------

    def _check(self, request: Request) -> None:
        """Expiry, connection state, token lifetime, identity and capability, in that order."""
        if request.ttl is not None:  # the clock is read only when a message or a token can expire
            now = now_ms()
            if codec.is_expired(request, now):
                raise SignalError(codec.MESSAGE_EXPIRED, "Message TTL exceeded before it reached the hub",
                                  {"timestamp": request.timestamp, "ttl": request.ttl, "serverTime": now},
                                  request.reply_id, request.sender)
        kind = request.type
        if kind == "hub:connect":
            return
        if self.session_id is None:  # not connected (the property, without its call: every message asks)
            raise SignalError(codec.UNAUTHORIZED, "Send hub:connect first", None, request.reply_id, request.sender)
        if kind == "hub:disconnect":
            return
        if self.token_expires_ms is not None and now_ms() >= self.token_expires_ms:
            raise SignalError(codec.UNAUTHORIZED, "JWT expired; reconnect with a fresh token",
                              {"expiredAt": self.token_expires_ms}, request.reply_id, request.sender)
        if self.dialect.verifier is not None and request.sender != self.identity:
            raise SignalError(codec.UNAUTHORIZED, f"'from' must be the authenticated actor {self.identity}",
                              {"actorId": self.identity, "from": request.sender}, request.reply_id, request.sender)
        needed = REQUIRED_CAPABILITY.get(kind)
        if needed is not None and needed not in self.capabilities:
            raise SignalError(codec.UNAUTHORIZED, f"Missing capability '{needed}' for {request.type}",
                              {"required": needed, "capabilities": sorted(self.capabilities)},
                              request.reply_id, request.sender)

    # -- replies --------------------------------------------------------------------------

    def _reply(self, request: Request, kind: str, payload: dict[str, Any]) -> None:
        self._write_in_order(codec.encode(kind, self.hub, request.sender, payload, request.reply_id))

    def _refuse(self, error: SignalError, request: Request | None, nbytes: int) -> None:
        self.failed += 1
        reason = error.code
        if reason == codec.INTERNAL_ERROR and error.details and "reason" in error.details:
            reason = error.details["reason"]
        self.gateway.rejected(self._meta(None if request is None else request.type),
                              None if request is None else request.reply_id, nbytes, self.wire.id, reason)
        to = error.reply_to or self.identity
        self._write_in_order(codec.encode_error(self.hub, to, error.code, error.message, error.details, error.reply_id))

    def _write_in_order(self, frame: bytes) -> None:
        if self.replies:
            self.replies.append([frame])
        else:
            self.wire.send_text(frame)

    def _slot(self) -> list:
        slot: list = [None]
        self.replies.append(slot)
        self.in_flight += 1
        return slot

    def _fill(self, slot: list, frame: bytes) -> None:
        slot[0] = frame
        self.in_flight -= 1
        replies = self.replies
        while replies and replies[0][0] is not None:
            frame = replies.popleft()[0]
            if frame:
                self.wire.send_text(frame)
        if not replies and self._close_when_answered is not None:
            self.wire.close(*self._close_when_answered)
            self._close_when_answered = None

    def _close_after_replies(self, code: int, reason: str) -> None:
        """Close once every reply queued so far is written (the disconnect ack goes out first)."""
        if self.replies:
            self._close_when_answered = (code, reason)
        else:
            self.wire.close(code, reason)

    def _fill_error(self, slot: list, request: Request, error: SignalError) -> None:
        self.failed += 1
        self._fill(slot, codec.encode_error(self.hub, request.sender, error.code, error.message, error.details,
                                            request.reply_id))

    def _shard_failure(self, result: Any, request: Request) -> SignalError:
        if isinstance(result, ShardUnavailable) and result.timed_out:
            return SignalError(codec.TIMEOUT, f"{request.type} timed out; retry with backoff",
                               {"timeoutMs": int(self.config.request_timeout_s * 1000)})
        if isinstance(result, ShardUnavailable):
            return SignalError(codec.INTERNAL_ERROR, "The router could not complete the request; retry",
                               {"reason": "shard_unavailable"})
        assert isinstance(result, CommandError)
        code = {
            "conflict": codec.UNKNOWN_ACTOR,  # the spec reuses unknown_actor for conflicts
            "unknown_actor": codec.UNKNOWN_ACTOR,
            "not_owner": codec.UNAUTHORIZED,
            "bad_renewal_token": codec.UNAUTHORIZED,
            "registry_full": codec.RATE_LIMITED,
        }.get(result.code, codec.INTERNAL_ERROR)
        details = dict(result.details)
        if code == codec.INTERNAL_ERROR:
            details.setdefault("reason", result.code)
        return SignalError(code, result.message, details or None)

    def _ask(self, request: Request, kind: str, key: str, command: tuple, on_result: Callable[[Any], dict | None],
             reply_type: str, settle: Callable[[Any], None] | None = None) -> None:
        """Send one command to the shard owning ``key``; reply with ``on_result(result)`` in order.
        ``settle(result)`` first sees every answer, failures included (the quotas count them)."""
        shards = self.shards
        answer = _Answer(self, self._slot(), request, on_result, reply_type, settle)
        shards.send(shards.link(kind, key), command, answer)

    def _ask_all(self, request: Request, kind: str, command: tuple,
                 on_results: Callable[[list], dict], reply_type: str) -> None:
        """Send ``command`` to every shard of ``kind``; reply once all have answered."""
        slot = self._slot()

        def collect(results: list) -> None:
            if self._all_answered(slot, request, results):
                self._fill(slot, codec.encode(reply_type, self.hub, request.sender, on_results(results),
                                              request.reply_id))

        self.shards.send_all(self.shards.all(kind), command, collect)

    def _all_answered(self, slot: list, request: Request, results: list) -> bool:
        """Whether every shard answered; if one failed, its error fills ``slot``."""
        failure = next((r for r in results if isinstance(r, (CommandError, ShardUnavailable))), None)
        if failure is not None:
            self._fill_error(slot, request, self._shard_failure(failure, request))
        return failure is None

    def _over_quota(self, holdings: Holdings, what: str, undo: str) -> SignalError:
        return SignalError(codec.RATE_LIMITED,
                           f"This connection holds {holdings.limit} {what}, the limit; {undo} one first",
                           {"limit": holdings.limit, "reason": f"{what}_per_connection"})

    # -- connection lifecycle -------------------------------------------------------------

    def _connect(self, request: Request) -> None:
        payload = request.payload
        version = payload.get("version")
        expected = self.config.protocol_version
        if version != expected:
            raise SignalError(codec.VERSION_MISMATCH, f"Protocol version {expected} required, got {version}",
                              {"expected": expected, "received": version}, request.reply_id, request.sender)
        identity = self._authenticate(request)
        if self.connected and identity.actor_id != self.identity:
            raise SignalError(codec.UNAUTHORIZED, f"This connection is bound to {self.identity}",
                              {"actorIdentity": self.identity}, request.reply_id, request.sender)
        self.identity = identity.actor_id
        self.capabilities = frozenset(identity.capabilities)
        self.token_expires_ms = identity.expires_at_ms
        if self.session_id is None:
            self.session_id = "sess_" + secrets.token_hex(12)
        self._reply(request, "hub:connected", {
            "sessionId": self.session_id,
            "actorIdentity": self.identity,
            "capabilities": list(identity.capabilities),
            "serverTime": now_ms(),
        })

    def _authenticate(self, request: Request) -> Identity:
        verifier = self.dialect.verifier
        if verifier is None:
            return Identity(request.sender, tuple(self.config.anonymous_capabilities), None)
        token = request.payload.get("jwt")
        if not isinstance(token, str) or not token:
            raise SignalError(codec.UNAUTHORIZED, "A JWT is required (payload.jwt)", None,
                              request.reply_id, request.sender)
        try:
            identity = verifier.verify(token)
        except AuthError as error:
            raise SignalError(codec.UNAUTHORIZED, str(error), None, request.reply_id, request.sender) from None
        actor_id = codec.normalize_address(identity.actor_id)
        if actor_id != request.sender:
            raise SignalError(codec.UNAUTHORIZED, "JWT actorId does not match 'from'",
                              {"actorId": identity.actor_id, "from": request.sender},
                              request.reply_id, request.sender)
        return Identity(actor_id, identity.capabilities, identity.expires_at_ms)

    def _heartbeat(self, request: Request) -> None:
        self._reply(request, "hub:heartbeat_ack", {"serverTime": now_ms()})

    def _disconnect(self, request: Request) -> None:
        self.closing = True
        # The ack is written before the close frame (spec 3.1), so the client receives it.
        self._cleanup_then(request, self.session_id, lambda: self._close_after_replies(1000, "disconnect"))

    def _cleanup_then(self, request: Request, session_id: str | None, then: Callable[[], None]) -> None:
        """Purge the connection from every topic and registry shard, reply, then ``then()``."""
        slot = self._slot()

        def collect(results: list) -> None:
            cleaned_up = not any(isinstance(result, (CommandError, ShardUnavailable)) for result in results)
            self._fill(slot, codec.encode("hub:disconnect_ack", self.hub, request.sender,
                                          {"sessionId": session_id, "cleanedUp": cleaned_up}, request.reply_id))
            then()

        self.cleaned = True
        self.shards.send_all(self.shards.all(TOPIC) + self.shards.all(REGISTRY), contract.purge(self.wire.id), collect)

    def _cleanup(self) -> None:
        """Fire-and-forget purge when the connection ends without hub:disconnect."""
        if self.cleaned:
            return
        self.cleaned = True
        for link in self.shards.all(TOPIC) + self.shards.all(REGISTRY):
            self.shards.send(link, contract.purge(self.wire.id))

    # -- registration ---------------------------------------------------------------------

    def _register(self, request: Request) -> None:
        payload = request.payload
        address = codec.address_field(payload, "actorAddress", request.sender)
        if self.dialect.verifier is not None and address != self.identity:
            raise SignalError(codec.UNAUTHORIZED, f"The token allows registering {self.identity} only",
                              {"actorId": self.identity, "actorAddress": address})
        config = self.config
        capabilities = codec.string_list_field(payload, "capabilities", config.max_capabilities)
        metadata = codec.object_field(payload, "metadata", config.max_metadata_bytes)
        ttl = min(codec.int_field(payload, "ttl", config.default_ttl_ms, 1, 2**53), config.max_ttl_ms)
        session_id = self.session_id
        if not self.registrations.reserve(address, time.monotonic()):
            raise self._over_quota(self.registrations, "registrations", "unregister")

        def settle(result: Any) -> None:
            # Counted until its TTL from now, which ends no sooner than the shard's own expiry.
            until = None if isinstance(result, CommandError) else time.monotonic() + ttl / 1000
            self.registrations.settle(address, until)

        def registered(registration: Any) -> dict:
            self.registered[registration.address] = registration
            return {
                "actorAddress": registration.address,
                "renewalToken": registration.renewal_token,
                "expiresAt": registration.expires_at,
                "version": registration.version,
            }

        self._ask(request, REGISTRY, address,
                  signal.register(address, self.wire.id, session_id, capabilities, metadata, ttl),
                  registered, "hub:registered", settle)

    def _unregister(self, request: Request) -> None:
        address = codec.address_field(request.payload, "actorAddress", request.sender)

        def settle(result: Any) -> None:
            # Refused (not registered, or by another connection) or done: this connection holds it no more.
            if not isinstance(result, ShardUnavailable):
                self.registrations.release(address)

        def unregistered(at: int) -> dict:
            self.registered.pop(address, None)
            return {"actorAddress": address, "unregisteredAt": at}

        self._ask(request, REGISTRY, address, signal.unregister(address, self.wire.id), unregistered,
                  "hub:unregistered", settle)

    def _renew(self, request: Request) -> None:
        payload = request.payload
        address = codec.address_field(payload, "actorAddress", request.sender)
        token = codec.string_field(payload, "renewalToken", 256)
        config = self.config
        ttl = min(codec.int_field(payload, "ttl", config.default_ttl_ms, 1, 2**53), config.max_ttl_ms)

        def settle(result: Any) -> None:
            if not isinstance(result, CommandError):
                self.registrations.hold(address, time.monotonic() + ttl / 1000)

        def renewed(registration: Any) -> dict:
            self.registered[registration.address] = registration
            return {"actorAddress": registration.address, "expiresAt": registration.expires_at,
                    "newRenewalToken": registration.renewal_token}

        self._ask(request, REGISTRY, address, signal.renew(address, self.wire.id, token, ttl), renewed,
                  "hub:renewed", settle)

    # -- discovery ------------------------------------------------------------------------

    def _discover(self, request: Request) -> None:
        payload = request.payload
        config = self.config
        pattern = payload.get("pattern")
        if pattern is not None:
            if not isinstance(pattern, str):
                raise codec.invalid("payload.pattern must be a string", field="payload.pattern")
            try:
                compile_pattern(pattern, config.max_pattern_length)
            except PatternError as error:
                raise codec.invalid(str(error), "invalid_pattern", field="payload.pattern") from None
        capabilities = codec.string_list_field(payload, "capabilities", config.max_capabilities)
        metadata = codec.object_field(payload, "metadata", config.max_metadata_bytes)
        self._query(request, pattern, capabilities, metadata)

    def _list_actors(self, request: Request) -> None:
        self._query(request, None, [], {})

    def _query(self, request: Request, pattern: str | None, capabilities: list[str], metadata: dict) -> None:
        """Two steps, each bounded by the page: every registry shard answers the addresses of its first
        offset + limit matches (no metadata); the owners of the page's addresses then describe them."""
        config = self.config
        payload = request.payload
        limit = codec.clamped_int_field(payload, "limit", config.discover_default_limit, 1, config.discover_max_limit)
        offset = codec.int_field(payload, "offset", 0, 0, config.max_discover_offset)
        slot = self._slot()
        shards = self.shards

        def matched(results: list) -> None:
            if not self._all_answered(slot, request, results):
                return
            total = sum(count for count, _ in results)
            page = list(islice(heapq.merge(*(addresses for _, addresses in results)), offset, offset + limit))
            owners: dict[Any, list[str]] = {}
            for address in page:
                owners.setdefault(shards.link(REGISTRY, address), []).append(address)
            shards.send_each([(link, signal.describe(addresses)) for link, addresses in owners.items()],
                             lambda described: reply(total, page, described))

        def reply(total: int, page: list[str], results: list) -> None:
            if not self._all_answered(slot, request, results):
                return
            entries = {entry["actorAddress"]: entry for described in results for entry in described}
            # A registration gone between the two steps is left out.
            actors = codec.fit([entries[address] for address in page if address in entries],
                               config.max_discover_reply_bytes)
            self._fill(slot, codec.encode("hub:discovery_result", self.hub, request.sender, {
                "actors": actors, "count": len(actors), "hasMore": offset + len(actors) < total,
                "totalMatches": total,
            }, request.reply_id))

        shards.send_all(shards.all(REGISTRY), signal.discover(pattern, capabilities, metadata or None, offset + limit),
                        matched)

    # -- messaging ------------------------------------------------------------------------

    def _send(self, request: Request) -> None:
        target = request.payload.get("to")
        target = codec.normalize_address(target) if target is not None else request.to
        if target is None:
            raise codec.invalid("hub:send needs a target address in 'to' (or payload.to)", "invalid_address",
                                field="to")
        # Fire-and-forget on success; the slot keeps a failure in order with the other replies.
        slot = self._slot()
        self._topic = target
        meta = self._meta(request.type)
        link = self._targets.get(target)
        if link is None:
            link = self._target_link(target)
        self.shards.send(link, signal.send(target, request.raw, DELIVER_TEXT, meta),
                         _Sent(self, slot, request, meta, target))

    def _target_link(self, target: str) -> Any:
        """The registry shard's link for ``hub:send``s to ``target``, kept for the next one (a sender
        sends to a few addresses; hashing the address was 2 % of a point-to-point flood). Bounded
        (:data:`ROUTES_MAX`) as the topics' routes are, and only for addresses of the length
        ``codec.normalize_address`` keeps: an address has no length limit of its own, and a
        connection must not hold 16 of them the size of a message."""
        link = self.shards.link(REGISTRY, target)
        if len(target) <= codec.KNOWN_ADDRESS_LENGTH:
            if len(self._targets) >= ROUTES_MAX:
                self._targets.clear()
            self._targets[target] = link
        return link

    def _broadcast(self, request: Request) -> None:
        exclude_self = request.payload.get("excludeSelf", False)
        if not isinstance(exclude_self, bool):
            raise codec.invalid("payload.excludeSelf must be a boolean", field="payload.excludeSelf")
        exclude = self.wire.id if exclude_self else None

        def counted(results: list[int]) -> dict:
            total = sum(results)
            return {"recipientCount": total, "successCount": total, "failureCount": 0}

        self._ask_all(request, REGISTRY, signal.broadcast(request.raw, DELIVER_TEXT, exclude, self._meta(request.type)),
                      counted, "hub:broadcast_ack")

    # -- pub/sub --------------------------------------------------------------------------

    def _topic_of(self, request: Request) -> str:
        topic = codec.string_field(request.payload, "topic", self.config.max_topic_length)
        self._topic = topic
        return topic

    def _subscribe(self, request: Request) -> None:
        topic = self._topic_of(request)
        address = request.payload.get("actorAddress", request.sender)
        address = codec.normalize_address(address) or request.sender

        if not self.subscriptions.reserve(topic, time.monotonic()):
            raise self._over_quota(self.subscriptions, "subscriptions", "unsubscribe")

        def settle(result: Any) -> None:
            self.subscriptions.settle(topic, None if isinstance(result, CommandError) else math.inf)

        def subscribed(_: bool) -> dict:
            self.subscribed[topic] = address
            return {"topic": topic, "subscribedAt": now_ms()}

        key = topic_key(topic)
        self._ask(request, TOPIC, key, contract.subscribe(key, self.wire.id, address), subscribed, "hub:subscribed",
                  settle)

    def _unsubscribe(self, request: Request) -> None:
        topic = self._topic_of(request)

        def settle(result: Any) -> None:
            if not isinstance(result, ShardUnavailable):
                self.subscriptions.release(topic)

        def unsubscribed(_: bool) -> dict:
            self.subscribed.pop(topic, None)
            return {"topic": topic, "unsubscribedAt": now_ms()}

        key = topic_key(topic)
        self._ask(request, TOPIC, key, contract.unsubscribe(key, self.wire.id), unsubscribed, "hub:unsubscribed",
                  settle)

    def _publish(self, request: Request) -> None:
        # A kept route's topic passed the topic's checks when it was kept: one lookup instead.
        topic = request.payload.get("topic")
        route = self._routes.get(topic) if type(topic) is str else None
        if route is None:
            route = self._route(self._topic_of(request))
        topic, key, link = route
        self._topic = topic  # the kept str: a batch to the shard pickles it once, its hash is kept
        self.shards.send(link, contract.publish(key, request.raw, DELIVER_TEXT, None, self._meta(request.type)),
                         _Published(self, self._slot(), request, topic))

    def _route(self, topic: str) -> tuple[str, str, Any]:
        """Where this connection's publishes to ``topic`` go: the topic, its key and its shard's
        link, kept for the next publish (the links never change; a restarted shard keeps its
        link). Bounded (:data:`ROUTES_MAX`): emptied when full."""
        if len(self._routes) >= ROUTES_MAX:
            self._routes.clear()
        key = topic_key(topic)
        route = self._routes[topic] = (topic, key, self.shards.link(TOPIC, key))
        return route

    def _delivery_ack_head(self, to: str, topic: str) -> bytes:
        """The start of this connection's ``hub:delivery_ack`` to ``to`` about ``topic``, kept for
        the next publish (a connection publishes to a few topics, from one address when
        authenticated); bounded (:data:`ACK_HEADS_MAX`): emptied when full."""
        key = (to, topic)
        head = self._ack_heads.get(key)
        if head is None:
            if len(self._ack_heads) >= ACK_HEADS_MAX:
                self._ack_heads.clear()
            head = self._ack_heads[key] = codec.delivery_ack_head(self.hub, to, topic)
        return head

    # -- flow control ---------------------------------------------------------------------

    def _queue_stats(self, request: Request) -> None:
        self._reply(request, "hub:queue_stats_result", {
            "pending": self.in_flight,
            "processed": self.processed,
            "failed": self.failed + self.wire.dropped,
            "paused": self.wire.writing_paused,
        })


# -- answers of shards ------------------------------------------------------------------------
# Plain objects, not closures: a request in flight holds one GC-tracked object instead of a
# function, its cells and their tuple. A flood holds thousands of requests in flight, and the
# cyclic collector walks each of them at every young collection it outlives.


class _Answer:
    """A shard's answer to one request (:meth:`SignalSession._ask`), made into its reply in order."""

    __slots__ = ("session", "slot", "request", "on_result", "reply_type", "settle")

    def __init__(self, session: SignalSession, slot: list, request: Request, on_result: Callable[[Any], dict | None],
                 reply_type: str, settle: Callable[[Any], None] | None) -> None:
        self.session, self.slot, self.request = session, slot, request
        self.on_result, self.reply_type, self.settle = on_result, reply_type, settle

    def __call__(self, result: Any) -> None:
        session, request = self.session, self.request
        if self.settle is not None:
            self.settle(result)
        if isinstance(result, (CommandError, ShardUnavailable)):
            session._fill_error(self.slot, request, session._shard_failure(result, request))
            return
        payload = self.on_result(result)
        session._fill(self.slot, _EMPTY if payload is None else
                      codec.encode(self.reply_type, session.hub, request.sender, payload, request.reply_id))


class _Published:
    """The topic shard's answer to one ``hub:publish`` (its subscribers, each delivered to): the
    ``hub:delivery_ack``, in order with the other replies. Every publish is answered: its ack is
    formatted from the connection's kept start (:func:`codec.delivery_ack`), not built as a dict."""

    __slots__ = ("session", "slot", "request", "topic")

    def __init__(self, session: SignalSession, slot: list, request: Request, topic: str) -> None:
        self.session, self.slot, self.request, self.topic = session, slot, request, topic

    def __call__(self, result: Any) -> None:
        session, request = self.session, self.request
        if result.__class__ is not int and isinstance(result, (CommandError, ShardUnavailable)):  # int: a count
            session._fill_error(self.slot, request, session._shard_failure(result, request))
            return
        session._fill(self.slot, codec.delivery_ack(session._delivery_ack_head(request.sender, self.topic), result,
                                                    request.reply_id))


class _Sent:
    """The registry shard's answer to one ``hub:send``: nothing to write when it was delivered;
    else the failure, in order with the other replies."""

    __slots__ = ("session", "slot", "request", "meta", "target")

    def __init__(self, session: SignalSession, slot: list, request: Request, meta: tuple, target: str) -> None:
        self.session, self.slot, self.request, self.meta, self.target = session, slot, request, meta, target

    def __call__(self, result: Any) -> None:
        session = self.session
        if result is True:
            session._fill(self.slot, _EMPTY)
            return
        request, target = self.request, self.target
        if isinstance(result, (CommandError, ShardUnavailable)):
            error = session._shard_failure(result, request)
        else:
            error = SignalError(codec.UNKNOWN_ACTOR, f"Actor {target} not registered or disconnected",
                                {"targetActor": target})
        session.gateway.unroutable(self.meta, len(request.raw), error.code)
        session._fill_error(self.slot, request, error)


def endpoints(gateway: Any, config: Any) -> list[Dialect]:
    """What a gateway serves of this dialect (the dialect table calls it)."""
    return [SignalHubDialect(gateway, config)]
