"""A Baqend document shard forwards each batch's writes to every query shard over lanes
(actors/baqend/shard.py ``BaqendDocuments._send``): real shards and real lanes in this process,
Ray's calls played by a stand-in that runs them at once. The first batch goes by Ray call while
the lanes open; a lane that breaks mid-call sends its batch again by Ray call (dropped by the query
shard if it had run), the next batches go by Ray until the back-off passed, and a new lane follows.
Every live query gets each write's event exactly once, in order."""

from __future__ import annotations

import threading
import time
import types
from typing import Any

import pytest

from actors.baqend import contract as baqend
from actors.baqend import shard as baqend_shard
from actors.baqend.livequeries import QuerySpec
from actors.shard import Shard
from router import contract
from router.lane import LaneServer
from router.settings import load_settings

DOCUMENT = "document-shard-0"


class _Ref:
    """A Ray object ref the stand-in resolved (or not yet: ``ready`` False)."""

    def __init__(self, value: Any = None, error: Exception | None = None, ready: bool = True) -> None:
        self.value, self.error, self.ready = value, error, ready

    def result(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


class _Method:
    def __init__(self, run) -> None:
        self.run = run
        self.calls: list[tuple] = []

    def remote(self, *args) -> _Ref:
        self.calls.append(args)
        return self.run(*args)


class _QueryActor:
    """A query shard's Ray handle: ``handle`` runs the batch at once; ``open_lane`` answers the
    lane's address (or nothing yet, or an error, as the test says)."""

    def __init__(self, shard: Shard) -> None:
        self.shard = shard
        self.server = shard._lane = LaneServer(shard.name, shard.handle)
        self.server.on_detach = shard._lane_closed
        self.opens: list[_Ref] = []
        self.handle = _Method(lambda caller, commands: _Ref(shard.handle(caller, commands)))
        self.open_lane = _Method(self._open)

    def _open(self, node_id: str) -> _Ref:
        assert node_id == "node-1"
        ref = _Ref(("unix", self.server.unix_address(), self.server.secret))
        self.opens.append(ref)
        return ref


def _ray(actors: dict[str, _QueryActor]) -> Any:
    def wait(refs, num_returns=1, timeout=None):
        return [ref for ref in refs if ref.ready], [ref for ref in refs if not ref.ready]

    return types.SimpleNamespace(
        wait=wait, get=lambda ref, timeout=None: ref.result(),
        get_actor=lambda name, namespace=None: actors[name],
        get_runtime_context=lambda: types.SimpleNamespace(get_node_id=lambda: "node-1"))


class _Gateway:
    """The gateway the query shards deliver to (by its Ray ``deliver``: it has no lane here)."""

    def __init__(self) -> None:
        self.bundles: list[tuple] = []
        self.deliver = _Method(lambda bundle: self.bundles.append(bundle))

    def events(self) -> dict[str, list[tuple]]:
        """Per query shard, (sub key, matchType, operation, key) of every event it delivered, in order
        (the query shards deliver from their own threads: only each one's order is defined)."""
        found: dict[str, list[tuple]] = {}
        for source, _, _, items in self.bundles:
            for _, payload, _, _ in items:
                if type(payload) is tuple:  # baqend.matches (a result or a baseline is a NamedTuple)
                    key, events = payload[0], payload[1]
                    found.setdefault(source, []).extend(
                        (key, event["matchType"], event["operation"], event["data"]["id"].rsplit("/", 1)[1])
                        for event in events)
        return found


@pytest.fixture
def router(tmp_path, monkeypatch):
    settings = load_settings(data_dir=tmp_path, metrics={"enabled": False}, shards={"document": 1, "query": 2},
                             baqend={"request_timeout_s": 1.0})
    queries = [Shard("query", i, settings, [baqend_shard.BaqendQueries]) for i in range(2)]
    actors = {shard.name: _QueryActor(shard) for shard in queries}
    monkeypatch.setattr(baqend_shard, "ray", _ray(actors))
    documents = Shard("document", 0, settings, [baqend_shard.BaqendDocuments])
    gateway = _Gateway()
    for shard in queries:
        shard._gateways["gw"] = gateway
        key = f"{shard.name}/sub"
        (scan,), _ = documents.handle("gw", [baqend.scan("Todo")])
        results, _ = shard.handle("gw", [baqend.subscribe(key, 1, "s", QuerySpec("Todo")), baqend.page(key, scan),
                                         baqend.load(key, 1)])
        assert results == [True, True, True]
    gateway.bundles.clear()
    yield types.SimpleNamespace(documents=documents, component=documents.components[0], queries=queries,
                                actors=actors, gateway=gateway)
    for target in documents.components[0]._query_shards or ():
        if target.lane is not None:
            target.lane.close()
    for actor in actors.values():
        actor.server.close()


def _insert(router, key: str) -> None:
    results, _ = router.documents.handle("gw", [baqend.insert("Todo", key, {"n": 1})])
    assert results[0]["id"] == f"/db/Todo/{key}"


def _added(*keys: str) -> dict[str, list[tuple]]:
    return {f"query-shard-{i}": [(f"query-shard-{i}/sub", "add", "insert", key) for key in keys] for i in range(2)}


def _stats(router) -> tuple[int, int, int, int]:
    stats = router.component.stats()
    return (stats["forward_lanes"], stats["forward_lane_batches"], stats["forward_ray_batches"],
            stats["forward_lanes_lost"])


def _ray_calls(router) -> list[int]:
    return [len(actor.handle.calls) for actor in router.actors.values()]


def test_the_first_batch_goes_by_ray_call_while_the_lanes_open_and_the_next_ones_over_them(router):
    _insert(router, "a")
    assert _ray_calls(router) == [1, 1] and [len(a.opens) for a in router.actors.values()] == [1, 1]
    for key in "bcd":
        _insert(router, key)
    assert _ray_calls(router) == [1, 1]  # no Ray call since the first batch
    assert _stats(router) == (2, 6, 2, 0)
    assert router.gateway.events() == _added("a", "b", "c", "d")
    for shard in router.queries:  # the document shard is a lane peer, not a gateway
        info = shard.info()
        assert info["lanes"] == [] and info["lane_kinds"] == {} and info["shard_lanes"] == [DOCUMENT]
        assert info["repeated_writes"] == 0
        threads = {thread.name for thread in threading.enumerate()}
        shard._lane_closed(DOCUMENT)  # not a gateway that may be gone: nothing to watch or purge
        assert shard._watched == set() and {thread.name for thread in threading.enumerate()} == threads


def test_an_open_lane_that_is_not_answered_yet_leaves_the_batch_to_a_ray_call(router):
    router.actors["query-shard-1"].open_lane.run = lambda node_id: _Ref(ready=False)  # never answers
    _insert(router, "a")
    _insert(router, "b")
    assert _ray_calls(router) == [1, 2] and _stats(router) == (1, 1, 3, 0)
    assert router.gateway.events() == _added("a", "b")


def test_a_lane_broken_after_its_batch_ran_sends_it_again_by_ray_and_the_repeat_is_dropped(router):
    _insert(router, "a")
    _insert(router, "b")
    server = router.actors["query-shard-1"].server
    execute = server.execute

    def runs_then_breaks(caller: str, commands: list) -> tuple:
        execute(caller, commands)
        raise RuntimeError("the reply is lost")  # the lane server closes the lane

    server.execute = runs_then_breaks
    _insert(router, "c")
    assert _ray_calls(router) == [1, 2] and _stats(router) == (1, 3, 3, 1)
    assert router.queries[1].info()["repeated_writes"] == 1
    server.execute = execute
    _insert(router, "d")  # within the back-off: by Ray call again, no new lane tried
    assert _ray_calls(router) == [1, 3] and len(router.actors["query-shard-1"].opens) == 1
    router.component._query_shards[1].retry_at = 0.0  # the back-off passed
    _insert(router, "e")  # opens a new lane, still by Ray call
    _insert(router, "f")  # over the new lane
    assert _ray_calls(router) == [1, 4] and len(router.actors["query-shard-1"].opens) == 2
    assert _stats(router) == (2, 7, 5, 1)
    assert router.gateway.events() == _added(*"abcdef")


def test_a_lane_whose_shard_closed_it_sends_the_batch_by_ray_call(router):
    _insert(router, "a")
    _insert(router, "b")
    target = router.component._query_shards[0]
    router.actors["query-shard-0"].server.drop(DOCUMENT)  # as when the query shard's process died
    deadline = time.monotonic() + 5
    while DOCUMENT in router.actors["query-shard-0"].server.connected():
        assert time.monotonic() < deadline
        time.sleep(0.001)
    _insert(router, "c")
    assert target.lane is None and _ray_calls(router) == [2, 1] and _stats(router)[3] == 1
    assert router.queries[0].info()["repeated_writes"] == 0  # it never ran the batch
    assert router.gateway.events() == _added("a", "b", "c")


def test_a_healing_query_shard_refuses_writes_over_its_lane_until_its_gateways_are_back(router):
    _insert(router, "a")
    _insert(router, "b")
    shard = router.queries[0]
    shard._healing, shard._heal_deadline = {"gw"}, time.monotonic() + 60
    server = router.actors["query-shard-0"].server
    execute, refused = server.execute, []

    def heals_after_one_refusal(caller: str, commands: list) -> tuple:
        results, bundle = execute(caller, commands)
        if isinstance(results[0], Exception):
            refused.append(results[0].code)
            shard.handle("gw", [contract.reannounced()])  # the gateway is back
        return results, bundle

    server.execute = heals_after_one_refusal
    _insert(router, "c")
    assert refused == [contract.HEALING] and _ray_calls(router) == [1, 1]
    assert _stats(router) == (2, 5, 2, 0)  # query-shard-0 got c twice over its lane
    assert router.gateway.events() == _added("a", "b", "c")


def test_a_late_reply_keeps_the_lane_and_the_order_of_the_batches(router):
    _insert(router, "a")
    _insert(router, "b")
    server = router.actors["query-shard-0"].server
    execute, release = server.execute, threading.Event()

    def slow(caller: str, commands: list) -> tuple:
        release.wait(5)
        return execute(caller, commands)

    server.execute = slow
    started = time.monotonic()
    _insert(router, "c")  # query-shard-0 does not answer within the forward timeout (0.5 s)
    assert 0.5 <= time.monotonic() - started < 3
    target = router.component._query_shards[0]
    assert target.lane is not None and target.lane.owed == 1
    release.set()
    _insert(router, "d")  # the same lane: after c, never before it
    assert target.lane.owed == 0 and _ray_calls(router) == [1, 1]
    assert router.gateway.events() == _added(*"abcd")
