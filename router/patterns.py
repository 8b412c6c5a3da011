"""Client-supplied regular expressions, matched in linear time.

Discovery patterns come from untrusted clients. Python's backtracking ``re`` can be stalled by a
pattern such as ``(a+)+$``; RE2 guarantees time linear in the input, and the pattern length and
RE2's memory budget are bounded as well, so one request cannot stall a shard.
"""

from __future__ import annotations

import re2

_MAX_PROGRAM_MEMORY = 1 << 20  # bytes RE2 may use for one compiled pattern


class PatternError(ValueError):
    """The pattern is too long or not a valid RE2 expression."""


def compile_pattern(pattern: str, max_length: int):
    """Compile ``pattern`` for :meth:`search` semantics (like JavaScript's ``RegExp.test``)."""
    if len(pattern) > max_length:
        raise PatternError(f"pattern is {len(pattern)} characters; the limit is {max_length}")
    options = re2.Options()
    options.log_errors = False
    options.max_mem = _MAX_PROGRAM_MEMORY
    try:
        return re2.compile(pattern, options)
    except re2.error as error:
        detail = error.args[0] if error.args else "invalid"
        if isinstance(detail, bytes):
            detail = detail.decode("utf-8", "replace")
        raise PatternError(f"invalid pattern: {detail}") from None
