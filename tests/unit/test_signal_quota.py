"""gateways/signal/quota.py: what one connection holds, counted against its cap."""

from __future__ import annotations

import math

from gateways.signal.quota import Holdings


def test_keys_count_from_their_request_to_their_answer():
    holdings = Holdings(2)
    assert holdings.reserve("a", 0)
    assert holdings.reserve("b", 0)
    assert not holdings.reserve("c", 0)  # two in flight fill it
    holdings.settle("a", None)  # refused: a never was held
    assert holdings.reserve("c", 0)
    assert not holdings.reserve("a", 0)


def test_taking_a_key_held_or_in_flight_takes_no_new_place():
    holdings = Holdings(1)
    assert holdings.reserve("a", 0)
    assert holdings.reserve("a", 0)  # the same key twice in flight
    holdings.settle("a", 10)
    assert holdings.reserve("a", 1)  # re-registering what it holds
    holdings.settle("a", 20)
    holdings.settle("a", 20)
    assert not holdings.reserve("b", 1)


def test_a_refused_retake_keeps_what_was_held():
    holdings = Holdings(1)
    holdings.reserve("a", 0)
    holdings.settle("a", 100)
    holdings.reserve("a", 1)
    holdings.settle("a", None)
    assert not holdings.reserve("b", 1)


def test_held_keys_stop_counting_at_their_deadline():
    holdings = Holdings(2)
    holdings.reserve("a", 0)
    holdings.settle("a", 100)
    holdings.reserve("b", 0)
    holdings.settle("b", 200)
    assert not holdings.reserve("c", 99)
    assert holdings.reserve("c", 100)  # a expired at 100
    assert not holdings.reserve("d", 150)
    # Reserving again a key whose deadline passed counts it anew.
    holdings.settle("c", math.inf)
    assert not holdings.reserve("a", 150)
    assert holdings.reserve("a", 200)


def test_renewal_moves_the_deadline():
    holdings = Holdings(1)
    holdings.reserve("a", 0)
    holdings.settle("a", 100)
    holdings.hold("a", 500)
    assert not holdings.reserve("b", 300)
    assert holdings.reserve("b", 500)


def test_release_frees_the_place():
    holdings = Holdings(1)
    holdings.reserve("t", 0)
    holdings.settle("t", math.inf)
    assert not holdings.reserve("u", 10**9)  # no deadline: held until released
    holdings.release("t")
    holdings.release("t")  # releasing what is not held is harmless
    assert holdings.reserve("u", 0)

