"""Bounded background work: histogram samples (router/metrics.py) and event-log slices (router/eventlog.py)."""

from router.metrics import SAMPLES_PER_PUSH, spread_sample


def test_short_lists_are_kept_whole():
    values = list(range(SAMPLES_PER_PUSH))
    assert spread_sample(values) is values


def test_long_lists_are_sampled_evenly_from_first_to_last_part():
    values = list(range(1000))
    sample = spread_sample(values, 10)
    assert sample == [0, 100, 200, 300, 400, 500, 600, 700, 800, 900]
    assert len(spread_sample(list(range(100_000)))) == SAMPLES_PER_PUSH


def test_event_log_slices_round_trip_in_order():
    from router.eventlog import _pickled_slices, unpickle_slices

    records = [(n, "gw", n, 5, "signal", "hub:publish", "t", None, 100, n, "dropped", "closed") for n in range(1000)]
    slices = _pickled_slices(records, 256)
    assert len(slices) == 4
    assert unpickle_slices(slices) == records
    assert unpickle_slices(_pickled_slices([], 256)) == []
