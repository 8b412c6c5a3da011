"""What the router remembers of the mint's "no such quote" answers: for a while, and a bounded number."""

from __future__ import annotations

from gateways.cashu.mint import RecentlyUnknown


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_unknown_id_is_remembered_for_the_ttl():
    clock = Clock()
    unknown = RecentlyUnknown(ttl_s=30, size=10, clock=clock)
    unknown.add(("bolt11_mint_quote", "ghost"))
    assert ("bolt11_mint_quote", "ghost") in unknown
    assert ("bolt11_melt_quote", "ghost") not in unknown  # per kind
    clock.now += 29.9
    assert ("bolt11_mint_quote", "ghost") in unknown
    clock.now += 0.1
    assert ("bolt11_mint_quote", "ghost") not in unknown  # asked again from now on
    assert len(unknown) == 0


def test_at_most_size_ids_oldest_forgotten_first():
    clock = Clock()
    unknown = RecentlyUnknown(ttl_s=30, size=3, clock=clock)
    for quote in range(100_000):
        unknown.add(quote)
    assert len(unknown) == 3
    assert [quote in unknown for quote in (99_996, 99_997, 99_998, 99_999)] == [False, True, True, True]
    unknown.add(99_997)  # seen again: remembered afresh, now the newest
    unknown.add("next")
    assert [quote in unknown for quote in (99_997, 99_998, 99_999, "next")] == [True, False, True, True]


def test_expired_ids_are_dropped_as_new_ones_come():
    clock = Clock()
    unknown = RecentlyUnknown(ttl_s=1, size=1000, clock=clock)
    for quote in range(500):
        unknown.add(quote)
        clock.now += 0.01  # 100 per second: about a second's worth is kept
    assert 99 <= len(unknown) <= 101


def test_a_ttl_of_zero_remembers_nothing():
    unknown = RecentlyUnknown(ttl_s=0, size=10, clock=Clock())
    unknown.add("ghost")
    assert "ghost" not in unknown and len(unknown) == 0
