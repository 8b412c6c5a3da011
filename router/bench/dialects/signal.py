"""Signal Hub in ``router bench``: every shared scenario; its load-generator dialect is
:class:`router.bench.loadgen.SignalDialect` (JSON envelopes, ``hub:delivery_ack`` per publish)."""

from __future__ import annotations

from typing import Any

from router.bench.dialects import Profile, register


class SignalProfile(Profile):
    name = "signal"
    shared = ("fanout", "topics", "p2p", "latency", "connections", "churn")

    def settings(self) -> dict[str, Any]:
        return {"signal": {"rate_limit_per_minute": 1e12}}


register(SignalProfile())
