"""A topic shard's dialect components without Ray: retained values (Cashu) and mx filters, through handle()."""

from __future__ import annotations

import pytest

from actors.cashu import contract as cashu
from actors.cashu.retained import MemoryRetainedStore, RetainedValues
from actors.cashu.shard import CashuRetained
from actors.mx import contract as mx
from actors.mx.contract import Stream
from actors.mx.match import Subscription
from actors.mx.shard import MxFilters
from actors.pubsub import PubSub
from actors.shard import Shard
from router import contract
from router.contract import DELIVER_EVENT, DELIVER_EVENTS
from router.shardmap import TOPIC
from gateways.mx import codec, generator, node
from gateways.mx.ingest import block_items
from gateways.mx.session import wants_acknowledge
from router.settings import load_settings


MX_EVENT, MX_BLOCK, MX_ALL = Stream.EVENT, Stream.BLOCK, Stream.ALL


@pytest.fixture
def shard(tmp_path) -> Shard:
    settings = load_settings(data_dir=tmp_path, metrics={"enabled": False})
    shard = Shard(TOPIC, 0, settings, (PubSub, CashuRetained, MxFilters))
    shard.store = MemoryRetainedStore()
    shard.component(CashuRetained)._retained = RetainedValues(shard.store)
    return shard


def items_of(bundle):
    return [] if bundle is None else bundle[3]


def test_rsub_returns_the_current_value_and_rset_delivers_newer_ones(shard):
    results, bundle = shard.handle("g", [cashu.subscribe_many(("k",), 1), cashu.set_state("k", b"v1"),
                                         cashu.subscribe_many(("k",), 2)])
    assert results == [[None], (1, 1), [(1, b"v1")]]
    assert items_of(bundle) == [(DELIVER_EVENT, ("k", 1, b"v1", None), (1,), None)]
    results, bundle = shard.handle("g", [cashu.set_state("k", b"v2", ("meta",))])
    assert results == [(2, 2)]
    assert items_of(bundle) == [(DELIVER_EVENT, ("k", 2, b"v2", ("meta",)), (1, 2), None)]
    assert shard.store.rows == {"k": (2, b"v2")}  # committed before the batch returned


def test_rinit_stores_only_when_absent(shard):
    results, bundle = shard.handle("g", [cashu.subscribe_many(("q",), 5), cashu.init_many(("q",), (b"fetched",)),
                                         cashu.init_many(("q",), (b"late",))])
    assert results == [[None], [(1, b"fetched")], [(1, b"fetched")]]
    assert items_of(bundle) == [(DELIVER_EVENT, ("q", 1, b"fetched", None), (5,), None)]


def test_mx_filters_select_events_once_per_connection(shard):
    saved = generator.generate_save_block(3, transactions=10)
    normalized = node.normalize_save_block(saved)
    block_hash, items = block_items(normalized)
    first = normalized.events[0]
    shard.handle("g", [mx.subscribe(1, Subscription("All")),
                       mx.subscribe(2, Subscription("Address", address=first.address)),
                       mx.subscribe(2, Subscription("Identifier", identifier=first.identifier)),
                       mx.subscribe(3, Subscription("Identifier", identifier="nothing-like-this"))])
    results, bundle = shard.handle("g", [mx.publish(items)])
    delivered = items_of(bundle)
    # one payload per connection: the tails its filters select, in block order
    to = {}
    for kind, (tails, meta), connections, _ in delivered:
        assert kind == DELIVER_EVENTS and len(connections) == 1 and connections[0] not in to
        to[connections[0]] = list(tails)
    tail_of = {id(e): codec.frame_tail(codec.EVENTS_TOPIC, e.SerializeToString()) for e in normalized.events}
    expected_2 = [e for e in normalized.events if e.address == first.address or e.identifier == first.identifier]
    assert to[1] == [tail for _, _, _, tail in items]  # All: every event, then the block's txs and scrs
    assert to[1][:len(normalized.events)] == [tail_of[id(e)] for e in normalized.events]
    assert to[2] == [tail_of[id(e)] for e in expected_2]
    assert 3 not in to
    assert results == [sum(len(tails) for _, (tails, _), _, _ in delivered)]
    shared = {id(tail) for tails in to.values() for tail in tails}
    assert len(shared) == len(items)  # a tail is one object, whoever it goes to
    # revert / finalized reach every connection with a filter
    _, revert_items = block_items(node.normalize_revert(saved.BlockData))
    assert revert_items[0][0] == MX_BLOCK
    _, bundle = shard.handle("g", [mx.publish(revert_items)])
    assert sorted(item[2][0] for item in items_of(bundle)) == [1, 2, 3]
    assert all(tails == (revert_items[0][3],) for _, (tails, _), _, _ in items_of(bundle))
    # a closed connection's filters go with its purge
    shard.handle("g", [contract.purge(1)])
    _, bundle = shard.handle("g", [mx.publish(items)])
    assert all(1 not in connections for _, _, connections, _ in items_of(bundle))


