"""gateways/shardclient.py DeliverySequencer: per-shard bundles applied in emission order."""

from __future__ import annotations

import asyncio
import logging

import pytest

from gateways.shardclient import DeliverySequencer

TIMEOUT = 2.0


class Recorder:
    def __init__(self) -> None:
        self.applied: list[list] = []

    def __call__(self, items: list) -> None:
        self.applied.append(items)


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def sequencer(recorder, fake_loop) -> DeliverySequencer:
    return DeliverySequencer(recorder, TIMEOUT, fake_loop)


def bundle(seq: int, epoch: str = "e1", source: str = "topic-shard-0") -> tuple:
    return (source, epoch, seq, [f"{source}:{epoch}:{seq}"])


def items(*seqs: int, epoch: str = "e1", source: str = "topic-shard-0") -> list[list]:
    return [bundle(seq, epoch, source)[3] for seq in seqs]


# -- ordering (timers driven by hand through a fake loop) -----------------------------------


def test_in_order_bundles_apply_immediately(sequencer, recorder, fake_loop):
    for seq in range(3):
        sequencer.accept(bundle(seq))
    assert recorder.applied == items(0, 1, 2)
    assert fake_loop.timers == []
    assert (sequencer.skipped, sequencer.stale) == (0, 0)


def test_out_of_order_bundles_wait_for_the_gap(sequencer, recorder, fake_loop):
    sequencer.accept(bundle(2))
    sequencer.accept(bundle(1))
    assert recorder.applied == []
    assert len(fake_loop.timers) == 1  # one gap timer per source, not one per bundle
    timer = fake_loop.timers[0]
    assert timer.delay == TIMEOUT
    sequencer.accept(bundle(0))
    assert recorder.applied == items(0, 1, 2)
    assert timer.cancelled is True  # the gap closed in time
    sequencer.accept(bundle(3))
    assert recorder.applied == items(0, 1, 2, 3)
    assert (sequencer.skipped, sequencer.stale) == (0, 0)


def test_a_partial_drain_gives_the_next_gap_a_full_wait_of_its_own(sequencer, recorder, fake_loop):
    """Before: the first gap's timer was kept, and fired on the next gap however short a time that
    one had been the first missing (4 missing since t=0, 6 since 7 came at t=1.98, 4 at t=1.99:
    6 was skipped at t=2, and dropped as stale when it came at t=2.05)."""
    sequencer.accept(bundle(1))
    sequencer.accept(bundle(3))
    first = fake_loop.pending()
    sequencer.accept(bundle(0))
    assert recorder.applied == items(0, 1)
    assert first[0].cancelled  # the gap it guarded closed
    (second,) = fake_loop.pending()  # still waiting for 2: a fresh timer
    assert second is not first[0] and second.delay == TIMEOUT
    sequencer.accept(bundle(2))
    assert recorder.applied == items(0, 1, 2, 3)
    assert fake_loop.pending() == []
    assert (sequencer.skipped, sequencer.stale) == (0, 0)


def test_duplicates_and_stale_bundles_are_counted_not_applied(sequencer, recorder):
    sequencer.accept(bundle(0))
    sequencer.accept(bundle(1))
    sequencer.accept(bundle(0))
    sequencer.accept(bundle(1))
    sequencer.accept(bundle(0))
    assert recorder.applied == items(0, 1)
    assert sequencer.stale == 3
    assert sequencer.skipped == 0


def test_sources_are_sequenced_independently(sequencer, recorder):
    sequencer.accept(bundle(0, source="a"))
    sequencer.accept(bundle(1, source="b"))
    sequencer.accept(bundle(0, source="b"))
    sequencer.accept(bundle(1, source="a"))
    assert recorder.applied == [
        *items(0, source="a"), *items(0, 1, source="b"), *items(1, source="a"),
    ]


def test_new_epoch_starts_a_fresh_sequence(sequencer, recorder, fake_loop):
    sequencer.accept(bundle(0, "e1"))
    sequencer.accept(bundle(1, "e1"))
    sequencer.accept(bundle(5, "e1"))  # waits for 2..4
    timer = fake_loop.timers[0]
    sequencer.accept(bundle(0, "e2"))  # the shard restarted
    assert timer.cancelled is True
    assert recorder.applied == items(0, 1, epoch="e1") + items(0, epoch="e2")
    sequencer.accept(bundle(1, "e2"))
    assert recorder.applied[-1] == items(1, epoch="e2")[0]
    # The previous epoch's buffered bundle is dropped, not applied.
    assert items(5, epoch="e1")[0] not in recorder.applied
    assert (sequencer.skipped, sequencer.stale) == (0, 0)


