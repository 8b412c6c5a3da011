"""baqend in ``router bench``."""

from __future__ import annotations

from router.bench.dialects import Profile, register


class BaqendProfile(Profile):
    name = "baqend"


register(BaqendProfile())