def test_block_items_encode_each_frame_tail_once():
    normalized = node.normalize_save_block(generator.generate_save_block(9, transactions=4))
    block_hash, items = block_items(normalized)
    assert block_hash == normalized.hash
    events = [item for item in items if item[0] == MX_EVENT]
    assert [fields for _, fields, _, _ in events] == [(e.address, e.identifier, tuple(e.topics)) for e in normalized.events]
    assert events[0][3] == codec.frame_tail(codec.EVENTS_TOPIC, normalized.events[0].SerializeToString())
    assert [item[0] for item in items if item[0] != MX_EVENT] == [MX_ALL, MX_ALL]


@pytest.mark.parametrize("query, default, expected", [
    ("", False, False), ("", True, True), ("ack=1", False, True), ("x=2&ack=true", False, True),
    ("ack=0", True, False), ("with_acknowledge=yes", False, True), ("ack=no", True, False),
])
def test_acknowledge_choice_from_the_url(query, default, expected):
    assert wants_acknowledge(query, default) is expected


def test_a_component_that_cannot_commit_fails_only_its_commands_and_starts_the_next_batch_clean():
    """Before: an exception in after_batch failed the whole call, and a component whose pending
    state stayed behind failed every later batch (a poisoned shard)."""
    from actors.shard import Component, Shard
    from router.errors import CommandError

    class Store(Component):
        name = "store"

        def __init__(self, shard):
            super().__init__(shard)
            self.pending, self.stored, self.aborted = [], [], 0

        def operations(self):
            return {"store.put": self.put}

        def put(self, gateway_id, value):
            self.pending.append(value)
            return value

        def after_batch(self):
            if any(value == "poison" for value in self.pending):
                raise ValueError("cannot encode")
            self.stored.extend(self.pending)
            self.pending.clear()

        def abort_batch(self):
            self.aborted += 1
            self.pending.clear()

    class Echo(Component):
        name = "echo"

        def operations(self):
            return {"echo.say": lambda gateway_id, value: value}

    settings = load_settings(metrics={"enabled": False})
    shard = Shard("topic", 0, settings, [Store, Echo])
    store = shard.component(Store)
    results, _ = shard.handle("gw", [("store.put", "a"), ("echo.say", "hi"), ("store.put", "poison"),
                                     ("store.put", "bad", "arity")])
    assert [type(r).__name__ if isinstance(r, CommandError) else r for r in results] == [
        "CommandError", "hi", "CommandError", "CommandError"]
    assert (results[0].code, results[0].message) == ("internal_error", "the write could not be stored")
    assert results[3].message.startswith("TypeError")  # its own error is kept
    assert store.aborted == 1 and store.stored == []
    results, _ = shard.handle("gw", [("store.put", "b"), ("echo.say", "again")])
    assert results == ["b", "again"] and store.stored == ["b"] and store.aborted == 1


def test_nolag_keeps_logged_messages_when_the_log_cannot_store_them_and_stores_them_later(tmp_path):
    """Before: the pending records were cleared before the append, so a failed append lost them
    from the replay log."""
    from actors.nolag import contract as nolag
    from actors.nolag.messagelog import MessageLog
    from actors.nolag.shard import NolagTopics

    class FlakyLog(MessageLog):
        def __init__(self):
            self.records, self.fail = [], True

        def append_many(self, records):
            if self.fail:
                raise OSError("disk full")
            self.records.extend(records)
            return len(records)

        def since(self, topics, after_ts_ms, limit, newest=False):
            return [r for r in self.records if r.topic in topics and r.ts_ms > after_ts_ms][:limit]

        def prune(self, now_ms):
            return 0

    settings = load_settings(data_dir=tmp_path, metrics={"enabled": False})
    shard = Shard(TOPIC, 0, settings, (PubSub, NolagTopics))
    log = shard.component(NolagTopics)._log = FlakyLog()
    key = "nolag/p/app/room/t"
    results, _ = shard.handle("g", [nolag.publish(key, "app/room/t", b"\x01", 1, None, None, "m1", "actor")])
    assert results == [0]  # delivered (to nobody here), answered
    assert log.records == []
    log.fail = False
    results, _ = shard.handle("g", [nolag.publish(key, "app/room/t", b"\x02", 1, None, None, "m2", "actor")])
    assert results == [0]
    assert [record.msg_id for record in log.records] == ["m1", "m2"]
    assert [m.msg_id for m in shard.handle("g", [nolag.log(key, 0, 10)])[0][0]] == ["m1", "m2"]


def test_a_failing_retention_prune_does_not_fail_the_batch_it_follows(tmp_path):
    """Pruning is housekeeping: before, a prune that failed (the store unreachable) made the base
    answer every NoLag command of the batch with an error although each was delivered and logged,
    and clients sent them again."""
    from actors.nolag import contract as nolag
    from actors.nolag.shard import NolagTopics

    settings = load_settings(data_dir=tmp_path, metrics={"enabled": False})
    shard = Shard(TOPIC, 0, settings, (PubSub, NolagTopics))
    topics = shard.component(NolagTopics)
    log = topics.message_log

    def unreachable(now_ms, retention=None):
        raise OSError("the store is unreachable")

    log.prune = unreachable
    topics._next_prune = 0  # due with this batch
    key = "nolag/p/app/room/t"
    results, _ = shard.handle("g", [nolag.publish(key, "app/room/t", b"\x01", 1, None, None, "m1", "actor")])
    assert results == [0]
    assert [m.msg_id for m in shard.handle("g", [nolag.log(key, 0, 10)])[0][0]] == ["m1"]
