"""Cashu NUT-17: one wallet connection's subscriptions, the dialect, and the mint's state feed.

Every subscribed object (a quote id or a proof Y) is a key ``cashu/<kind>/<id>`` owned by one topic
shard, which keeps the object's last state (a retained value, :mod:`actors.cashu.retained`). A
subscription sends its keys to their shards: each shard subscribes the connection and returns the
current states in one step, so every later state reaches the connection as a delivery.

A subscription's keys are grouped by the shard that owns them: one command per shard, however
many filters (``cashu.max_filters`` bounds them before any work).

Order on the wire, per subscription: the OK reply, then the current state of each object, then
every later change. The OK waits until every shard has answered; deliveries that arrive before
that are held. Each state carries a version (per object), and a subscription forwards a state
only if it is newer than the last one it forwarded, so neither the race between results and
deliveries nor a second subscription to the same object can reorder or repeat a state.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from typing import Any, Iterable

import orjson

from actors.cashu import contract as cashu
from actors.cashu.contract import RetainedEvent
from gateways.cashu import codec
from gateways.cashu.codec import Limits, RpcError, StateError, Subscribe, Unsubscribe
from gateways.cashu.mint import MintClient
from gateways.dialect import Dialect, DialectSession, HttpRequest, HttpResponse, HttpRoute, Wire
from gateways.cashu.config import CashuConfig
from gateways.shardclient import ShardLink
from router import contract
from router.errors import CommandError, ShardUnavailable
from router.ratelimit import TokenBucket
from router.shardmap import TOPIC

logger = logging.getLogger(__name__)

DIALECT = "cashu"
_ERROR_REASONS = {
    codec.PARSE_ERROR: "parse_error",
    codec.INVALID_REQUEST: "invalid_request",
    codec.METHOD_NOT_FOUND: "method_not_found",
    codec.INVALID_PARAMS: "invalid_params",
    codec.INTERNAL_ERROR: "internal_error",
    codec.LIMIT_EXCEEDED: "rate_limited",
}


def _json(status: int, body: Any) -> HttpResponse:
    return HttpResponse(status, orjson.dumps(body))


class CashuDialect(Dialect):
    name = DIALECT

    def __init__(self, gateway: Any, config: CashuConfig) -> None:
        super().__init__(gateway)
        self.config = config
        self.limits = Limits(config.kinds, config.max_filters, config.max_filter_length, config.max_sub_id_length)
        self.mint = (MintClient(config.mint_url, config.mint_timeout_s, config.mint_info_ttl_s,
                                config.mint_max_requests, config.mint_max_pending, config.mint_unknown_ttl_s,
                                config.mint_unknown_cache_size)
                     if config.mint_url else None)
        self._api_key = None if config.state_api_key is None else config.state_api_key.get_secret_value().encode()
        self.notifications = 0
        self.pushed = 0

    def new_session(self, wire: Wire, request_headers: Any) -> "CashuSession":
        return CashuSession(self, wire)

    def http_routes(self) -> list[HttpRoute]:
        return [HttpRoute("GET", self.config.info_path, self._info),
                HttpRoute("POST", self.config.state_path, self._push)]

    async def close(self) -> None:
        if self.mint is not None:
            await self.mint.close()

    def stats(self) -> dict[str, Any]:
        return {
            "connections": len(self.sessions),
            "subscriptions": sum(len(s.subs) for s in self.sessions),
            "notifications": self.notifications,
            "states_pushed": self.pushed,
            "mint_requests": None if self.mint is None else self.mint.requests,
            "mint_skipped": None if self.mint is None else self.mint.skipped,
            "mint_unknown_remembered": None if self.mint is None else len(self.mint.unknown),
        }

    # -- GET /v1/info (NUT-06) ------------------------------------------------------------------

    def supported(self) -> list[dict[str, Any]]:
        return [entry.model_dump() for entry in self.config.supported]

    async def _info(self, request: HttpRequest) -> HttpResponse:
        info = None if self.mint is None else await self.mint.info()
        body = dict(info if info is not None else self.config.info)
        nuts = dict(body.get("nuts") or {})
        nuts["17"] = {"supported": self.supported()}
        body["nuts"] = nuts
        return _json(200, body)

    # -- POST /v1/ws/state: the mint pushes object states -----------------------------------------

    def _authorized(self, request: HttpRequest) -> bool:
        offered = request.header("x-api-key")
        if offered is None:
            authorization = request.header("authorization") or ""
            scheme, _, token = authorization.partition(" ")
            offered = token.strip() if scheme.lower() == "bearer" else ""
        return hmac.compare_digest(offered.encode(), self._api_key)

    async def _push(self, request: HttpRequest) -> HttpResponse:
        if self._api_key is None:
            return _json(403, {"error": "feed_disabled",
                               "message": "the state feed is off: set cashu.state_api_key to turn it on"})
        if not self._authorized(request):
            return _json(401, {"error": "unauthorized",
                               "message": "send the state feed's API key as 'Authorization: Bearer <key>'"})
        try:
            states = codec.decode_states(request.body, self.config.kinds, self.config.max_states_per_push,
                                         self.config.max_filter_length)
        except StateError as error:
            return _json(400, {"error": "invalid_state", "message": str(error)})
        gateway, shards = self.gateway, self.shards
        futures = []
        for state in states:
            key = state.key
            meta = gateway.event_meta(DIALECT, "state", key)
            gateway.accepted(meta, state.object_id, len(state.payload), -1)
            futures.append(shards.request(shards.link(TOPIC, key), cashu.set_state(key, state.payload, meta)))
        results = await asyncio.gather(*futures, return_exceptions=True)
        answer, failed = [], 0
        for state, result in zip(states, results):
            if isinstance(result, BaseException) or isinstance(result, CommandError):
                failed += 1
                answer.append({"kind": state.kind, "id": state.object_id, "stored": False})
            else:
                version, subscribers = result
                answer.append({"kind": state.kind, "id": state.object_id, "stored": True,
                               "version": version, "subscribers": subscribers})
        self.pushed += len(states) - failed
        if failed:
            return _json(503, {"error": "unavailable", "message": f"{failed} state(s) were not stored; push them again",
                               "states": answer})
        return _json(200, {"accepted": len(states), "states": answer})


class _Subscription:
    __slots__ = ("sub_id", "kind", "request_id", "objects", "prefix", "pending", "waiting", "failed", "initial",
                 "held", "last", "cancel_id", "meta")

    def __init__(self, request: Subscribe, meta: tuple) -> None:
        self.sub_id = request.sub_id
        self.kind = request.kind
        self.request_id = request.id
        # (filter as the wallet sent it, key); two filters naming one object count once
        objects: dict[str, str] = {}
        for value in request.filters:
            objects.setdefault(codec.object_key(request.kind, value), value)
        self.objects = [(value, key) for key, value in objects.items()]
        self.prefix = codec.notification_prefix(request.sub_id)
        self.pending = True  # until the OK is written
        self.waiting = 0  # shards that have not answered
        self.failed = False
        self.initial: dict[str, Any] = {}  # key -> its state when subscribed
        self.held: list[tuple] = []  # deliveries that came before the OK
        self.last: dict[str, int] = {}  # key -> version forwarded
        self.cancel_id: Any = None  # an unsubscribe that came while pending
        self.meta = meta


class CashuSession(DialectSession):
    def __init__(self, dialect: CashuDialect, wire: Wire) -> None:
        super().__init__(dialect, wire)
        self.subs: dict[str, _Subscription] = {}
        self.by_key: dict[str, dict[str, _Subscription]] = {}
        self.filters = 0
        self.tasks: set[asyncio.Task] = set()
        self.bucket = TokenBucket(self.config.rate_limit_per_second, float(self.config.rate_limit_burst),
                                  time.monotonic())

    # -- transport events -----------------------------------------------------------------------

    def on_message(self, data: bytes, is_text: bool) -> None:
        if self.closed:
            return
        gateway = self.gateway
        meta = gateway.event_meta(DIALECT)
        size = len(data)
        if size > self.config.max_message_bytes:
            self._refuse(RpcError(codec.INVALID_REQUEST, f"Invalid Request: message of {size} bytes exceeds the "
                                  f"limit of {self.config.max_message_bytes} bytes"), meta, size)
            return
        wait = self.bucket.take(time.monotonic())
        if wait:
            self._refuse(RpcError(codec.LIMIT_EXCEEDED, f"Rate limit exceeded: at most "
                                  f"{self.config.rate_limit_per_second:g} requests per second; retry in "
                                  f"{TokenBucket.retry_after_ms(wait)} ms"), meta, size)
            return
        try:
            request = codec.decode(data, self.dialect.limits)
            if isinstance(request, Subscribe):
                meta = contract.retag(meta, "subscribe", request.kind)
                self._subscribe(request, meta)
            elif isinstance(request, Unsubscribe):
                meta = contract.retag(meta, "unsubscribe", None)
                self._unsubscribe(request)
            else:
                meta = contract.retag(meta, "heartbeat", None)
                self._send(codec.encode_heartbeat(request.id))
        except RpcError as error:
            self._refuse(error, meta, size)
            return
        gateway.accepted(meta, request.id, size, self.wire.id)

    def on_event(self, payload: Any) -> None:
        key, version, state, meta = payload
        subs = self.by_key.get(key)
        if not subs:
            return
        for sub in list(subs.values()):
            if sub.pending:
                sub.held.append(payload)
            else:
                self._forward(sub, key, version, state, meta)

    def on_tick(self, now: float) -> None:
        if not self.closed and now - self.wire.last_activity > self.config.idle_timeout_s:
            self.release()
            self.wire.close(1001, f"idle for {self.config.idle_timeout_s:g} s")

    def released(self) -> None:
        for task in self.tasks:
            task.cancel()
        self._unsubscribe_keys(self.by_key)
        self.by_key.clear()
        self.subs.clear()

    def reannounce(self, link: ShardLink) -> None:
        """Subscribe again to the keys held on the restarted shard behind ``link``; a state newer
        than the one last forwarded (stored while the shard was down) is forwarded, as if pushed."""
        keys = self._by_shard(self.by_key).get(link)
        if keys:
            self.shards.send(link, cashu.subscribe_many(tuple(keys), self.wire.id),
                             lambda result: self._resubscribed(keys, result))

    def _resubscribed(self, keys: list[str], result: Any) -> None:
        if not self.closed and not isinstance(result, (ShardUnavailable, CommandError)):
            for key, current in zip(keys, result):
                if current is not None:  # None: nothing stored yet, as when it was subscribed
                    self.on_event(RetainedEvent(key, current.version, current.payload, None))

    # -- requests -------------------------------------------------------------------------------

    def _subscribe(self, request: Subscribe, meta: tuple) -> None:
        config = self.config
        if request.sub_id in self.subs:
            raise RpcError(codec.INVALID_PARAMS, f"Invalid params: subId '{request.sub_id}' is already in use on "
                           "this connection", request.id)
        if len(self.subs) >= config.max_subscriptions:
            raise RpcError(codec.INVALID_PARAMS, f"Invalid params: too many subscriptions; at most "
                           f"{config.max_subscriptions} per connection", request.id)
        if self.filters + len(request.filters) > config.max_filters_per_connection:
            raise RpcError(codec.INVALID_PARAMS, f"Invalid params: too many filters; at most "
                           f"{config.max_filters_per_connection} per connection", request.id)
        sub = _Subscription(request, meta)
        self.subs[sub.sub_id] = sub
        self.filters += len(sub.objects)
        for _, key in sub.objects:
            self.by_key.setdefault(key, {})[sub.sub_id] = sub
        groups = self._by_shard(key for _, key in sub.objects)
        sub.waiting = len(groups)
        connection_id = self.wire.id
        for link, keys in groups.items():
            self.shards.send(link, cashu.subscribe_many(tuple(keys), connection_id),
                             lambda result, sub=sub, keys=keys: self._subscribed(sub, keys, result))

    def _subscribed(self, sub: _Subscription, keys: list[str], result: Any) -> None:
        if self.closed or self.subs.get(sub.sub_id) is not sub:
            return
        if isinstance(result, (ShardUnavailable, CommandError)):
            sub.failed = True
        else:
            sub.initial.update(zip(keys, result))
        sub.waiting -= 1
        if sub.waiting == 0:
            self._complete(sub)

    def _complete(self, sub: _Subscription) -> None:
        if sub.failed:
            self._remove(sub)
            self._send(codec.encode_error(sub.request_id, codec.INTERNAL_ERROR,
                                          "Internal error: the router could not read the current state; try again"))
            if sub.cancel_id is not None:
                self._send(codec.encode_error(sub.cancel_id, codec.INVALID_PARAMS,
                                              f"Invalid params: subscription not found: {sub.sub_id}"))
            return
        self._send(codec.encode_ok(sub.request_id, sub.sub_id))  # before any notification of it
        sub.pending = False
        if sub.cancel_id is not None:
            self._remove(sub)
            self._send(codec.encode_ok(sub.cancel_id, sub.sub_id))
            return
        unknown: list[tuple[str, str]] = []
        for value, key in sub.objects:
            current = sub.initial.get(key)
            if current is not None:
                self._forward(sub, key, current.version, current.payload, sub.meta)
            else:
                unknown.append((value, key))
        held, sub.held = sub.held, []
        for key, version, state, meta in held:
            self._forward(sub, key, version, state, meta)
        if unknown:
            if self.dialect.mint is not None:
                self._spawn(self._fetch(sub, unknown))
            else:
                self._assume_unspent(sub, unknown)
        sub.initial = {}

    def _assume_unspent(self, sub: _Subscription, objects: list[tuple[str, str]]) -> None:
        """A Y nobody has reported is unspent (as Nutshell answers), unless configured to say nothing."""
        if sub.kind != codec.PROOF_STATE or self.config.unknown_proof_state != "unspent":
            return
        for value, key in objects:
            if key not in sub.last:
                self._forward(sub, key, 0, codec.unspent_proof(value), sub.meta)

    async def _fetch(self, sub: _Subscription, objects: list[tuple[str, str]]) -> None:
        """Ask the mint for objects the router has no state of; store what it says (unless newer came)."""
        ids = [key.rsplit("/", 1)[1] if sub.kind == codec.PROOF_STATE else value for value, key in objects]
        found = await self.dialect.mint.fetch(sub.kind, ids)
        if self.closed or found is None:
            return  # not asked (over the budget) or not answered: say nothing rather than "unspent"
        fetched: dict[str, bytes] = {}  # key -> the state the mint gave
        missing = []
        for (value, key), object_id in zip(objects, ids):
            state = found.get(object_id)
            if state is None:
                missing.append((value, key))
            else:
                fetched[key] = orjson.dumps(state)
        for link, keys in self._by_shard(fetched).items():
            self.shards.send(link, cashu.init_many(tuple(keys), tuple(fetched[key] for key in keys)),
                             lambda result, keys=keys: self._fetched(keys, result))
        if missing and self.subs.get(sub.sub_id) is sub:
            self._assume_unspent(sub, missing)

    def _fetched(self, keys: list[str], result: Any) -> None:
        if not self.closed and not isinstance(result, (ShardUnavailable, CommandError)):
            for key, current in zip(keys, result):
                self.on_event(RetainedEvent(key, current.version, current.payload, None))

    def _unsubscribe(self, request: Unsubscribe) -> None:
        sub = self.subs.get(request.sub_id)
        if sub is None or sub.cancel_id is not None:
            raise RpcError(codec.INVALID_PARAMS, f"Invalid params: subscription not found: {request.sub_id}",
                           request.id)
        if sub.pending:
            sub.cancel_id = request.id  # answered right after the subscription's own OK
            return
        self._remove(sub)
        self._send(codec.encode_ok(request.id, sub.sub_id))

    def _remove(self, sub: _Subscription) -> None:
        self.subs.pop(sub.sub_id, None)
        self.filters -= len(sub.objects)
        unheld = []
        for _, key in sub.objects:
            holders = self.by_key.get(key)
            if holders is None:
                continue
            holders.pop(sub.sub_id, None)
            if not holders:
                del self.by_key[key]
                unheld.append(key)
        self._unsubscribe_keys(unheld)

    def _unsubscribe_keys(self, keys: Iterable[str]) -> None:
        connection_id = self.wire.id
        for link, group in self._by_shard(keys).items():
            self.shards.send(link, cashu.unsubscribe_many(tuple(group), connection_id))

    def _by_shard(self, keys: Iterable[str]) -> dict[ShardLink, list[str]]:
        """Keys grouped by the topic shard that owns them: one command per shard, not one per key."""
        shards, groups = self.shards, {}
        for key in keys:
            groups.setdefault(shards.link(TOPIC, key), []).append(key)
        return groups

    # -- frames out -----------------------------------------------------------------------------

    def _forward(self, sub: _Subscription, key: str, version: int, state: bytes, meta: tuple | None) -> None:
        if version <= sub.last.get(key, -1):
            return  # this subscription has already forwarded this state or a newer one
        sub.last[key] = version
        frame = codec.encode_notification(sub.prefix, state)
        sent = self.wire.send_text(frame)
        self.dialect.notifications += 1
        if meta is not None:
            self.gateway.account_delivery(meta, len(frame), self.wire.id, sent)

    def _send(self, frame: bytes) -> None:
        self.wire.send_text(frame)

    def _refuse(self, error: RpcError, meta: tuple, size: int) -> None:
        self.gateway.rejected(meta, error.request_id, size, self.wire.id, _ERROR_REASONS.get(error.code, "error"))
        self._send(codec.encode_error(error.request_id, error.code, error.message))

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self.tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("cashu: fetching states from the mint failed", exc_info=task.exception())


def endpoints(gateway: Any, config: Any) -> list[Dialect]:
    """What a gateway serves of this dialect (the dialect table calls it)."""
    return [CashuDialect(gateway, config)]
