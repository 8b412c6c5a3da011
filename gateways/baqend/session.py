"""Baqend: real-time queries at ``/v1/events`` and the REST API (``/v1/connect``, ``/v1/db/...``).

A write (REST) goes to the document shard owning its id, which checks and stores it and forwards
its (before, after) images to every query shard; the REST answer is the stored object. A
subscription is registered on the query shard owning its key (writes for it are buffered from
then on), then every document shard is scanned, then the query shard builds the query from the
scans and sends the ``result`` (see :mod:`actors.baqend.livequeries`). Every ``result`` and ``match``
reaches the connection as a ``DELIVER_EVENT`` payload; this module writes the frames.
"""

from __future__ import annotations

import itertools
import logging
import time
from typing import Any

import jwt
import orjson

from actors.baqend.documents import BAD_REQUEST, EXISTS, FORBIDDEN, NOT_FOUND, PRECONDITION_FAILED, new_key, principals_of
from gateways.baqend import codec
from gateways.baqend.codec import ProtocolError, RestError, Subscribe
from gateways.dialect import Dialect, DialectSession, HttpRequest, HttpResponse, HttpRoute, Wire
from gateways.baqend.config import BaqendConfig
from router.errors import CommandError, ShardUnavailable
from actors.baqend import contract as baqend
from actors.baqend.contract import DOCUMENT, QUERY, InitialResult, object_key
from router import contract

logger = logging.getLogger(__name__)

DIALECT = "baqend"
UNAUTHORIZED = "Unauthorized"
_STATUS = {NOT_FOUND: 404, PRECONDITION_FAILED: 412, EXISTS: 409, BAD_REQUEST: 400, FORBIDDEN: 403,
           "internal_error": 500}
_keys = itertools.count(1)


class TokenValidator:
    """JWT → the principals (user and roles) the documents' acl rules are checked against."""

    def __init__(self, config: Any) -> None:
        self._key = config.verification_key()
        self._algorithms = list(config.algorithms)
        self._issuer = config.issuer
        self._audience = config.audience
        self._leeway = config.leeway_s

    def principals(self, token: str) -> frozenset[str]:
        try:
            claims = jwt.decode(token, self._key, algorithms=self._algorithms, options={"require": ["exp"]},
                                issuer=self._issuer, audience=self._audience, leeway=self._leeway)
        except jwt.ExpiredSignatureError:
            raise ProtocolError("Invalid token: expired", 401, UNAUTHORIZED) from None
        except jwt.InvalidTokenError as error:
            raise ProtocolError(f"Invalid token: {error}", 401, UNAUTHORIZED) from None
        return principals_of(claims)


def _json(status: int, body: Any, headers: list[tuple[str, str]] | None = None) -> HttpResponse:
    return HttpResponse(status, orjson.dumps(body), headers=headers or [])


def _object(status: int, document: dict[str, Any]) -> HttpResponse:
    return _json(status, document, [("ETag", f'"{document["version"]}"')])


def _error(status: int, message: str) -> HttpResponse:
    return HttpResponse(status, codec.error_body(status, message))


class BaqendDialect(Dialect):
    name = DIALECT

    def __init__(self, gateway: Any, config: BaqendConfig) -> None:
        super().__init__(gateway)
        self.config = config
        self.validator = TokenValidator(config.auth) if config.auth.enabled else None
        self.results = 0
        self.matches = 0
        self.writes = 0

    def new_session(self, wire: Wire, request_headers: Any) -> "BaqendSession":
        return BaqendSession(self, wire)

    def stats(self) -> dict[str, Any]:
        return {"connections": len(self.sessions), "subscriptions": sum(len(s.subs) for s in self.sessions),
                "results": self.results, "matches": self.matches, "writes": self.writes}

    def principals(self, token: str | None) -> frozenset[str]:
        """Anonymous (public documents only) without a token or without a configured validator."""
        if token is None or self.validator is None:
            return frozenset()
        return self.validator.principals(token)

    # -- REST ---------------------------------------------------------------------------------------

    def http_routes(self) -> list[HttpRoute]:
        base = "" if self.config.rest_path == "/" else self.config.rest_path
        db = base + "/db"
        return [HttpRoute("GET", base + "/connect", self._connect)] + [
            HttpRoute(method, db, self._objects, prefix=True) for method in ("GET", "POST", "PUT", "DELETE")
        ]

    async def _connect(self, request: HttpRequest) -> HttpResponse:
        return _json(200, {"schema": self.config.schema_, "bloomFilterRefresh": 60})

    async def _objects(self, request: HttpRequest) -> HttpResponse:
        base = "" if self.config.rest_path == "/" else self.config.rest_path
        rest = request.path[len(base) + len("/db"):].lstrip("/")
        try:
            bucket, key = codec.parse_object_path(rest, self.config.max_key_length)
            principals = self._request_principals(request)
            return await self._object_request(request, bucket, key, principals)
        except RestError as error:
            return _error(error.status, error.message)
        except CommandError as error:
            return _error(_STATUS.get(error.code, 400), error.message)
        except ShardUnavailable:
            return _error(503, "the router could not reach the document's shard; try again")

    def _request_principals(self, request: HttpRequest) -> frozenset[str]:
        authorization = request.header("authorization") or ""
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() not in ("bat", "bearer") or not token.strip():
            return frozenset()
        try:
            return self.principals(token.strip())
        except ProtocolError as error:
            raise RestError(401, error.message) from None

    async def _object_request(self, request: HttpRequest, bucket: str, key: str | None,
                              principals: frozenset[str]) -> HttpResponse:
        method, config, gateway, shards = request.method, self.config, self.gateway, self.shards
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
    __slots__ = ("sub_id", "key", "spec", "link", "meta", "loaded")

    def __init__(self, sub_id: str, key: str, spec: Any, link: Any, meta: tuple) -> None:
        self.sub_id = sub_id
        self.key = key
        self.spec = spec
        self.link = link
        self.meta = meta
        self.loaded = False


