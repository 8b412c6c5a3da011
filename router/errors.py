"""Errors that travel between shards and gateways.

A shard never raises out of a batch: a command that fails returns a :class:`CommandError` in its
result slot, and the gateway's dialect turns it into that protocol's own error frame.
"""

from __future__ import annotations

from typing import Any


class CommandError(Exception):
    """A command was refused. ``code`` is a core reason; dialects map it to their wire codes."""

    def __init__(self, code: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(code, message, details)
        self.code = code
        self.message = message
        self.details = details or {}

    def __reduce__(self):  # keep the three fields through pickling (Ray serialises results)
        return (CommandError, (self.code, self.message, self.details))

    def __repr__(self) -> str:
        return f"CommandError({self.code!r}, {self.message!r}, {self.details!r})"


class ShardUnavailable(Exception):
    """A shard did not answer in time, or its actor died; the command may or may not have run."""

    def __init__(self, reason: str, timed_out: bool = False) -> None:
        super().__init__(reason)
        self.timed_out = timed_out