def test_new_epoch_may_start_out_of_order(sequencer, recorder, fake_loop):
    sequencer.accept(bundle(0, "e1"))
    sequencer.accept(bundle(1, "e2"))
    assert recorder.applied == items(0, epoch="e1")
    sequencer.accept(bundle(0, "e2"))
    assert recorder.applied == items(0, epoch="e1") + items(0, 1, epoch="e2")


def test_gap_timeout_skips_to_the_first_waiting_bundle(sequencer, recorder, fake_loop, caplog):
    sequencer.accept(bundle(2))
    sequencer.accept(bundle(5))
    assert len(fake_loop.pending()) == 1
    with caplog.at_level(logging.WARNING, logger="gateways.shardclient"):
        fake_loop.pending()[0].fire()
    assert recorder.applied == items(2)
    assert sequencer.skipped == 2  # 0 and 1 never came
    assert "deliveries from topic-shard-0: gap of 2 bundle(s) skipped" in caplog.text
    # 3 and 4 are still missing: a new timer guards the next gap.
    assert len(fake_loop.pending()) == 1
    assert fake_loop.pending()[0].delay == TIMEOUT
    fake_loop.pending()[0].fire()
    assert recorder.applied == items(2, 5)
    assert sequencer.skipped == 4
    assert fake_loop.pending() == []
    sequencer.accept(bundle(6))
    sequencer.accept(bundle(4))  # arrived after it was skipped
    assert recorder.applied == items(2, 5, 6)
    assert sequencer.stale == 1


def test_gap_timeout_drains_a_contiguous_run(sequencer, recorder, fake_loop):
    sequencer.accept(bundle(0))
    sequencer.accept(bundle(2))
    sequencer.accept(bundle(3))
    sequencer.accept(bundle(4))
    fake_loop.pending()[0].fire()
    assert recorder.applied == items(0, 2, 3, 4)
    assert sequencer.skipped == 1
    assert fake_loop.pending() == []


def test_forget_drops_the_source(sequencer, recorder, fake_loop):
    sequencer.accept(bundle(0))
    sequencer.accept(bundle(1))
    sequencer.accept(bundle(3))
    timer = fake_loop.timers[0]
    sequencer.forget("topic-shard-0")
    assert timer.cancelled is True
    sequencer.accept(bundle(0))  # a fresh sequence: 0 is expected again
    assert recorder.applied == items(0, 1, 0)
    assert sequencer.stale == 0
    sequencer.forget("never-seen")  # harmless


def test_a_failing_apply_does_not_stop_the_sequence(fake_loop, caplog):
    applied = []

    def apply(batch):
        if batch == ["boom"]:
            raise RuntimeError("boom")
        applied.append(batch)

    sequencer = DeliverySequencer(apply, TIMEOUT, fake_loop)
    sequencer.accept(("s", "e", 2, ["c"]))
    sequencer.accept(("s", "e", 1, ["boom"]))
    with caplog.at_level(logging.ERROR, logger="gateways.shardclient"):
        sequencer.accept(("s", "e", 0, ["a"]))
    assert applied == [["a"], ["c"]]
    assert "applying deliveries failed" in caplog.text
    sequencer.accept(("s", "e", 3, ["d"]))
    assert applied == [["a"], ["c"], ["d"]]


# -- a real event loop ----------------------------------------------------------------------


def run_with_loop(scenario) -> None:
    asyncio.run(asyncio.wait_for(scenario(), timeout=10))


def test_gap_timeout_on_a_real_loop():
    async def scenario():
        loop = asyncio.get_running_loop()
        applied: list = []
        arrived = asyncio.Event()

        def apply(batch):
            applied.append(batch)
            if len(applied) == 2:
                arrived.set()

        sequencer = DeliverySequencer(apply, 0.01, loop)
        sequencer.accept(("s", "e", 2, ["c"]))
        sequencer.accept(("s", "e", 5, ["f"]))
        assert applied == []
        await asyncio.wait_for(arrived.wait(), timeout=5)
        assert applied == [["c"], ["f"]]
        assert sequencer.skipped == 4
        assert sequencer.stale == 0

    run_with_loop(scenario)


def test_closed_gap_is_not_skipped_on_a_real_loop():
    async def scenario():
        loop = asyncio.get_running_loop()
        applied: list = []
        done = asyncio.Event()

        def apply(batch):
            applied.append(batch)
            if batch == ["late"]:
                done.set()

        sequencer = DeliverySequencer(apply, 0.01, loop)
        sequencer.accept(("s", "e", 1, ["b"]))
        sequencer.accept(("s", "e", 0, ["a"]))  # before the loop ever runs: no race with the timer
        assert applied == [["a"], ["b"]]
        # Open a second gap and let its timer fire on the loop: only that gap is skipped.
        sequencer.accept(("s", "e", 3, ["late"]))
        await asyncio.wait_for(done.wait(), timeout=5)
        assert applied == [["a"], ["b"], ["late"]]
        assert sequencer.skipped == 1  # only seq 2

    run_with_loop(scenario)