class BaqendSession(DialectSession):
    def __init__(self, dialect: BaqendDialect, wire: Wire) -> None:
        super().__init__(dialect, wire)
        self.subs: dict[str, _Subscription] = {}
        self.by_key: dict[str, _Subscription] = {}

    # -- transport events ---------------------------------------------------------------------------

    def on_message(self, data: bytes, is_text: bool) -> None:
        if self.closed:
            return
        gateway = self.gateway
        meta = gateway.event_meta(DIALECT)
        size = len(data)
        try:
            if size > self.config.max_message_bytes:
                raise ProtocolError(f"Message of {size} bytes exceeds the limit of {self.config.max_message_bytes} "
                                    "bytes", 413, "Payload Too Large")
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
        sub = self.by_key.get(payload.key)
        if sub is None or self.closed:
            return
        date = codec.date_now()
        if isinstance(payload, InitialResult):
            frame = codec.encode_result(sub.sub_id, payload.documents, date)
            if len(frame) > self.config.max_result_bytes:
                self._fail(sub, ProtocolError(
                    f"The initial result is {len(frame)} bytes; the limit is {self.config.max_result_bytes}: "
                    "narrow the query or use a sorted query with a limit", 413, "Payload Too Large"))
                return
            self.dialect.results += 1
            self.gateway.account_delivery(sub.meta, len(frame), self.wire.id, self.wire.send_text(frame))
            return
        _, events, meta = payload  # Matches
        for fields in events:
            frame = codec.encode_match(sub.sub_id, fields, date)
            sent = self.wire.send_text(frame)
            self.dialect.matches += 1
            if meta is not None:
                self.gateway.account_delivery(meta, len(frame), self.wire.id, sent)

    def released(self) -> None:
        for sub in list(self.subs.values()):
            self._remove(sub)

    # -- requests -----------------------------------------------------------------------------------

    def _subscribe(self, request: Subscribe, meta: tuple) -> None:
        config, sub_id = self.config, request.sub_id
        existing = self.subs.get(sub_id)
        if existing is not None:
            # An error ends the subscription with this id on the client: end it here too.
            self._remove(existing)
            raise ProtocolError(f"Subscription id {sub_id} is already in use", 400, codec.BAD_REQUEST, sub_id)
        if len(self.subs) >= config.max_subscriptions:
            raise codec.too_many(config.max_subscriptions, sub_id)
        try:
            principals = self.dialect.principals(request.token)
        except ProtocolError as error:
            error.sub_id = sub_id
            raise
        gateway, shards = self.gateway, self.shards
        key = f"{gateway.id}/{self.wire.id}/{next(_keys)}"
        link = shards.link(QUERY, key)
        sub = _Subscription(sub_id, key, request.spec, link, meta)
        self.subs[sub_id] = sub
        self.by_key[key] = sub
        shards.send(link, baqend.subscribe(key, self.wire.id, sub_id, request.spec, principals),
                    lambda result: self._registered(sub, result))

    def _registered(self, sub: _Subscription, result: Any) -> None:
        if self.by_key.get(sub.key) is not sub:
            return
        if result is not True:
            self._fail(sub, _unavailable(result))
            return
        self.shards.send_all(self.shards.all(DOCUMENT), baqend.scan(sub.spec.bucket, sub.spec.query),
                             lambda scans: self._scanned(sub, scans))

    def _scanned(self, sub: _Subscription, scans: list[Any]) -> None:
        if self.by_key.get(sub.key) is not sub:
            return
        for found in scans:
            if isinstance(found, (ShardUnavailable, CommandError)):
                self._fail(sub, _unavailable(found))
                return
        self.shards.send(sub.link, baqend.load(sub.key, scans), lambda result: self._loaded(sub, result))

    def _loaded(self, sub: _Subscription, result: Any) -> None:
        if self.by_key.get(sub.key) is not sub:
            return
        if result is not True:
            self._fail(sub, _unavailable(result))
            return
        sub.loaded = True

    def _unsubscribe(self, sub_id: str) -> None:
        sub = self.subs.get(sub_id)
        if sub is not None:
            self._remove(sub)

    def _remove(self, sub: _Subscription) -> None:
        self.subs.pop(sub.sub_id, None)
        self.by_key.pop(sub.key, None)
        self.shards.send(sub.link, baqend.unsubscribe(sub.key))

    def _fail(self, sub: _Subscription, error: ProtocolError) -> None:
        """The subscription ends with an error message (the spec's only way for the server to end it)."""
        if self.subs.get(sub.sub_id) is sub:
            self._remove(sub)
            self._send_error(sub.sub_id, error)

    def _send_error(self, sub_id: str | None, error: ProtocolError) -> None:
        self.wire.send_text(codec.encode_error(sub_id, error, codec.date_now()))


def _unavailable(result: Any) -> ProtocolError:
    if isinstance(result, CommandError):
        return ProtocolError(result.message, 400, codec.BAD_REQUEST)
    return ProtocolError("The router could not run the query; subscribe again", 503, "Service Unavailable")


def endpoints(gateway: Any, config: Any) -> list[Dialect]:
    """What a gateway serves of this dialect (the dialect table calls it)."""
    return [BaqendDialect(gateway, config)]
