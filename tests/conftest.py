"""Test-session plumbing shared by every suite."""

from __future__ import annotations

import os

# Keep Ray quiet and local in every process the tests start.
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