def test_a_straggler_from_a_retired_epoch_is_dropped(sequencer, recorder, fake_loop):
    sequencer.accept(bundle(0, epoch="old"))
    sequencer.accept(bundle(0, epoch="new"))
    sequencer.accept(bundle(1, epoch="old"))  # in flight when the shard restarted
    sequencer.accept(bundle(1, epoch="new"))
    assert recorder.applied == items(0, epoch="old") + items(0, 1, epoch="new")
    assert (sequencer.skipped, sequencer.stale) == (0, 1)
    assert fake_loop.timers == []


# -- at most max_per_turn deliveries per loop turn ------------------------------------------


def deliveries(name: str, count: int, recipients: int) -> list[tuple]:
    """``count`` items of ``recipients`` connections each, as the gateway applies them."""
    return [("event", f"{name}{n}", tuple(range(recipients)), None) for n in range(count)]


def names(applied: list[list]) -> list[list[str]]:
    return [[item[1] for item in batch] for batch in applied]


def test_a_large_bundle_is_applied_in_slices_one_per_loop_turn(recorder, fake_loop):
    sequencer = DeliverySequencer(recorder, TIMEOUT, fake_loop, max_per_turn=10)
    sequencer.accept(("s", "e", 0, deliveries("m", 10, 4)))  # 40 deliveries
    # This turn: items until 10 deliveries are reached (4 + 4 + 4); the rest waits.
    assert names(recorder.applied) == [["m0", "m1", "m2"]]
    assert (sequencer.waiting, sequencer.sliced) == (28, 1)
    fake_loop.run_turn()
    assert names(recorder.applied)[1:] == [["m3", "m4", "m5"]]
    fake_loop.run_turn()
    fake_loop.run_turn()
    assert names(recorder.applied)[2:] == [["m6", "m7", "m8"], ["m9"]]
    while fake_loop.run_turn():
        pass
    assert len(recorder.applied) == 4  # nothing more
    assert (sequencer.waiting, sequencer.sliced) == (0, 3)


def test_the_limit_counts_every_bundle_of_a_turn(recorder, fake_loop):
    sequencer = DeliverySequencer(recorder, TIMEOUT, fake_loop, max_per_turn=10)
    for seq in range(3):
        sequencer.accept(("s", "e", seq, deliveries(f"b{seq}-", 1, 6)))
    # 6, then 6 more crosses 10 (an item is never split); the third waits for the next turn.
    assert names(recorder.applied) == [["b0-0"], ["b1-0"]] and sequencer.waiting == 6
    fake_loop.run_turn()
    assert names(recorder.applied)[2:] == [["b2-0"]]
    while fake_loop.run_turn():
        pass
    sequencer.accept(("s", "e", 3, deliveries("b3-", 1, 6)))  # a new turn: applied at once
    assert names(recorder.applied)[3:] == [["b3-0"]]


def test_bundles_behind_a_sliced_one_wait_their_turn_in_order(recorder, fake_loop):
    sequencer = DeliverySequencer(recorder, TIMEOUT, fake_loop, max_per_turn=10)
    sequencer.accept(("s", "e", 0, deliveries("a", 4, 5)))
    sequencer.accept(("s", "e", 1, deliveries("b", 1, 1)))  # small, but behind the rest of 0
    sequencer.accept(("t", "e", 0, deliveries("c", 1, 1)))  # another shard's: behind them too
    assert names(recorder.applied) == [["a0", "a1"]]
    while fake_loop.run_turn():
        pass
    assert names(recorder.applied) == [["a0", "a1"], ["a2", "a3"], ["b0", "c0"]]
    # With nothing waiting, in a new turn, a small bundle is applied at once again.
    sequencer.accept(("s", "e", 2, deliveries("d", 1, 1)))
    assert names(recorder.applied)[-1] == ["d0"]
    assert sequencer.waiting == 0


def test_one_item_larger_than_the_limit_is_applied_whole(recorder, fake_loop):
    sequencer = DeliverySequencer(recorder, TIMEOUT, fake_loop, max_per_turn=10)
    sequencer.accept(("s", "e", 0, deliveries("x", 1, 500)))  # a message to 500 connections
    assert names(recorder.applied) == [["x0"]]
    assert (sequencer.waiting, sequencer.sliced) == (0, 0)


