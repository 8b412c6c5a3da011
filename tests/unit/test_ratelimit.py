"""router/ratelimit.py: the per-connection token bucket, driven with explicit clock values."""

from __future__ import annotations

import pytest

from router.ratelimit import TokenBucket


def test_starts_full_and_allows_a_burst_of_capacity():
    bucket = TokenBucket(rate_per_second=2.0, capacity=3, now=100.0)
    assert [bucket.take(100.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.tokens == 0
    # Empty: one token takes 1 / rate seconds.
    assert bucket.take(100.0) == 0.5


def test_a_refused_take_costs_nothing():
    bucket = TokenBucket(2.0, 1, now=0.0)
    assert bucket.take(0.0) == 0.0
    assert bucket.take(0.0) == 0.5
    assert bucket.take(0.0) == 0.5
    assert bucket.tokens == 0


def test_refills_at_rate():
    bucket = TokenBucket(2.0, 3, now=100.0)
    for _ in range(3):
        bucket.take(100.0)
    assert bucket.take(100.25) == 0.25  # half a token back; half still missing
    assert bucket.tokens == 0.5
    assert bucket.take(100.5) == 0.0  # a full token after 0.5 s
    assert bucket.tokens == 0.0
    assert bucket.updated == 100.5


def test_refill_is_capped_at_capacity():
    bucket = TokenBucket(2.0, 3, now=0.0)
    for _ in range(3):
        bucket.take(0.0)
    assert bucket.take(1_000.0) == 0.0
    assert bucket.tokens == 2  # capped at 3, then one taken
    assert [bucket.take(1_000.0) for _ in range(3)] == [0.0, 0.0, 0.5]


def test_cost_greater_than_one():
    bucket = TokenBucket(4.0, 10, now=0.0)
    assert bucket.take(0.0, cost=8) == 0.0
    assert bucket.take(0.0, cost=4) == 0.5  # 2 left, 2 missing at 4/s
    assert bucket.tokens == 2


def test_a_clock_going_backwards_adds_nothing():
    bucket = TokenBucket(1.0, 1, now=10.0)
    assert bucket.take(10.0) == 0.0
    assert bucket.take(5.0) == 1.0
    assert bucket.updated == 10.0
    assert bucket.take(11.0) == 0.0


def test_per_minute_rate():
    # The Signal Hub default: 100 per minute.
    bucket = TokenBucket(100 / 60, 1, now=0.0)
    assert bucket.take(0.0) == 0.0
    assert bucket.take(0.0) == pytest.approx(0.6)
    assert TokenBucket.retry_after_ms(bucket.take(0.0)) == 600


@pytest.mark.parametrize(
    ("wait", "expected"),
    [
        (0.0, 1),  # never 0: the client must wait at least a millisecond
        (0.0001, 1),
        (0.001, 1),
        (0.0011, 2),  # rounds up
        (0.25, 250),
        (0.5, 500),
        (1.2345, 1235),
        (2.0, 2000),
    ],
)
def test_retry_after_ms_rounds_up(wait, expected):
    assert TokenBucket.retry_after_ms(wait) == expected
    assert isinstance(TokenBucket.retry_after_ms(wait), int)
