"""mx-notifier hub's part of a topic shard: the consumers' filters, each event matched once for all."""

from __future__ import annotations

from typing import Any

from actors.mx.contract import Op, Stream, mx_frames, unpack_items
from actors.mx.match import MxMatchIndex, Subscription
from actors.shard import Component, Handler
from router.contract import DELIVER_EVENTS, Location
from router.shardmap import TOPIC


class MxFilters(Component):
    name = "mx"

    def __init__(self, shard: Any) -> None:
        super().__init__(shard)
        self.index = MxMatchIndex()

    def operations(self) -> dict[str, Handler]:
        return {Op.SUBSCRIBE: self.subscribe, Op.PUBLISH: self.publish}

    def subscribe(self, gateway_id: str, connection_id: int, subscription: Subscription) -> bool:
        return self.index.add((gateway_id, connection_id), subscription)

    def publish(self, gateway_id: str, packed: bytes, meta: tuple | None = None) -> int:
        """Deliver a block's items (``packed``: ``contract.publish``) to the connections they
        select; returns the deliveries.

        Each connection gets one ``MxFrames`` payload: the tails of the items it selects, in block
        order (its gateway writes them in one go, each with the consumer's next counter). A tail is
        one object shared by every connection it goes to: the lane pickles it once.
        """
        index = self.index
        if index.empty:
            return 0
        items = unpack_items(packed)
        delivered = 0
        everyone = None
        selected: dict[Location, list[bytes]] = {}
        for stream, fields, _topic, tail in items:
            if stream == Stream.EVENT:
                keys = index.match_fields(*fields)
            elif stream == Stream.BLOCK:
                keys = everyone if everyone is not None else index.connections()
                everyone = keys
            else:
                keys = index.all_connections()
            for key in keys:
                tails = selected.get(key)
                if tails is None:
                    selected[key] = [tail]
                else:
                    tails.append(tail)
            delivered += len(keys)
        emit = self.emit
        for (gateway, connection_id), tails in selected.items():
            emit({gateway: (connection_id,)}, mx_frames(tuple(tails), meta), DELIVER_EVENTS)
        return delivered

    def purge_connection(self, location: Location) -> None:
        self.index.remove_connection(location)

    def purge_gateway(self, gateway_id: str) -> int:
        gone = [location for location in self.index.connections() if location[0] == gateway_id]
        for location in gone:
            self.index.remove_connection(location)
        return len(gone)

    def stats(self) -> dict[str, Any]:
        return {} if self.index.empty else {"mx": self.index.stats()}


# What the mx hub adds to which shard kind (the dialect table reads it).
COMPONENTS = {TOPIC: (MxFilters,)}
