"""What ``router bench`` needs to know of each of the router's dialects: a :class:`Profile`.

A profile says how to start a router for the dialect (settings, keys made before it starts),
what its load generators need (``client_config``: tokens, API keys; passed to every worker),
which of the shared scenarios (``fanout``, ``topics``, ``p2p``, ``latency``, ``connections``,
``churn``) it runs, and the dialect's own scenarios (``plans``). The load-generator side of a
dialect (a :class:`router.bench.loadgen.Dialect` and any roles of its own) is registered by the
same module, under the profile's name, when a worker process imports it.

Modules: ``signal``, ``nolag``, ``mx``, ``cashu``, ``baqend``.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

NAMES = ("signal", "nolag", "mx", "cashu", "baqend")


class Profile:
    name = ""
    shared: tuple[str, ...] = ()  # the shared scenarios this dialect runs

    def settings(self) -> dict[str, Any]:
        """``load_settings`` overrides for a benchmark router of this dialect."""
        return {}

    def prepare(self, settings: Any) -> dict[str, Any]:
        """Before the router starts (its settings known): make what clients need; returned to
        every load-generator worker as ``spec["config"]``."""
        return {}

    def plans(self) -> dict[str, Callable[..., list]]:
        """The dialect's own scenarios: name → ``plan(options) -> list[Case]``."""
        return {}

    def summaries(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The dialect's targets that a run's rows decide beyond one row's value (e.g. a curve's
        shape): each ``{"name", "figure", "met", ...}``; printed and kept after the table."""
        return []

    def peers(self, pin: int | None) -> list[Any]:
        """Other servers a user of this dialect would pick instead (``router.bench.systems.System``;
        each ``accepts`` the cases it can run), measured in the same run; ``pin``: their CPU."""
        return []


_PROFILES: dict[str, Profile] = {}


def register(profile: Profile) -> Profile:
    _PROFILES[profile.name] = profile
    return profile


def profile(name: str) -> Profile:
    if name not in NAMES:
        raise SystemExit(f"router bench: unknown dialect {name!r}; choose from {', '.join(NAMES)} or all")
    if name not in _PROFILES:
        importlib.import_module(f"{__name__}.{name}")
    return _PROFILES[name]
