"""Baqend: real-time queries at ``/v1/events`` and the REST API (``/v1/connect``, ``/v1/db/...``).

A write (REST) goes to the document shard owning its id, which checks and stores it and forwards
its (before, after) images to every query shard; the REST answer is the stored object. A
subscription is registered on the query shard owning its key (writes for it are buffered from
then on), then every document shard is scanned page by page, each page handed on to the query
shard, then the query shard builds the query from the pages and sends the ``result`` (see
:mod:`actors.baqend.livequeries`). Every ``result`` and ``match`` reaches the connection as a
``DELIVER_EVENT`` payload; this module writes the frames.

What one client may ask is bounded here (:mod:`gateways.baqend.limits`): REST requests and
subscribes per minute, live subscriptions, the documents a query may load; a subscription ends
when its token expires, and a quiet connection is pinged and closed when it stops answering.

Each subscription tracks what its client holds (:mod:`gateways.baqend.view`): when a shard
restarts, its live queries are registered again with it and the client gets only what changed
(docs/baqend.md, "Restarts and failures").
"""

from __future__ import annotations

import bisect
import itertools
import logging
import time
from typing import Any, NamedTuple

import jwt
import orjson

from actors.baqend.documents import (BAD_REQUEST, EXISTS, FORBIDDEN, NOT_FOUND, PRECONDITION_FAILED, iso_now, new_key,
                                     principals_of)
from gateways.baqend import codec
from gateways.baqend.codec import UNAUTHORIZED, ProtocolError, RestError, Subscribe
from gateways.baqend.limits import ClientCounts, ClientRates, address_client, subject_client
from gateways.dialect import Dialect, DialectSession, HttpRequest, HttpResponse, HttpRoute, Wire
from gateways.keepalive import CLOSE_IDLE, IDLE, PING, Keepalive
from gateways.baqend.config import BaqendConfig
from gateways.baqend.view import ResultView
from router.errors import CommandError, ShardUnavailable
from actors.baqend import contract as baqend
from actors.baqend.contract import DOCUMENT, QUERY, Baseline, InitialResult, Known, object_key
from router import contract

logger = logging.getLogger(__name__)

DIALECT = "baqend"
_STATUS = {NOT_FOUND: 404, PRECONDITION_FAILED: 412, EXISTS: 409, BAD_REQUEST: 400, FORBIDDEN: 403,
           "internal_error": 500}
_keys = itertools.count(1)


class Identity(NamedTuple):
    """Who a request speaks for."""

    principals: frozenset[str]  # what the documents' acl rules are checked against
    subject: str | None  # the token's `sub`: the client its requests count against
    expires: float | None  # epoch seconds after which the token is refused (its `exp` plus the leeway)


ANONYMOUS = Identity(frozenset(), None, None)


class TokenValidator:
    """JWT → the principals (user and roles) the documents' acl rules are checked against."""

    def __init__(self, config: Any) -> None:
        self._key = config.verification_key()
        self._algorithms = list(config.algorithms)
        self._issuer = config.issuer
        self._audience = config.audience
        self._leeway = config.leeway_s

    def identity(self, token: str) -> Identity:
        try:
            claims = jwt.decode(token, self._key, algorithms=self._algorithms, options={"require": ["exp"]},
                                issuer=self._issuer, audience=self._audience, leeway=self._leeway)
        except jwt.ExpiredSignatureError:
            raise codec.token_expired() from None
        except jwt.InvalidTokenError as error:
            raise ProtocolError(f"Invalid token: {error}", 401, UNAUTHORIZED) from None
        subject = claims.get("sub")
        return Identity(principals_of(claims), subject if isinstance(subject, str) and subject else None,
                        float(claims["exp"]) + self._leeway)


def _json(status: int, body: Any, headers: list[tuple[str, str]] | None = None) -> HttpResponse:
    return HttpResponse(status, orjson.dumps(body), headers=headers or [])


def _object(status: int, document: dict[str, Any]) -> HttpResponse:
    return _json(status, document, [("ETag", f'"{document["version"]}"')])


def _error(status: int, message: str, headers: list[tuple[str, str]] | None = None) -> HttpResponse:
    return HttpResponse(status, codec.error_body(status, message), headers=headers or [])


