"""Signal Hub's registry shards: the named actors whose address hashes here."""

from __future__ import annotations

from typing import Any

from actors.shard import Component, Handler
from actors.signal.contract import REGISTRY, Op
from actors.signal.registry import Registration, Registry
from router.contract import Location, now_ms
from router.errors import CommandError
from router.patterns import PatternError, compile_pattern

SWEEP_EVERY_MS = 1000


class SignalRegistry(Component):
    name = "signal"

    def __init__(self, shard: Any) -> None:
        super().__init__(shard)
        signal = self.settings.signal
        # The actor limit is global; each shard holds an equal share of it (keys hash uniformly).
        share = -(-signal.max_actors // self.settings.shards.registry)
        self.registry = Registry(max_entries=share)
        self._max_pattern_length = signal.max_pattern_length
        self._next_sweep = 0

    def operations(self) -> dict[str, Handler]:
        return {Op.REGISTER: self.register, Op.UNREGISTER: self.unregister, Op.RENEW: self.renew,
                Op.SEND: self.send, Op.DISCOVER: self.discover, Op.DESCRIBE: self.describe,
                Op.BROADCAST: self.broadcast, Op.RESTORE: self.restore_registration}

    def before_batch(self) -> None:
        if self.now >= self._next_sweep:
            self.registry.sweep(self.now)
            self._next_sweep = self.now + SWEEP_EVERY_MS

    def register(self, gateway_id, address, connection_id, session_id, capabilities, metadata, ttl_ms):
        return self.registry.register(address, (gateway_id, connection_id), session_id, capabilities, metadata,
                                      ttl_ms, self.now)

    def restore_registration(self, gateway_id, address, connection_id, session_id, capabilities, metadata,
                             registered_at, expires_at, version, renewal_token):
        return self.registry.restore(Registration(address, (gateway_id, connection_id), session_id,
                                                  tuple(capabilities), metadata, registered_at, expires_at, version,
                                                  renewal_token), self.now)

    def unregister(self, gateway_id, address, connection_id):
        self.registry.unregister(address, (gateway_id, connection_id), self.now)
        return self.now

    def renew(self, gateway_id, address, connection_id, token, ttl_ms):
        return self.registry.renew(address, (gateway_id, connection_id), token, ttl_ms, self.now)

    def send(self, gateway_id: str, address: str, payload: Any, kind: int, meta: tuple | None = None) -> bool:
        registration = self.registry.lookup(address, self.now)
        if registration is None:
            return False
        target_gateway, target_connection = registration.location
        self.emit({target_gateway: (target_connection,)}, payload, kind, meta)
        return True

    def discover(self, gateway_id, pattern, capabilities, metadata, window):
        try:
            matcher = None if pattern is None else compile_pattern(pattern, self._max_pattern_length)
        except PatternError as error:
            raise CommandError("invalid_pattern", str(error)) from None
        count, found = self.registry.discover(self.now, window, matcher, capabilities, metadata)
        return count, [registration.address for registration in found]

    def describe(self, gateway_id: str, addresses: list[str]) -> list[dict[str, Any]]:
        registry, now = self.registry, self.now
        found = (registry.lookup(address, now) for address in addresses)
        return [registration.describe() for registration in found if registration is not None]

    def broadcast(self, gateway_id: str, payload: Any, kind: int, exclude: int | None = None,
                  meta: tuple | None = None) -> int:
        count, routes = self.registry.broadcast_routes(self.now, None if exclude is None else (gateway_id, exclude))
        if count:
            self.emit(routes, payload, kind, meta)
        return count

    def purge_connection(self, location: Location) -> None:
        self.registry.purge_connection(location)

    def purge_gateway(self, gateway_id: str) -> int:
        return self.registry.purge_gateway(gateway_id)

    def stats(self) -> dict[str, Any]:
        return self.registry.stats(now_ms())


# What Signal Hub adds to which shard kind (the dialect table reads it).
COMPONENTS = {REGISTRY: (SignalRegistry,)}
