"""Helpers shared by the unit suite: no Ray, no sockets, no wall clock."""

from __future__ import annotations

from typing import Any, Callable

import pytest


class CountingTokens:
    """A deterministic renewal-token factory: tok-1, tok-2, ..."""

    def __init__(self) -> None:
        self.issued = 0

    def __call__(self) -> str:
        self.issued += 1
        return f"tok-{self.issued}"


class FakeTimer:
    """What ``loop.call_later`` returns: remembers its callback and whether it was cancelled."""

    def __init__(self, delay: float, callback: Callable[..., Any], args: tuple) -> None:
        self.delay = delay
        self.callback = callback
        self.args = args
        self.cancelled = False
        self.fired = False

    def cancel(self) -> None:
        self.cancelled = True

    def fire(self) -> None:
        assert not self.cancelled, "a cancelled timer must not fire"
        assert not self.fired, "a timer fires once"
        self.fired = True
        self.callback(*self.args)


class FakeLoop:
    """Just enough of an event loop for code that only schedules timers and next-turn callbacks;
    tests fire them by hand (``run_turn`` runs the callbacks scheduled before it, as a loop turn)."""

    def __init__(self) -> None:
        self.timers: list[FakeTimer] = []
        self.ready: list[tuple[Callable[..., Any], tuple]] = []

    def call_soon(self, callback: Callable[..., Any], *args: Any) -> None:
        self.ready.append((callback, args))

    def run_turn(self) -> int:
        ready, self.ready = self.ready, []
        for callback, args in ready:
            callback(*args)
        return len(ready)

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any) -> FakeTimer:
        timer = FakeTimer(delay, callback, args)
        self.timers.append(timer)
        return timer

    def pending(self) -> list[FakeTimer]:
        """Timers that are armed: neither cancelled nor fired."""
        return [t for t in self.timers if not t.cancelled and not t.fired]


@pytest.fixture
def tokens() -> CountingTokens:
    return CountingTokens()


@pytest.fixture
def fake_loop() -> FakeLoop:
    return FakeLoop()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_settings(request, tmp_path):
    """Router settings for one store backend: the store contract tests run once on each.

    ``sqlite``: files under a fresh ``data_dir``; ``postgresql``: the session's throwaway server
    (tests/pg.py), a fresh schema per test."""
    from router.settings import load_settings

    from router import postgres

    store = {}
    if request.param == "postgresql":
        store = {"url": request.getfixturevalue("postgres_server").fresh_url()}
    yield load_settings(None, data_dir=tmp_path, store=store)
    postgres.close_all()  # each test's schema has its own URL, so its own pool: close it with the test
