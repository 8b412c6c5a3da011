"""cashu in ``router bench``."""

from __future__ import annotations

from router.bench.dialects import Profile, register


class CashuProfile(Profile):
    name = "cashu"


register(CashuProfile())
