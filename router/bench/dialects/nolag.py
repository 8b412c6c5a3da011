"""nolag in ``router bench``."""

from __future__ import annotations

from router.bench.dialects import Profile, register


class NolagProfile(Profile):
    name = "nolag"


register(NolagProfile())