def test_without_a_limit_every_bundle_is_applied_whole(recorder, fake_loop):
    sequencer = DeliverySequencer(recorder, TIMEOUT, fake_loop)
    sequencer.accept(("s", "e", 0, deliveries("m", 1000, 1000)))
    assert len(recorder.applied) == 1 and len(recorder.applied[0]) == 1000
    assert fake_loop.ready == []


def test_a_backlog_of_deliveries_pauses_until_one_turn_is_left(recorder, fake_loop):
    calls: list[bool] = []
    sequencer = DeliverySequencer(recorder, TIMEOUT, fake_loop, max_per_turn=10, on_backlog=calls.append)
    over = DeliverySequencer.BACKLOG_TURNS * 10  # deliveries waiting past which the lanes are not read
    sequencer.accept(("s", "e", 0, deliveries("m", 10 + over, 1)))  # 10 now, `over` wait: not past it
    assert (sequencer.waiting, calls, sequencer.backlogged) == (over, [], False)
    sequencer.accept(("s", "e", 1, deliveries("n", 1, 1)))  # one more waits: past it
    assert (sequencer.waiting, calls, sequencer.backlogged) == (over + 1, [True], True)
    turns = 0
    while sequencer.backlogged:
        fake_loop.run_turn()
        turns += 1
    # Reading resumes once one turn's worth is left (and before that turn is applied).
    assert calls == [True, False] and sequencer.waiting == 1 and turns == DeliverySequencer.BACKLOG_TURNS
    while fake_loop.run_turn():
        pass
    assert sum(len(batch) for batch in recorder.applied) == 10 + over + 1 and calls == [True, False]


def test_a_failing_slice_does_not_stop_the_next_ones(fake_loop, caplog):
    applied: list[list] = []

    def apply(items):
        applied.append(items)
        if len(applied) == 1:
            raise ValueError("boom")

    sequencer = DeliverySequencer(apply, TIMEOUT, fake_loop, max_per_turn=2)
    with caplog.at_level(logging.ERROR, logger="gateways.shardclient"):
        sequencer.accept(("s", "e", 0, deliveries("m", 4, 1)))
    assert "applying deliveries failed" in caplog.text
    while fake_loop.run_turn():
        pass
    assert names(applied) == [["m0", "m1"], ["m2", "m3"]]


def test_closing_drops_what_waits(recorder, fake_loop):
    sequencer = DeliverySequencer(recorder, TIMEOUT, fake_loop, max_per_turn=10)
    sequencer.accept(("s", "e", 0, deliveries("m", 5, 10)))
    sequencer.close()
    while fake_loop.run_turn():
        pass
    sequencer.accept(("s", "e", 1, deliveries("n", 1, 1)))
    assert names(recorder.applied) == [["m0"]] and sequencer.waiting == 0


def test_other_work_runs_between_the_slices_on_a_real_loop():
    async def scenario():
        loop = asyncio.get_running_loop()
        order: list[str] = []

        def apply(items):
            order.extend(item[1] for item in items)
            loop.call_soon(order.append, "written")  # as the gateway's writes at the end of the turn

        sequencer = DeliverySequencer(apply, TIMEOUT, loop, max_per_turn=100)
        sequencer.accept(("s", "e", 0, deliveries("m", 3, 100)))
        loop.call_soon(order.append, "other")  # e.g. a read: scheduled behind the next slice
        while sequencer.waiting or len(order) < 7:
            await asyncio.sleep(0)
        # Each slice is written before the next is applied; other work runs between them.
        assert order == ["m0", "written", "m1", "other", "written", "m2", "written"]

    run_with_loop(scenario)


def test_an_item_of_several_messages_weighs_as_many_deliveries(recorder, fake_loop):
    """DELIVER_EVENTS (an mx block's frames for one consumer) counts each message, not its one recipient."""
    from router.contract import DELIVER_EVENTS, delivery_weight

    blocks = [(DELIVER_EVENTS, ((b"t",) * 6, None), (n,), None) for n in range(3)]
    assert [delivery_weight(item) for item in blocks] == [6, 6, 6]
    sequencer = DeliverySequencer(recorder, TIMEOUT, fake_loop, max_per_turn=10)
    sequencer.accept(("s", "e", 0, blocks))
    assert [[item[2] for item in batch] for batch in recorder.applied] == [[(0,), (1,)]]  # 12 frames reach 10
    assert sequencer.waiting == 6
    fake_loop.run_turn()
    assert [item[2] for item in recorder.applied[1]] == [(2,)]
