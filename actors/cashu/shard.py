"""Cashu's part of a topic shard: retained object states over the core pub/sub table."""

from __future__ import annotations

from typing import Any

from actors.cashu.contract import Op, RetainedEvent, Stored
from actors.cashu.retained import Retained, RetainedValues, open_retained_store
from actors.pubsub import PubSub
from actors.shard import Component, Handler
from router.contract import DELIVER_EVENT
from router.shardmap import TOPIC


class CashuRetained(Component):
    """Each state is delivered as a ``DELIVER_EVENT`` whose payload is a :class:`RetainedEvent`;
    see :mod:`actors.cashu.retained` for the ordering and storage guarantees."""

    name = "cashu"

    def __init__(self, shard: Any) -> None:
        super().__init__(shard)
        self.table = shard.component(PubSub).table
        self._retained: RetainedValues | None = None

    @property
    def retained(self) -> RetainedValues:
        """Opened on first use, so routers that never retain anything create no database."""
        if self._retained is None:
            self._retained = RetainedValues(open_retained_store(self.settings))
        return self._retained

    def operations(self) -> dict[str, Handler]:
        return {Op.SUBSCRIBE_MANY: self.subscribe_many, Op.UNSUBSCRIBE_MANY: self.unsubscribe_many,
                Op.SET: self.set_state, Op.INIT_MANY: self.init_many}

    def subscribe_many(self, gateway_id: str, keys: tuple[str, ...], connection_id: int) -> list[Retained | None]:
        """Subscribe and read each current value in one step: later values are delivered after it."""
        location, table, retained = (gateway_id, connection_id), self.table, self.retained
        for key in keys:
            table.subscribe(key, location)
        return [retained.get(key) for key in keys]

    def unsubscribe_many(self, gateway_id: str, keys: tuple[str, ...], connection_id: int) -> int:
        location = (gateway_id, connection_id)
        return sum(self.table.unsubscribe(key, location) for key in keys)

    def set_state(self, gateway_id: str, key: str, payload: bytes, meta: tuple | None = None) -> Stored:
        version = self.retained.put(key, payload)
        count, routes = self.table.routes(key)
        if count:
            self.emit(routes, RetainedEvent(key, version, payload, meta), DELIVER_EVENT)
        return Stored(version, count)

    def init_many(self, gateway_id: str, keys: tuple[str, ...], payloads: tuple[bytes, ...]) -> list[Retained]:
        return [self._init(key, payload) for key, payload in zip(keys, payloads)]

    def _init(self, key: str, payload: bytes) -> Retained:
        value, stored = self.retained.put_if_absent(key, payload)
        if stored:
            count, routes = self.table.routes(key)
            if count:
                self.emit(routes, RetainedEvent(key, value.version, payload, None), DELIVER_EVENT)
        return value

    def after_batch(self) -> None:
        retained = self._retained
        if retained is not None and retained.dirty:
            retained.commit()  # before the results leave: an acknowledged value is stored

    def stats(self) -> dict[str, Any]:
        return {} if self._retained is None else {"retained": self._retained.stats()}


# What Cashu adds to which shard kind (the dialect table reads it).
COMPONENTS = {TOPIC: (CashuRetained,)}
