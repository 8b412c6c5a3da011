"""gateways/shardclient.py: each dialect's requests time out after its own request_timeout_s,
also when they share a batch with another dialect's (a fake shard handle, no Ray)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import types

from gateways.shardclient import ShardClient
from router.errors import ShardUnavailable


class _Handle:
    """``shard.call.remote(gateway, commands)``: a ref whose future the test resolves (or never)."""

    def __init__(self) -> None:
        self.calls: list[list] = []
        self.futures: list[concurrent.futures.Future] = []
        self.call = self

    def remote(self, gateway_id, commands):
        self.calls.append(list(commands))
        future = concurrent.futures.Future()
        self.futures.append(future)
        return types.SimpleNamespace(future=lambda: future)


def _client(loop, handle, timeout_s=10.0) -> ShardClient:
    return ShardClient("gw-1", {"topic": [("topic-shard-0", handle)]}, loop, on_bundle=lambda bundle: None,
                       batch_max=100, max_inflight=4, timeout_s=timeout_s)


async def _until(predicate, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


def _recorder(loop, started, answers, name):
    def record(result):
        answers.append((name, loop.time() - started, result))
    return record


def test_requests_in_one_batch_time_out_after_their_own_dialects_timeout():
    async def scenario():
        loop = asyncio.get_running_loop()
        handle = _Handle()
        client = _client(loop, handle)
        fast, slow = client.view(0.05), client.view(0.3)
        link = fast.link("topic", "k")
        started, answers = loop.time(), []
        fast.send(link, ("a",), _recorder(loop, started, answers, "fast"))
        slow.send(link, ("b",), _recorder(loop, started, answers, "slow"))
        client.send(link, ("c",), _recorder(loop, started, answers, "core"))  # the client's own default: 10 s
        await _until(lambda: len(answers) == 2)
        assert handle.calls == [[("a",), ("b",), ("c",)]]  # one batch
        (first, t1, e1), (second, t2, e2) = answers
        assert (first, second) == ("fast", "slow")
        assert isinstance(e1, ShardUnavailable) and str(e1) == "topic-shard-0 did not answer in 0.05s"
        assert isinstance(e2, ShardUnavailable) and str(e2) == "topic-shard-0 did not answer in 0.3s"
        assert 0.05 <= t1 < 0.3 <= t2
        assert client.pending == 1 and len(link.inflight) == 1  # the 10 s request still waits
        handle.futures[0].set_result((["A", "B", "C"], None, "e1"))
        await _until(lambda: len(answers) == 3)
        assert answers[2][0] == "core" and answers[2][2] == "C"
        assert client.pending == 0 and not link.inflight
        client.close()

    asyncio.run(scenario())


def test_a_late_answer_reaches_only_the_requests_still_waiting():
    async def scenario():
        loop = asyncio.get_running_loop()
        handle = _Handle()
        client = _client(loop, handle)
        fast, slow = client.view(0.05), client.view(5.0)
        link = fast.link("topic", "k")
        started, answers = loop.time(), []
        fast.send(link, ("a",), _recorder(loop, started, answers, "fast"))
        slow.send(link, ("b",), _recorder(loop, started, answers, "slow"))
        slow.send(link, ("c",))  # no callback: counted while pending all the same
        await _until(lambda: len(answers) == 1)
        assert answers[0][0] == "fast" and isinstance(answers[0][2], ShardUnavailable)
        assert client.pending == 2
        handle.futures[0].set_result((["A", "B", "C"], None, "e1"))
        await _until(lambda: len(answers) == 2)
        assert [(name, result) for name, _, result in answers[1:]] == [("slow", "B")]
        assert client.pending == 0 and not link.inflight
        client.send(link, ("d",), answers.append)  # the link goes on
        await _until(lambda: len(handle.calls) == 2)
        handle.futures[1].set_result((["D"], None, "e1"))
        await _until(lambda: answers[-1] == "D")
        assert client.pending == 0
        client.close()

    asyncio.run(scenario())


def test_a_failed_shard_answers_each_waiting_request_once():
    async def scenario():
        loop = asyncio.get_running_loop()
        handle = _Handle()
        client = _client(loop, handle)
        fast, slow = client.view(0.05), client.view(5.0)
        link = fast.link("topic", "k")
        started, answers = loop.time(), []
        fast.send(link, ("a",), _recorder(loop, started, answers, "fast"))
        slow.send(link, ("b",), _recorder(loop, started, answers, "slow"))
        await _until(lambda: len(answers) == 1)
        handle.futures[0].set_exception(RuntimeError("actor died"))
        await _until(lambda: len(answers) == 2)
        assert [name for name, _, _ in answers] == ["fast", "slow"]
        assert str(answers[1][2]) == "topic-shard-0 unavailable: RuntimeError"
        await asyncio.sleep(0)  # nothing else arrives
        assert len(answers) == 2 and client.pending == 0 and not link.inflight
        client.close()

    asyncio.run(scenario())


def test_views_share_the_clients_links_and_batches():
    async def scenario():
        loop = asyncio.get_running_loop()
        handle = _Handle()
        client = _client(loop, handle)
        view = client.view(1.0)
        assert view.link("topic", "k") is client.link("topic", "k")
        assert view.all("topic") == client.all("topic")
        answer = view.request(view.link("topic", "k"), ("a",))
        await _until(lambda: handle.calls)
        handle.futures[0].set_result((["A"], None, "e1"))
        assert await answer == "A"
        gathered = asyncio.ensure_future(view.gather("topic", ("b",)))
        await _until(lambda: len(handle.calls) == 2)
        handle.futures[1].set_result((["B"], None, "e1"))
        assert await gathered == ["B"]
        client.close()

    asyncio.run(scenario())


def test_send_each_answers_once_in_request_order_with_failures_in_their_slots():
    async def scenario():
        loop = asyncio.get_running_loop()
        first, second = _Handle(), _Handle()
        client = ShardClient("gw-1", {"topic": [("topic-shard-0", first), ("topic-shard-1", second)]}, loop,
                             on_bundle=lambda bundle: None, batch_max=100, max_inflight=4, timeout_s=10)
        view = client.view(5.0)
        links = view.all("topic")
        answers: list = []
        view.send_each([(links[1], ("x",)), (links[0], ("y",))], answers.append)
        await _until(lambda: first.calls and second.calls)
        first.futures[0].set_result((["Y"], None, "e1"))
        await asyncio.sleep(0.01)
        assert answers == []  # one answer still missing
        second.futures[0].set_exception(RuntimeError("gone"))
        await _until(lambda: answers)
        [results] = answers
        assert isinstance(results[0], ShardUnavailable) and results[1] == "Y"
        view.send_each([], answers.append)
        assert answers[1] == []
        view.send_all(links, ("z",), answers.append)
        await _until(lambda: len(first.calls) == 2 and len(second.calls) == 2)
        second.futures[1].set_result((["Z1"], None, "e1"))
        first.futures[1].set_result((["Z0"], None, "e1"))
        await _until(lambda: len(answers) == 3)
        assert answers[2] == ["Z0", "Z1"] and client.pending == 0
        client.close()

    asyncio.run(scenario())


def test_a_command_that_cannot_be_serialized_fails_alone_and_the_rest_of_its_batch_goes():
    """Before: one deeply nested value made the whole batch (other clients' commands too) fail."""
    import pickle

    from router.errors import CommandError

    class _Pickling(_Handle):
        def remote(self, gateway_id, commands):
            pickle.dumps(commands)  # as Ray serializes the arguments of a call
            return super().remote(gateway_id, commands)

    async def scenario():
        loop = asyncio.get_running_loop()
        handle = _Pickling()
        client = _client(loop, handle)
        link = client.link("topic", "k")
        deep: list = []
        for _ in range(100_000):
            deep = [deep]
        answers: list = []
        client.send(link, ("a",), lambda result: answers.append(("a", result)))
        client.send(link, ("bad", deep), lambda result: answers.append(("bad", result)))
        client.send(link, ("c",), lambda result: answers.append(("c", result)))
        await _until(lambda: handle.calls)
        assert handle.calls == [[("a",), ("c",)]]
        assert [name for name, _ in answers] == ["bad"]
        assert isinstance(answers[0][1], CommandError) and answers[0][1].code == "bad_request"
        handle.futures[0].set_result((["A", "C"], None, "e1"))
        await _until(lambda: len(answers) == 3)
        assert answers[1:] == [("a", "A"), ("c", "C")]
        assert client.pending == 0 and client.batches_sent == 1 and client.commands_sent == 2
        client.close()

    asyncio.run(scenario())


class _Epoch:
    """``shard.current_epoch.remote()``: answered by the test."""

    def __init__(self) -> None:
        self.futures: list[concurrent.futures.Future] = []

    def remote(self):
        future = concurrent.futures.Future()
        self.futures.append(future)
        return types.SimpleNamespace(future=lambda: future)


async def _heard_e1(timeout_s: float = 10.0) -> tuple:
    """A client whose link has heard its shard as e1 (``("a",)`` answered ``"A"``); the shard's
    epoch is asked through ``handle.current_epoch`` (answered by the test), and a restart
    re-announces ``("resubscribe",)``. Returns ``(handle, client, link, answers)``."""
    handle = _Handle()
    handle.current_epoch = _Epoch()
    client = _client(asyncio.get_running_loop(), handle, timeout_s)
    link = client.link("topic", "k")
    client.on_restart = lambda restarted: client.send(restarted, ("resubscribe",))
    answers = []
    client.send(link, ("a",), answers.append)
    await _until(lambda: handle.calls)
    handle.futures[0].set_result((["A"], None, "e1"))
    await _until(lambda: answers == ["A"])
    return handle, client, link, answers


def test_a_new_epoch_in_a_call_result_makes_the_gateway_re_announce_once():
    async def scenario():
        loop = asyncio.get_running_loop()
        handle = _Handle()
        client = _client(loop, handle)
        link = client.link("topic", "k")
        restarted = []

        def reannounce(restarted_link):
            restarted.append(restarted_link)
            client.send(restarted_link, ("resubscribe",))

        client.on_restart = reannounce
        answers = []
        client.send(link, ("a",), answers.append)
        await _until(lambda: handle.calls)
        handle.futures[0].set_result((["A"], None, "e1"))
        await _until(lambda: answers == ["A"])
        assert restarted == []  # the first epoch a link hears of is no restart
        client.send(link, ("b",), answers.append)
        await _until(lambda: len(handle.calls) == 2)
        handle.futures[1].set_result((["B"], None, "e2"))  # a new incarnation answered
        await _until(lambda: restarted == [link] and len(handle.calls) == 3)
        assert handle.calls[2] == [("resubscribe",), ("core.reannounced",)] and answers == ["A", "B"]
        handle.futures[2].set_result((["R", True], None, "e2"))
        client.send(link, ("c",), answers.append)
        await _until(lambda: len(handle.calls) == 4)
        assert restarted == [link] and client.stats()["restarts_seen"] == 1
        client.close()

    asyncio.run(scenario())


def test_a_link_whose_actor_died_holds_its_commands_until_it_knows_the_epoch():
    from ray.exceptions import RayActorError

    async def scenario():
        handle, client, link, answers = await _heard_e1()
        client.send(link, ("b",), answers.append)
        await _until(lambda: len(handle.calls) == 2)
        handle.futures[1].set_exception(RayActorError())
        await _until(lambda: len(answers) == 2 and handle.current_epoch.futures)
        assert isinstance(answers[1], ShardUnavailable) and link.held
        client.send(link, ("c",), answers.append)
        await asyncio.sleep(0.05)  # a window in which nothing may be sent
        assert len(handle.calls) == 2
        handle.current_epoch.futures[0].set_result("e2")
        await _until(lambda: len(handle.calls) == 3)
        assert handle.calls[2] == [("resubscribe",), ("core.reannounced",), ("c",)] and not link.held
        client.close()

    asyncio.run(scenario())


def test_a_held_link_sends_after_the_request_timeout_when_the_epoch_stays_unknown():
    from ray.exceptions import RayActorError

    async def scenario():
        loop = asyncio.get_running_loop()
        handle = _Handle()
        handle.current_epoch = _Epoch()
        client = _client(loop, handle, timeout_s=0.2)
        link = client.link("topic", "k")
        answers = []
        client.send(link, ("a",), answers.append)
        await _until(lambda: handle.calls)
        handle.futures[0].set_exception(RayActorError())
        await _until(lambda: link.held)
        client.send(link, ("b",), answers.append)
        await _until(lambda: len(handle.calls) == 2, timeout=2)
        assert handle.calls[1] == [("b",)] and not link.held
        client.close()

    asyncio.run(scenario())


def test_commands_a_healing_shard_sends_back_go_again_in_the_order_they_were_sent():
    from router.errors import CommandError

    async def scenario():
        loop = asyncio.get_running_loop()
        handle = _Handle()
        client = _client(loop, handle)
        link = client.link("topic", "k")
        answers = []
        client.send(link, ("a",), answers.append)
        await _until(lambda: len(handle.calls) == 1)
        client.send(link, ("b",), answers.append)
        await _until(lambda: len(handle.calls) == 2)
        healing = CommandError("healing", "retry")
        handle.futures[0].set_result(([healing], None, "e1"))
        handle.futures[1].set_result(([healing], None, "e1"))
        await _until(lambda: len(handle.calls) == 3)
        assert handle.calls[2] == [("a",), ("b",)] and answers == []
        handle.futures[2].set_result((["A", "B"], None, "e1"))
        await _until(lambda: answers == ["A", "B"])
        assert client.stats()["retried"] == 2 and client.pending == 0
        client.close()

    asyncio.run(scenario())


def test_a_second_death_is_held_for_its_own_timeout_not_ended_by_the_first_deaths_timer():
    """Before: the first death's timer (set when its hold began) ended the second death's hold,
    so a command went to the shard while Ray was still restarting it and failed
    (ActorUnavailableError), and a Baqend query starting over a second time ended with 503."""
    from ray.exceptions import RayActorError

    async def scenario():
        loop = asyncio.get_running_loop()
        handle = _Handle()
        handle.current_epoch = _Epoch()
        client = _client(loop, handle, timeout_s=0.6)
        link = client.link("topic", "k")
        answers = []
        client.send(link, ("a",), answers.append)
        await _until(lambda: handle.calls)
        first_death = loop.time()
        handle.futures[0].set_exception(RayActorError())  # held until the epoch is known, at most 0.6 s
        await _until(lambda: link.held and handle.current_epoch.futures)
        handle.current_epoch.futures[0].set_result("e2")  # it is back: released at once
        await _until(lambda: not link.held)
        client.send(link, ("b",), answers.append)
        await _until(lambda: len(handle.calls) == 2)
        await asyncio.sleep(max(0.0, first_death + 0.3 - loop.time()))  # half the first hold's time on
        second_death = loop.time()
        handle.futures[1].set_exception(RayActorError())  # dies again: a hold of its own
        await _until(lambda: link.held and len(answers) == 2)
        client.send(link, ("c",), answers.append)
        # past the first death's deadline, before the second's: still held, nothing sent
        await asyncio.sleep(max(0.0, first_death + 0.6 + 0.05 - loop.time()))
        assert loop.time() < second_death + 0.6
        assert link.held and len(handle.calls) == 2
        # its own deadline ends it (the epoch never came)
        await _until(lambda: len(handle.calls) == 3, timeout=2)
        assert loop.time() >= second_death + 0.6 - 0.01
        assert handle.calls[2] == [("c",)] and not link.held
        client.close()

    asyncio.run(scenario())


def test_a_death_during_a_healing_pause_is_held_until_its_epoch_is_known():
    """A healing shard's pause (20 ms) must not end the hold of a death that came during it."""
    from ray.exceptions import RayActorError

    from router import contract
    from router.errors import CommandError

    async def scenario():
        loop = asyncio.get_running_loop()
        handle = _Handle()
        handle.current_epoch = _Epoch()
        client = _client(loop, handle, timeout_s=5.0)
        link = client.link("topic", "k")
        answers = []
        client.send(link, ("a",), answers.append)
        client.send(link, ("b",), answers.append)
        await _until(lambda: handle.calls)
        handle.futures[0].set_result(([CommandError(contract.HEALING, "healing"), "B"], None, "e1"))
        await _until(lambda: link.held and answers == ["B"])  # "a" goes again after a pause
        client.send(link, ("c",), answers.append)
        client._recover(link)  # the lane is lost meanwhile: the shard died
        paused = loop.time()
        await asyncio.sleep(0.1)  # five pauses' worth: the pause's timer has fired
        assert loop.time() >= paused + 0.1
        assert link.held and len(handle.calls) == 1
        handle.current_epoch.futures[0].set_result("e2")
        await _until(lambda: len(handle.calls) == 2)
        assert handle.calls[1] == [("core.reannounced",), ("a",), ("c",)] and not link.held
        client.close()

    asyncio.run(scenario())


def test_an_answer_to_a_call_made_before_the_death_does_not_end_its_hold():
    """A batch sent before the shard died is answered by the old process (with the old epoch) after
    another batch found it dead. Before: any epoch ended the hold, so the commands waiting went out
    before the restarted shard's epoch was known (and before any re-announce)."""
    from ray.exceptions import RayActorError

    async def scenario():
        handle, client, link, answers = await _heard_e1()
        client.send(link, ("b",), answers.append)
        await _until(lambda: len(handle.calls) == 2)
        client.send(link, ("c",), answers.append)
        await _until(lambda: len(handle.calls) == 3)  # b and c in flight
        handle.futures[2].set_exception(RayActorError())  # c finds the process dead: a hold
        await _until(lambda: link.held and handle.current_epoch.futures)
        handle.futures[1].set_result((["B"], None, "e1"))  # b, asked before: the old process answered
        await _until(lambda: answers[1:2] == ["B"] and isinstance(answers[-1], ShardUnavailable))
        client.send(link, ("d",), answers.append)
        await asyncio.sleep(0.05)  # a window in which nothing may be sent
        assert link.held and len(handle.calls) == 3
        handle.current_epoch.futures[0].set_result("e2")  # asked after the death: the restarted one
        await _until(lambda: len(handle.calls) == 4)
        assert handle.calls[3] == [("resubscribe",), ("core.reannounced",), ("d",)] and not link.held
        client.close()

    asyncio.run(scenario())


def test_a_hold_that_began_after_the_epoch_was_asked_asks_again():
    """Two calls find the shard unavailable, the second after the reconnect asked the epoch. The
    answer (the same epoch: no restart) cannot end the second hold, so the reconnect asks again
    at once. Before: it stopped, and the commands waited for the request timeout."""
    from ray.exceptions import RayActorError

    async def scenario():
        handle, client, link, answers = await _heard_e1(timeout_s=30)
        client.send(link, ("b",), answers.append)
        await _until(lambda: len(handle.calls) == 2)
        client.send(link, ("c",), answers.append)
        await _until(lambda: len(handle.calls) == 3)
        handle.futures[1].set_exception(RayActorError())  # a hold, and the reconnect asks the epoch
        await _until(lambda: len(handle.current_epoch.futures) == 1)
        handle.futures[2].set_exception(RayActorError())  # a later hold
        await _until(lambda: len(answers) == 3)
        client.send(link, ("d",), answers.append)
        handle.current_epoch.futures[0].set_result("e1")  # asked before the later hold
        await _until(lambda: len(handle.current_epoch.futures) == 2)  # so it asks again
        assert link.held and len(handle.calls) == 3
        handle.current_epoch.futures[1].set_result("e1")
        await _until(lambda: len(handle.calls) == 4)
        assert handle.calls[3] == [("d",)] and not link.held
        client.close()

    asyncio.run(scenario())


def test_a_replys_answers_are_written_before_its_deliveries_are_applied():
    """``writes`` (the gateway): marked before a batch's callbacks, written since the mark after
    them and before its bundle goes to ``on_bundle``; a reply without deliveries waits for the
    turn's write."""
    async def scenario():
        loop = asyncio.get_running_loop()
        handle, log = _Handle(), []

        class Writes:
            corked = ["earlier"]

            def corked_count(self):
                log.append(("mark", len(self.corked)))
                return len(self.corked)

            def write_since(self, mark):
                log.append(("write", self.corked[mark:]))
                del self.corked[mark:]

        writes = Writes()
        client = ShardClient("gw-1", {"topic": [("topic-shard-0", handle)]}, loop,
                             on_bundle=lambda bundle: log.append(("bundle", bundle)),
                             batch_max=100, max_inflight=4, timeout_s=10.0)
        client.writes = writes
        link = client.link("topic", "k")

        def answered(result):
            writes.corked.append(f"ack {result}")
            log.append(("answer", result))

        client.send(link, ("a",), answered)
        await _until(lambda: len(handle.calls) == 1)
        handle.futures[0].set_result((["A"], ("deliveries",), "e1"))
        await _until(lambda: any(entry[0] == "bundle" for entry in log))
        assert log == [("mark", 1), ("answer", "A"), ("write", ["ack A"]), ("bundle", ("deliveries",))]
        log.clear()
        client.send(link, ("b",), answered)
        await _until(lambda: len(handle.calls) == 2)
        handle.futures[1].set_result((["B"], None, "e1"))  # no deliveries
        await _until(lambda: log)
        assert log == [("answer", "B")] and writes.corked == ["earlier", "ack B"]
        client.close()

    asyncio.run(scenario())
