"""The core pub/sub of topic shards: subscribers per topic, a payload fanned out to all of them."""

from __future__ import annotations

from typing import Any

from actors.shard import Component, Handler
from actors.topics import TopicTable
from router.contract import Location, Op


class PubSub(Component):
    """Topics in the core namespace (``<dialect>/<topic>``), answering ``Op.SUBSCRIBE``,
    ``Op.UNSUBSCRIBE`` and ``Op.PUBLISH``. Other components may keep subscribers in its table
    (Cashu's retained values do)."""

    name = "pubsub"

    def __init__(self, shard: Any) -> None:
        super().__init__(shard)
        self.table = TopicTable()

    def operations(self) -> dict[str, Handler]:
        return {Op.SUBSCRIBE: self.subscribe, Op.UNSUBSCRIBE: self.unsubscribe, Op.PUBLISH: self.publish}

    def subscribe(self, gateway_id: str, topic: str, connection_id: int, info: Any = None) -> bool:
        return self.table.subscribe(topic, (gateway_id, connection_id), info)

    def unsubscribe(self, gateway_id: str, topic: str, connection_id: int) -> bool:
        return self.table.unsubscribe(topic, (gateway_id, connection_id))

    def publish(self, gateway_id: str, topic: str, payload: Any, kind: int, exclude: int | None = None,
                meta: tuple | None = None) -> int:
        count, routes = self.table.routes(topic, None if exclude is None else (gateway_id, exclude))
        if count:
            self.shard.emit(routes, payload, kind, meta)
        return count

    def purge_connection(self, location: Location) -> None:
        self.table.purge_connection(location)

    def purge_gateway(self, gateway_id: str) -> int:
        return self.table.purge_gateway(gateway_id)

    def stats(self) -> dict[str, Any]:
        return self.table.stats()