class BaqendDialect(Dialect):
    name = DIALECT

    def __init__(self, gateway: Any, config: BaqendConfig) -> None:
        super().__init__(gateway)
        self.config = config
        self.validator = TokenValidator(config.auth) if config.auth.enabled else None
        self.rest_rates = ClientRates(config.rest_rate_limit_per_minute, config.rest_rate_limit_burst)
        self.subscribe_rates = ClientRates(config.subscribe_rate_limit_per_minute, config.subscribe_rate_limit_burst)
        self.client_subscriptions = ClientCounts(config.max_client_subscriptions)
        self.results = 0
        self.matches = 0
        self.writes = 0
        self.resynced = 0  # live queries registered again after a shard restarted
        # refusals and closes of the limits, by what was refused
        self.limited = {"rest_rate": 0, "subscribe_rate": 0, "client_subscriptions": 0, "query_too_large": 0,
                        "token_expired": 0, "idle": 0}
        # (events list, date, their frames' bodies) of the last matches sent (codec.match_body),
        # for the next subscription sent the same list (the list is read-only once made)
        self.last_match: tuple[list | None, str, list[bytes]] = (None, "", [])

    def anonymous_client(self, remote: str) -> str:
        """Who an anonymous request from ``remote`` (``host:port``) counts as for per-client limits."""
        return address_client(remote, self.gateway.address_key(remote.rsplit(":", 1)[0]))

    def new_session(self, wire: Wire, request_headers: Any) -> "BaqendSession":
        return BaqendSession(self, wire)

    def stats(self) -> dict[str, Any]:
        return {"connections": len(self.sessions), "subscriptions": sum(len(s.subs) for s in self.sessions),
                "results": self.results, "matches": self.matches, "writes": self.writes, "resynced": self.resynced,
                "limited": self.limited}

    def identity(self, token: str | None) -> Identity:
        """Anonymous (public documents only) without a token or without a configured validator."""
        if token is None or self.validator is None:
            return ANONYMOUS
        return self.validator.identity(token)

    # -- REST ---------------------------------------------------------------------------------------

    def http_routes(self) -> list[HttpRoute]:
        base = "" if self.config.rest_path == "/" else self.config.rest_path
        db = base + "/db"
        return [HttpRoute("GET", base + "/connect", self._connect)] + [
            HttpRoute(method, db, self._objects, prefix=True) for method in ("GET", "POST", "PUT", "DELETE")
        ]

    async def _connect(self, request: HttpRequest) -> HttpResponse:
        try:
            self._rest_identity(request)
        except RestError as error:
            return _error(error.status, error.message, error.headers)
        return _json(200, {"schema": self.config.schema_, "bloomFilterRefresh": 60})

    async def _objects(self, request: HttpRequest) -> HttpResponse:
        base = "" if self.config.rest_path == "/" else self.config.rest_path
        rest = request.path[len(base) + len("/db"):].lstrip("/")
        try:
            identity = self._rest_identity(request)
            bucket, key = codec.parse_object_path(rest, self.config.max_key_length)
            return await self._object_request(request, bucket, key, identity.principals)
        except RestError as error:
            return _error(error.status, error.message, error.headers)
        except CommandError as error:
            return _error(_STATUS.get(error.code, 400), error.message)
        except ShardUnavailable:
            return _error(503, "the router could not reach the document's shard; try again")

    def _rest_identity(self, request: HttpRequest) -> Identity:
        """The caller, once its request is counted against its client's rate (429 over it): its
        token's subject, or its address when it sent no valid token (a bad one still counts)."""
        authorization = request.header("authorization") or ""
        scheme, _, token = authorization.partition(" ")
        identity, refused = ANONYMOUS, None
        if scheme.lower() in ("bat", "bearer") and token.strip():
            try:
                identity = self.identity(token.strip())
            except ProtocolError as error:
                refused = RestError(401, error.message)
        client = subject_client(identity.subject) if identity.subject else self.anonymous_client(request.remote)
        wait = self.rest_rates.take(client, time.monotonic())
        if wait:
            self.limited["rest_rate"] += 1
            raise codec.rest_too_fast(self.config.rest_rate_limit_per_minute, wait)
        if refused is not None:
            raise refused
        return identity

    async def _object_request(self, request: HttpRequest, bucket: str, key: str | None,
                              principals: frozenset[str]) -> HttpResponse:
        method, config, shards = request.method, self.config, self.shards
        if key is None:
            if method != "POST":
                raise RestError(405 if method in ("PUT", "DELETE") else 400,
                                f"{method} needs an object: {config.rest_path}/db/{bucket}/<key>")
            fields = codec.decode_object(request.body, config.max_document_bytes)
            key = codec.key_from_insert(bucket, fields, config.max_key_length) or new_key()
            meta = self._accepted("insert", bucket, key, len(request.body))
            document = await shards.request(shards.link(DOCUMENT, object_key(bucket, key)),
                                            baqend.insert(bucket, key, fields, principals, meta))
            return self._written(201, document)
        link = shards.link(DOCUMENT, object_key(bucket, key))
        if method == "GET":
            return _object(200, self._result(await shards.request(link, baqend.get(bucket, key, principals))))
        version = codec.if_match(request.header("if-match"))
        if method == "DELETE":
            meta = self._accepted("delete", bucket, key, 0)
            self._result(await shards.request(link, baqend.delete(bucket, key, version, principals, meta)))
            self.writes += 1
            return HttpResponse(204, b"")
        body = codec.decode_object(request.body, config.max_document_bytes)
        if method == "PUT":
            meta = self._accepted("replace", bucket, key, len(request.body))
            document, created = self._result(
                await shards.request(link, baqend.replace(bucket, key, body, version, principals, meta)))
            return self._written(201 if created else 200, document)
        meta = self._accepted("update", bucket, key, len(request.body))
        return self._written(200, await shards.request(link, baqend.update(bucket, key, body, version, principals, meta)))

    def _accepted(self, operation: str, bucket: str, key: str, nbytes: int) -> tuple:
        gateway = self.gateway
        oid = object_key(bucket, key)
        meta = gateway.event_meta(DIALECT, operation, oid)
        gateway.accepted(meta, oid, nbytes, -1)
        return meta

    def _written(self, status: int, result: Any) -> HttpResponse:
        document = self._result(result)
        self.writes += 1
        return _object(status, document)

    @staticmethod
    def _result(result: Any) -> Any:
        if isinstance(result, CommandError):
            raise result
        return result


