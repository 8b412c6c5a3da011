"""A deterministic mutation fuzzer: real frames of a codec in, hostile frames out.

Pure (no sockets, no clock): one seeded ``random.Random`` makes every choice, so a run is
reproducible and a frame that breaks the router can be made again from the seed and its index.
Structure-aware where the codec is known (JSON, MessagePack, the protobuf wire format): a value
is replaced by one of another type, a huge or deeply nested one (inside a string that holds JSON
too); a field is dropped, added or renamed. Byte-level for every codec: bit flips, inserts,
deletes, truncation, splicing two seeds, repeating a slice. Frame-level: a text/binary opcode
swap and fragmentation.

Every :class:`Fuzzed` frame marked ``text`` is valid UTF-8 (a client library cannot send
anything else as text); invalid UTF-8 in a text frame is the separate :meth:`Mutator.invalid_utf8`
attack, as are :meth:`Mutator.nested` and :meth:`Mutator.oversized`.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import msgpack

JSON = "json"
MSGPACK = "msgpack"
PROTOBUF = "protobuf"
CODECS = (JSON, MSGPACK, PROTOBUF)

# (operation, weight) of :meth:`Mutator.next`
OPERATIONS = (
    ("retype", 28), ("nest", 4), ("drop_field", 4), ("add_field", 4), ("rekey", 3),
    ("bit_flip", 10), ("insert", 8), ("delete", 8), ("truncate", 7), ("splice", 8), ("repeat", 4),
    ("swap_opcode", 6), ("fragment", 6),
)
STRUCTURED = frozenset({"retype", "nest", "drop_field", "add_field", "rekey"})
BYTE_LEVEL = ("bit_flip", "insert", "delete", "truncate", "splice", "repeat")
NEST_DEPTHS = (33, 100, 500, 1000, 1100, 10_000)
LONG_STRINGS = (257, 4097, 70_000)
# Byte sequences no UTF-8 decoder accepts: a lone continuation byte, 0xff, an overlong "/", a
# UTF-16 surrogate, a code point above U+10FFFF, a sequence cut short.
INVALID_UTF8 = (b"\x80", b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe2\x82")
_PLACEHOLDER = "~fuzz-raw~"  # a value replaced by raw bytes after encoding (deep nesting, odd numbers)
# JSON numbers a JSON library would not write: infinite as a double, more digits than 64 bits, -0.
_RAW_JSON_NUMBERS = (b"1e999", b"-1e999", b"123456789012345678901234567890", b"-9223372036854775809",
                     b"1e-999", b"-0", b"0.0e0")
_SCALARS = (None, True, False, 0, -1, 2 ** 31, 2 ** 53 + 1, 2 ** 63 - 1, -2 ** 63, 1.5, -0.0, 1e308, "", "a",
            "\u0000", "\u202e\u200b", "\U0001f600" * 3)
_CONTAINERS = ([], {}, [1, "2", None], {"a": {"b": [1]}})
_MSGPACK_ONLY = (2 ** 64 - 1, b"\x00\xff", b"", msgpack.ExtType(5, b"ext"), float("inf"))


@dataclass(frozen=True, slots=True)
class Seed:
    payload: bytes
    text: bool  # sent as a text frame


@dataclass(frozen=True, slots=True)
class Fuzzed:
    op: str  # the operations that made it, "+"-joined
    payload: bytes
    text: bool
    fragments: int = 1  # sent as this many WebSocket frames (first, continuations)


class Mutator:
    """Frames derived from ``seeds`` (real frames of one codec); ``seed`` seeds the random choices."""

    def __init__(self, seeds: Sequence[Seed], codec: str, seed: int) -> None:
        if codec not in CODECS:
            raise ValueError(f"codec must be one of {CODECS}")
        if not seeds:
            raise ValueError("at least one seed frame")
        self.seeds = list(seeds)
        self.codec = codec
        self.rng = random.Random(seed)
        self.words = _words(self.seeds, codec)  # every string of the seeds: field names and values
        self._names = [name for name, _ in OPERATIONS]
        self._weights = [weight for _, weight in OPERATIONS]

    # -- the random stream ----------------------------------------------------------------------

    def next(self) -> Fuzzed:
        rng = self.rng
        seed = rng.choice(self.seeds)
        op = rng.choices(self._names, self._weights)[0]
        payload, text, fragments = seed.payload, seed.text, 1
        if op in STRUCTURED:
            changed = self._structured(op, payload)
            if changed is None:  # nothing to change structurally: a byte-level mutation instead
                op = rng.choice(BYTE_LEVEL)
            else:
                payload = changed
        if op in BYTE_LEVEL:
            payload = self._bytes(op, payload)
        elif op == "swap_opcode":
            text = not text
        elif op == "fragment":
            fragments = rng.randint(2, 4)
        if rng.random() < 0.2:  # stack a byte-level mutation on top
            extra = rng.choice(BYTE_LEVEL)
            payload = self._bytes(extra, payload)
            op = f"{op}+{extra}"
        if text and not _is_utf8(payload):
            text = False  # what a client library does with bytes it cannot send as text
        return Fuzzed(op, payload, text, fragments)

    # -- the named attacks ----------------------------------------------------------------------

    def nested(self, depth: int) -> Fuzzed:
        """A seed with one of its values (or, if it has none, the whole frame) nested ``depth`` levels."""
        seed = self.rng.choice(self.seeds)
        payload = self._replace_value(seed.payload, lambda _: self._deep(depth))
        if payload is None:
            payload = self._wrap(seed.payload, depth)
        return Fuzzed(f"nested_{depth}", payload, seed.text and _is_utf8(payload))

    def oversized(self, size: int) -> Fuzzed:
        """A seed grown to exactly ``size`` bytes by a filler field it does not use (still well formed)."""
        seed = self.rng.choice(self.seeds)
        return Fuzzed(f"oversized_{size}", _grow(seed.payload, self.codec, size), seed.text)

    def invalid_utf8(self) -> Fuzzed:
        """A seed with an invalid UTF-8 sequence inside, sent as a text frame."""
        seed = self.rng.choice(self.seeds)
        at = self.rng.randrange(len(seed.payload) + 1)
        payload = seed.payload[:at] + self.rng.choice(INVALID_UTF8) + seed.payload[at:]
        return Fuzzed("invalid_utf8", payload, True)

    # -- structure-aware ------------------------------------------------------------------------

    def _structured(self, op: str, payload: bytes) -> bytes | None:
        rng = self.rng
        if op == "retype":
            return self._replace_value(payload, lambda old: self._other_value(old))
        if op == "nest":
            return self._replace_value(payload, lambda _: self._deep(rng.choice(NEST_DEPTHS)))
        if self.codec == PROTOBUF:
            return self._protobuf_fields(op, payload)
        tree = _decode(payload, self.codec)
        maps = [node for node in _containers(tree) if isinstance(node, dict)]
        if not maps:
            return None
        target = rng.choice(maps)
        raw = None
        if op == "drop_field":
            if not target:
                return None
            del target[rng.choice(list(target))]
        elif op == "add_field":
            raw = _put(target, self._key(), self._other_value(None))
        else:  # rekey
            if not target:
                return None
            old = rng.choice(list(target))
            target[self._key(old)] = target.pop(old)
        return _encode(tree, self.codec, raw)

    def _replace_value(self, payload: bytes, make: Callable[[Any], Any]) -> bytes | None:
        """``payload`` with one value, chosen at random at any depth, replaced by ``make(old)``."""
        if self.codec == PROTOBUF:
            locations = _pb_locations(payload)
            if not locations:
                return None
            return _pb_replace(payload, self.rng.choice(locations), lambda field: make(field))
        tree = _decode(payload, self.codec)
        slots: list[tuple[Any, Any, Any]] = [(container, key, None) for container, key in _slots(tree)]
        for host in _embedded(tree):  # inside strings that hold JSON (a Baqend query, Cashu params)
            slots.extend((container, key, host) for container, key in _slots(host[2]))
        if not slots:
            return None
        container, key, host = self.rng.choice(slots)
        raw = _put(container, key, make(container[key]))
        if host is not None:
            parent, name, inner = host
            parent[name] = _encode(inner, JSON, raw).decode()
            raw = None
        return _encode(tree, self.codec, raw)

    def _other_value(self, old: Any) -> Any:
        """A value of another kind than a well-formed frame holds there (protobuf: a field's raw bytes)."""
        rng = self.rng
        if self.codec == PROTOBUF:
            return self._pb_other(old)
        makers: list[Callable[[], Any]] = [
            lambda: rng.choice(_SCALARS), lambda: rng.choice(_SCALARS), lambda: rng.choice(_CONTAINERS),
            lambda: "x" * rng.choice(LONG_STRINGS),
            lambda: rng.choice(self.words) if self.words else "w",
            lambda: list(range(rng.choice((100, 1000)))),
            lambda: {f"k{i}": i for i in range(rng.choice((100, 1000)))},
        ]
        if self.codec == JSON:
            makers += [lambda: _Raw(rng.choice(_RAW_JSON_NUMBERS)), lambda: float("nan")]
        else:
            makers.append(lambda: rng.choice(_MSGPACK_ONLY))
        value = rng.choice(makers)()
        return json.loads(json.dumps(value)) if isinstance(value, (dict, list)) else value  # a fresh copy

    def _deep(self, depth: int) -> "_Raw":
        """``depth`` nested arrays or maps, as raw encoded bytes (no encoder recursion)."""
        as_maps = self.rng.random() < 0.5
        if self.codec == JSON:
            if as_maps:
                return _Raw(b'{"a":' * depth + b"1" + b"}" * depth)
            return _Raw(b"[" * depth + b"]" * depth)
        if self.codec == MSGPACK:
            return _Raw((b"\x81\xa1a" if as_maps else b"\x91") * depth + b"\xc0")
        # protobuf: nested groups of an unknown field (start-group tags, then end-group tags)
        return _Raw(b"\x7b" * depth + b"\x7c" * depth)

    def _wrap(self, payload: bytes, depth: int) -> bytes:
        if self.codec == JSON:
            return b"[" * depth + payload + b"]" * depth
        if self.codec == MSGPACK:
            return b"\x91" * depth + payload
        return b"\x7b" * depth + payload + b"\x7c" * depth

    def _key(self, old: Any = None) -> Any:
        rng = self.rng
        keys: list[Any] = ["", "__proto__", "x" * 300, "\u0000", rng.choice(self.words) if self.words else "k"]
        if isinstance(old, str) and old:
            keys += [old.upper(), old + "\u0000", old[:-1], " " + old]
        if self.codec == MSGPACK:
            keys += [5, -1, b"type", 1.5, None, True]
        return rng.choice(keys)

    # -- protobuf -------------------------------------------------------------------------------

    def _pb_other(self, field: "_PbField") -> "_Raw":
        """Raw bytes replacing one field: another wire type, an odd value, many copies, or garbage."""
        rng = self.rng
        number = field.number
        choices = [
            _pb_key(number, 0) + _varint(2 ** 64 - 1),  # the largest varint
            _pb_key(number, 0) + b"\xff" * 10 + b"\x01",  # a varint of 11 bytes
            _pb_key(number, 2) + _varint(rng.choice(LONG_STRINGS)) + b"x" * 10,  # a length past the end
            _pb_key(number, 2) + _varint(len(b"\xff\xfe")) + b"\xff\xfe",  # invalid UTF-8 in a string
            _pb_key(number, 2) + _varint(n := rng.choice(LONG_STRINGS)) + b"y" * n,
            _pb_key(number, 1) + rng.randbytes(8),
            _pb_key(number, 5) + rng.randbytes(4),
            _pb_key(number, 3),  # a group that never ends
            _pb_key(number, 4),  # an end-group with no start
            _pb_key(number, rng.choice((6, 7))) + b"\x00",  # wire types that do not exist
            field.raw * rng.choice((2, 100, 1000)),  # a repeated (or a scalar repeated) field
            _pb_key(0, 0) + b"\x01",  # field number 0
            _pb_key(2 ** 29 - 1, 2) + b"\x01z",  # the largest field number
            b"",  # the field dropped
        ]
        word = rng.choice(self.words).encode() if self.words else b"w"
        choices.append(_pb_key(number, 2) + _varint(len(word)) + word)
        return _Raw(rng.choice(choices))

    def _protobuf_fields(self, op: str, payload: bytes) -> bytes | None:
        fields = _pb_parse(payload)
        if not fields:
            return None
        rng = self.rng
        raws = [field.raw for field in fields]
        if op == "drop_field":
            del raws[rng.randrange(len(raws))]
        elif op == "add_field":
            raws.insert(rng.randrange(len(raws) + 1), self._pb_other(rng.choice(fields)).data)
        else:  # rekey: the same value under another field number
            index = rng.randrange(len(raws))
            field = fields[index]
            raws[index] = _pb_key(rng.randint(1, 20), field.wire) + field.raw[len(_pb_key(field.number, field.wire)):]
        return b"".join(raws)

    # -- byte-level -----------------------------------------------------------------------------

    def _bytes(self, op: str, payload: bytes) -> bytes:
        rng = self.rng
        data = bytearray(payload)
        if op == "bit_flip":
            for _ in range(rng.randint(1, 8)):
                if data:
                    data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        elif op == "insert":
            at = rng.randrange(len(data) + 1)
            chunk = rng.choice((rng.randbytes(rng.randint(1, 16)), b"\x00", b'"', b"{", b"]", b"\\",
                                rng.choice(INVALID_UTF8), b"\xc1", b"\xdd\xff\xff\xff\xff"))
            data[at:at] = chunk
        elif op == "delete":
            if data:
                at = rng.randrange(len(data))
                del data[at:at + rng.randint(1, 16)]
        elif op == "truncate":
            del data[rng.randrange(len(data) + 1):]
        elif op == "splice":
            other = rng.choice(self.seeds).payload
            data = data[:rng.randrange(len(data) + 1)] + other[rng.randrange(len(other) + 1):]
        else:  # repeat
            if data:
                start = rng.randrange(len(data))
                piece = data[start:start + rng.randint(1, 32)]
                at = rng.randrange(len(data) + 1)
                data[at:at] = piece * rng.randint(2, 64)
        return bytes(data)


# -- helpers ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Raw:
    """Bytes written in place of a value after encoding."""

    data: bytes


def _put(container: Any, key: Any, value: Any) -> bytes | None:
    """Store ``value``; a :class:`_Raw` one is stored as the placeholder, and its bytes returned."""
    if isinstance(value, _Raw):
        container[key] = _PLACEHOLDER
        return value.data
    container[key] = value
    return None


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _decode(payload: bytes, codec: str) -> Any:
    if codec == JSON:
        return json.loads(payload)
    return msgpack.unpackb(payload, raw=False, strict_map_key=False)


def _encode(tree: Any, codec: str, raw: bytes | None = None) -> bytes:
    if codec == JSON:
        data = json.dumps(tree, separators=(",", ":")).encode()
        placeholder = json.dumps(_PLACEHOLDER).encode()
    else:
        data = msgpack.packb(tree, use_bin_type=True)
        placeholder = msgpack.packb(_PLACEHOLDER)
    return data if raw is None else data.replace(placeholder, raw, 1)


def _containers(tree: Any) -> list[Any]:
    """Every dict and list in ``tree`` (iterative)."""
    found, stack = [], [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            found.append(node)
            stack.extend(node.values())
        elif isinstance(node, list):
            found.append(node)
            stack.extend(node)
    return found


def _slots(tree: Any) -> list[tuple[Any, Any]]:
    """(container, key or index) of every value in ``tree``."""
    slots: list[tuple[Any, Any]] = []
    for node in _containers(tree):
        keys = list(node) if isinstance(node, dict) else range(len(node))
        slots.extend((node, key) for key in keys)
    return slots


def _embedded(tree: Any) -> list[tuple[Any, Any, Any]]:
    """(container, key, decoded value) of every string in ``tree`` that holds a JSON object or array."""
    found = []
    for container, key in _slots(tree):
        value = container[key]
        if isinstance(value, str) and value[:1] in ("{", "["):
            try:
                inner = json.loads(value)
            except ValueError:
                continue
            if isinstance(inner, (dict, list)):
                found.append((container, key, inner))
    return found


def _words(seeds: Sequence[Seed], codec: str) -> list[str]:
    words: set[str] = set()
    for seed in seeds:
        if codec == PROTOBUF:
            words.update(field.value.decode() for field in _pb_walk(seed.payload)
                         if field.wire == 2 and 0 < len(field.value) <= 64 and _is_utf8(field.value)
                         and field.value.decode().isprintable())
            continue
        for node in _containers(_decode(seed.payload, codec)):
            values = list(node.keys()) + list(node.values()) if isinstance(node, dict) else node
            words.update(value for value in values if isinstance(value, str))
    return sorted(words)


def _grow(payload: bytes, codec: str, size: int) -> bytes:
    """``payload`` with a filler field added so that it is exactly ``size`` bytes."""
    if codec == PROTOBUF:
        head = b"\x7a"  # field 15, length-delimited: not a field of any message here
        for prefix in range(1, 11):  # the length prefix's own size comes out of the filler
            length = size - len(payload) - len(head) - prefix
            if length >= 0 and len(_varint(length)) == prefix:
                return payload + head + _varint(length) + b"f" * length
        raise ValueError(f"cannot grow a {len(payload)}-byte frame to {size} bytes")
    tree = _decode(payload, codec)
    if not isinstance(tree, dict):
        raise ValueError("only a map seed can be grown")
    tree["fuzzPad"] = ""
    base = len(_encode(tree, codec))
    for extra in range(max(0, size - base - 8), size - base + 1):
        tree["fuzzPad"] = "f" * extra
        grown = _encode(tree, codec)
        if len(grown) == size:
            return grown
    raise ValueError(f"cannot grow a {len(payload)}-byte frame to {size} bytes")


# -- the protobuf wire format, just enough to find and replace fields -----------------------------


@dataclass(frozen=True, slots=True)
class _PbField:
    number: int
    wire: int
    value: Any  # int (varint), bytes (the others)
    raw: bytes  # the whole field: key and value


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _pb_key(number: int, wire: int) -> bytes:
    return _varint((number << 3) | wire)


def _read_varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise ValueError("bad varint")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at


def _pb_parse(data: bytes) -> list[_PbField] | None:
    """The fields of one message, or None if ``data`` is not a message (groups are not parsed)."""
    fields, at = [], 0
    try:
        while at < len(data):
            start = at
            key, at = _read_varint(data, at)
            number, wire = key >> 3, key & 7
            if number == 0:
                return None
            if wire == 0:
                value, at = _read_varint(data, at)
            elif wire in (1, 5):
                width = 8 if wire == 1 else 4
                if at + width > len(data):
                    return None
                value, at = data[at:at + width], at + width
            elif wire == 2:
                length, at = _read_varint(data, at)
                if at + length > len(data):
                    return None
                value, at = data[at:at + length], at + length
            else:
                return None
            fields.append(_PbField(number, wire, value, data[start:at]))
    except ValueError:
        return None
    return fields


def _pb_walk(data: bytes, depth: int = 0) -> list[_PbField]:
    """Every field of ``data`` and of the messages nested in it (up to 4 levels)."""
    fields = _pb_parse(data) or []
    found = list(fields)
    if depth < 4:
        for field in fields:
            if field.wire == 2:
                found.extend(_pb_walk(field.value, depth + 1))
    return found


def _pb_locations(data: bytes, prefix: tuple[int, ...] = (), depth: int = 0) -> list[tuple[int, ...]]:
    """The path (field indexes, outermost first) of every field, nested messages included."""
    fields = _pb_parse(data)
    if not fields:
        return []
    found = []
    for index, field in enumerate(fields):
        found.append(prefix + (index,))
        if field.wire == 2 and depth < 4:
            found.extend(_pb_locations(field.value, prefix + (index,), depth + 1))
    return found


def _pb_replace(data: bytes, path: tuple[int, ...], make: Callable[[_PbField], Any]) -> bytes:
    """``data`` with the field at ``path`` replaced by ``make(field)`` (raw bytes), lengths rewritten."""
    fields = _pb_parse(data)
    assert fields is not None
    raws = [field.raw for field in fields]
    field = fields[path[0]]
    if len(path) == 1:
        replacement = make(field)
        raws[path[0]] = replacement.data if isinstance(replacement, _Raw) else replacement
    else:
        inner = _pb_replace(field.value, path[1:], make)
        raws[path[0]] = _pb_key(field.number, 2) + _varint(len(inner)) + inner
    return b"".join(raws)
