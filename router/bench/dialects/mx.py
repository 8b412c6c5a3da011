"""mx in ``router bench``."""

from __future__ import annotations

from router.bench.dialects import Profile, register


class MxProfile(Profile):
    name = "mx"


register(MxProfile())