class _Subscription:
    __slots__ = ("sub_id", "key", "spec", "link", "meta", "client", "expires", "principals", "loading", "pages",
                 "documents", "nbytes", "retried", "restarting", "view", "heard", "include", "prefix")

    def __init__(self, sub_id: str, key: str, spec: Any, link: Any, meta: tuple, client: str,
                 expires: float | None, principals: frozenset[str]) -> None:
        self.sub_id = sub_id
        self.prefix = codec.match_prefix(sub_id)  # its match frames' first bytes
        self.key = key
        self.spec = spec
        self.link = link
        self.meta = meta
        self.client = client  # what it counts against (ClientCounts)
        self.expires = expires  # its token's end (epoch seconds), None when anonymous
        self.principals = principals
        self.loading = 0  # document shards whose pages are still being read
        self.pages = 0  # pages handed to the query shard
        self.documents = 0  # matching documents read so far, and their bytes
        self.nbytes = 0
        self.retried = False  # a start over: a shard died while it was first being registered
        self.restarting = False  # a start over is on its way
        # What the client holds (None until the query loaded), and when it last heard of it
        # (epoch ms): a query registered again after a restart sends only what changed since.
        self.view: ResultView | None = None
        self.heard = 0
        self.include: dict[Any, tuple[str, ...]] = {}  # document link -> the held ids it owns, sorted


