"""Keys as PostgreSQL text holds them, ordered as SQLite orders them.

SQLite stores any Python string as TEXT; PostgreSQL text cannot contain NUL, and a key with one
(a Baqend object key ``a%00b``, a Cashu quote id a wallet subscribes to) would fail the whole
batch it is written in. So a PostgreSQL store writes keys through :func:`to_text`: NUL and
``\\x01`` become two-character escapes (``\\x00`` → ``\\x01\\x01``, ``\\x01`` → ``\\x01\\x02``).
The code is prefix-free and keeps the byte order (``\\x00`` < ``\\x01`` < every other character
before and after), so under ``COLLATE "C"`` escaped keys compare exactly as the originals do in
SQLite. Keys without those two characters (all real ones) are stored unchanged.
"""

from __future__ import annotations

import re

_ESCAPED = re.compile("\x01(.)", re.DOTALL)


def to_text(key: str) -> str:
    if "\x00" in key or "\x01" in key:
        return key.replace("\x01", "\x01\x02").replace("\x00", "\x01\x01")
    return key


def from_text(text: str) -> str:
    if "\x01" in text:
        return _ESCAPED.sub(lambda match: "\x00" if match[1] == "\x01" else "\x01", text)
    return text