class BaqendSession(DialectSession):
    def __init__(self, dialect: BaqendDialect, wire: Wire) -> None:
        super().__init__(dialect, wire)
        self.subs: dict[str, _Subscription] = {}
        self.by_key: dict[str, _Subscription] = {}
        self.used_at = time.monotonic()  # its last message, or the last tick it held a subscription
        self.keepalive = Keepalive(self.config.ping_interval_s, self.config.idle_timeout_s)

    # -- transport events ---------------------------------------------------------------------------

    def on_message(self, data: bytes, is_text: bool) -> None:
        if self.closed:
            return
        gateway = self.gateway
        meta = gateway.event_meta(DIALECT)
        size = len(data)
        self.used_at = time.monotonic()
        try:
            if size > self.config.max_message_bytes:
                raise ProtocolError(f"Message of {size} bytes exceeds the limit of {self.config.max_message_bytes} "
                                    "bytes", 413, codec.PAYLOAD_TOO_LARGE)
            request = codec.decode(data)
            if isinstance(request, Subscribe):
                meta = contract.retag(meta, "subscribe", request.spec.bucket)
                self._subscribe(request, meta)
            else:
                meta = contract.retag(meta, "unsubscribe", None)
                self._unsubscribe(request.sub_id)
        except ProtocolError as error:
            self.gateway.rejected(meta, error.sub_id, size, self.wire.id, f"status_{error.status}")
            self._send_error(error.sub_id, error)
            return
        gateway.accepted(meta, request.sub_id, size, self.wire.id)

    def on_event(self, payload: Any) -> None:
        if type(payload) is tuple:  # a query's matches (a contract.Matches layout)
            key, events, meta, changes = payload
        else:  # an InitialResult or a Baseline
            key = payload.key
        sub = self.by_key.get(key)
        if sub is None or self.closed:
            return
        if sub.expires is not None and time.time() > sub.expires:
            self._expire(sub)  # nothing more for a token that no longer holds, not even before the sweep
            return
        sub.heard = contract.now_ms()
        if isinstance(payload, Baseline):
            sub.view = ResultView(payload.entries, _ordered(sub.spec))
            return
        date = codec.date_now()
        if isinstance(payload, InitialResult):
            frame = codec.encode_result(sub.sub_id, payload.documents, date)
            if len(frame) > self.config.max_result_bytes:
                self._fail(sub, ProtocolError(
                    f"The initial result is {len(frame)} bytes; the limit is {self.config.max_result_bytes}: "
                    "narrow the query or use a sorted query with a limit", 413, codec.PAYLOAD_TOO_LARGE))
                return
            self.dialect.results += 1
            self.gateway.account_delivery(sub.meta, len(frame), self.wire.id, self.wire.send_text(frame))
            sub.view = ResultView.of(payload.documents, _ordered(sub.spec))
            return
        # Equal queries share one events list (their shard's state, one pickle in a bundle), and
        # their matches arrive one after another: its frames' bodies are encoded for the first.
        dialect = self.dialect
        last_events, last_date, bodies = dialect.last_match
        if events is not last_events or date != last_date:
            bodies = [codec.match_body(fields, date) for fields in events]
            dialect.last_match = (events, date, bodies)
        prefix, wire = sub.prefix, self.wire
        dialect.matches += len(bodies)
        for body in bodies:
            frame = prefix + body
            sent = wire.send_text(frame)
            if meta is not None:
                self.gateway.account_delivery(meta, len(frame), wire.id, sent)
        view = sub.view
        if view is not None:
            if changes is None:
                view.apply_events(events)
            else:
                for change in changes:
                    view.apply(*change)

    def on_tick(self, now: float) -> None:
        """Expired tokens end their subscriptions; a quiet connection is pinged, and closed when
        it has sent nothing (not even a pong) for ``idle_timeout_s``, or no message for that long
        while it holds no subscription."""
        if self.closed:
            return
        if self.subs:
            wall = time.time()
            for sub in [sub for sub in self.subs.values() if sub.expires is not None and wall > sub.expires]:
                self._expire(sub)
        wire = self.wire
        if self.subs:
            self.used_at = now
            heard = wire.last_activity
        else:
            heard = self.used_at
        due = self.keepalive.due(heard, now)
        if due == IDLE:
            self.dialect.limited["idle"] += 1
            self.release()
            wire.close(CLOSE_IDLE, self.keepalive.reason())
        elif due == PING and self.subs:
            wire.ping()

    def released(self) -> None:
        for sub in list(self.subs.values()):
            self._remove(sub)

    def reannounce(self, link: Any) -> None:
        """A shard restarted. A query shard lost its live queries: register again each one this
        connection had there. A document shard holds none, but writes it stored in the instant
        before it died may not have reached the queries: register every live query again. Either
        way a query the client already got a result for is registered with what the client holds,
        and its load sends only the events from that to the fresh result (never a second result);
        one still loading starts over. Nothing is asked of the client."""
        if self.closed:
            return
        shards = self.shards
        if link in shards.all(QUERY):
            renewed = [sub for sub in self.subs.values() if sub.link is link]
        elif link in shards.all(DOCUMENT):
            renewed = list(self.subs.values())
        else:
            return
        for sub in renewed:
            self._renew(sub, link)

    # -- requests -----------------------------------------------------------------------------------

    def _subscribe(self, request: Subscribe, meta: tuple) -> None:
        config, dialect, sub_id = self.config, self.dialect, request.sub_id
        existing = self.subs.get(sub_id)
        if existing is not None:
            # An error ends the subscription with this id on the client: end it here too.
            self._remove(existing)
            raise ProtocolError(f"Subscription id {sub_id} is already in use", 400, codec.BAD_REQUEST, sub_id)
        if len(self.subs) >= config.max_subscriptions:
            raise codec.too_many(config.max_subscriptions, sub_id)
        try:
            identity = dialect.identity(request.token)
        except ProtocolError as error:
            error.sub_id = sub_id
            raise
        client = subject_client(identity.subject) if identity.subject else dialect.anonymous_client(self.wire.remote)
        wait = dialect.subscribe_rates.take(client, time.monotonic())
        if wait:
            dialect.limited["subscribe_rate"] += 1
            raise codec.subscribing_too_fast(config.subscribe_rate_limit_per_minute, wait, sub_id)
        if not dialect.client_subscriptions.acquire(client):
            dialect.limited["client_subscriptions"] += 1
            raise codec.too_many_for_client(config.max_client_subscriptions, sub_id)
        key = self._key()
        sub = _Subscription(sub_id, key, request.spec, self.shards.link(QUERY, key), meta, client, identity.expires,
                            identity.principals)
        self.subs[sub_id] = sub
        self.by_key[key] = sub
        self._register(sub, None)

    def _key(self) -> str:
        """A key unique to one registration of a query (a client may reuse its subscription ids)."""
        return f"{self.gateway.id}/{self.wire.id}/{next(_keys)}"

    def _register(self, sub: _Subscription, known: Known | None) -> None:
        self.shards.send(sub.link, baqend.subscribe(sub.key, self.wire.id, sub.sub_id, sub.spec, sub.principals,
                                                    known),
                         lambda result: self._registered(sub, result))

    def _renew(self, old: _Subscription, restarted: Any) -> _Subscription:
        """Register ``old`` again under a new key (so nothing still on its way for the old one can
        mix in), with what the client holds if it got its result."""
        shards = self.shards
        key = self._key()
        sub = _Subscription(old.sub_id, key, old.spec, shards.link(QUERY, key), old.meta, old.client, old.expires,
                            old.principals)
        sub.view, sub.heard = old.view, old.heard
        self.subs[sub.sub_id] = sub
        del self.by_key[old.key]
        self.by_key[key] = sub
        if old.link is not restarted:  # a restarted query shard no longer has it
            shards.send(old.link, baqend.unsubscribe(old.key))
        known = None
        if sub.view is not None:
            entries = sub.view.entries()
            known = Known(entries, iso_now(sub.heard))
            held: dict[Any, list[str]] = {}
            for oid, _ in entries:
                held.setdefault(shards.link(DOCUMENT, oid), []).append(oid)
            sub.include = {link: tuple(sorted(ids)) for link, ids in held.items()}
        self.dialect.resynced += 1
        self._register(sub, known)
        return sub

    def _registered(self, sub: _Subscription, result: Any) -> None:
        if self.by_key.get(sub.key) is not sub:
            if result is True:  # registered again meanwhile (a shard restarted): this one is left over
                self.shards.send(sub.link, baqend.unsubscribe(sub.key))
            return
        if result is not True:
            self._lost(sub, result)
            return
        links = self.shards.all(DOCUMENT)
        sub.loading = len(links)
        for link in links:
            self._scan(sub, link, None)

    def _scan(self, sub: _Subscription, link: Any, after: str | None) -> None:
        include = sub.include.get(link, ())
        if include and after is not None:
            include = include[bisect.bisect_right(include, after):]
        self.shards.send(link, baqend.scan(sub.spec.bucket, sub.spec.query, after, include),
                         lambda page: self._scanned(sub, link, page))

    def _scanned(self, sub: _Subscription, link: Any, page: Any) -> None:
        """A page of one document shard: counted against the query's bounds, handed to the query
        shard (pages of a shard in order), the next one asked for; the last one loads the query."""
        if self.by_key.get(sub.key) is not sub:
            return
        if isinstance(page, (ShardUnavailable, CommandError)):
            self._lost(sub, page)
            return
        config = self.config
        sub.documents += len(page.documents)
        sub.nbytes += page.nbytes
        if sub.documents > config.max_result_documents or sub.nbytes > config.max_query_bytes:
            self.dialect.limited["query_too_large"] += 1
            if sub.documents > config.max_result_documents:
                self._fail(sub, codec.query_too_large(sub.sub_id, documents=config.max_result_documents))
            else:
                self._fail(sub, codec.query_too_large(sub.sub_id, nbytes=config.max_query_bytes))
            return
        shards = self.shards
        shards.send(sub.link, baqend.page(sub.key, page), lambda result: self._paged(sub, result))
        sub.pages += 1
        if page.upto is not None:
            self._scan(sub, link, page.upto)
            return
        sub.loading -= 1
        if not sub.loading:
            shards.send(sub.link, baqend.load(sub.key, sub.pages), lambda result: self._loaded(sub, result))

    def _paged(self, sub: _Subscription, result: Any) -> None:
        if self.by_key.get(sub.key) is sub and result is not True:
            self._lost(sub, result)

    def _loaded(self, sub: _Subscription, result: Any) -> None:
        if self.by_key.get(sub.key) is sub and result is not True:
            self._lost(sub, result)

    def _lost(self, sub: _Subscription, result: Any) -> None:
        """A command of a query being registered failed. If a shard died under it (not a timeout,
        not a refusal), the shard is restarting: start over, once, on the next turn of the loop
        (the shard client then holds the link's commands until it knows the shard's new epoch);
        otherwise the subscription ends with an error."""
        if sub.restarting:
            return  # its other commands met the same death
        if isinstance(result, ShardUnavailable) and not result.timed_out and not sub.retried:
            sub.restarting = True
            self.gateway.loop.call_soon(self._start_over, sub)
        else:
            self._fail(sub, _unavailable(result))

    def _start_over(self, sub: _Subscription) -> None:
        if not self.closed and self.by_key.get(sub.key) is sub:
            self._renew(sub, None).retried = True

    def _unsubscribe(self, sub_id: str) -> None:
        sub = self.subs.get(sub_id)
        if sub is not None:
            self._remove(sub)

    def _remove(self, sub: _Subscription) -> None:
        self.subs.pop(sub.sub_id, None)
        self.by_key.pop(sub.key, None)
        self.dialect.client_subscriptions.release(sub.client)
        self.shards.send(sub.link, baqend.unsubscribe(sub.key))

    def _expire(self, sub: _Subscription) -> None:
        self.dialect.limited["token_expired"] += 1
        self._fail(sub, codec.token_expired())

    def _fail(self, sub: _Subscription, error: ProtocolError) -> None:
        """The subscription ends with an error message (the spec's only way for the server to end it)."""
        if self.subs.get(sub.sub_id) is sub:
            self._remove(sub)
            self._send_error(sub.sub_id, error)

    def _send_error(self, sub_id: str | None, error: ProtocolError) -> None:
        self.wire.send_text(codec.encode_error(sub_id, error, codec.date_now()))


def _ordered(spec: Any) -> bool:
    """Whether a (normalised) query is sorted: only a sorted query has a limit."""
    return spec.limit is not None


def _unavailable(result: Any) -> ProtocolError:
    if isinstance(result, CommandError):
        return ProtocolError(result.message, 400, codec.BAD_REQUEST)
    return ProtocolError("The router could not run the query; subscribe again", 503, "Service Unavailable")


def endpoints(gateway: Any, config: Any) -> list[Dialect]:
    """What a gateway serves of this dialect (the dialect table calls it)."""
    return [BaqendDialect(gateway, config)]
