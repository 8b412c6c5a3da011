"""Bech32 (BIP-173) for MultiversX addresses: 32-byte public keys shown as ``erd1...``.

Written from the BIP-173 definition (the original bech32 checksum constant 1, not bech32m): the
node sends raw 32-byte addresses and consumers subscribe with bech32 strings, so both directions
are on the event path. Pure functions, no I/O.
"""

from __future__ import annotations

from functools import lru_cache

HRP = "erd"
ADDRESS_LENGTH = 32
MAX_LENGTH = 90  # BIP-173's limit on a whole bech32 string

CHARSET = "qpzry9x8gf2tvdw0s3jn54khce6mua7l"
_VALUES = {char: value for value, char in enumerate(CHARSET)}
_GENERATOR = (0x3B6A57B2, 0x26508E6D, 0x1EA119FA, 0x3D4233DD, 0x2A1462B3)


class Bech32Error(ValueError):
    """A string is not a valid bech32 string, or not an ``erd`` address."""


def _polymod(values: list[int], checksum: int = 1) -> int:
    """BIP-173's checksum state after ``values``, from ``checksum`` (1: the start)."""
    for value in values:
        top = checksum >> 25
        checksum = (checksum & 0x1FFFFFF) << 5 ^ value
        for bit in range(5):
            if (top >> bit) & 1:
                checksum ^= _GENERATOR[bit]
    return checksum


def _expand_hrp(hrp: str) -> list[int]:
    return [ord(char) >> 5 for char in hrp] + [0] + [ord(char) & 31 for char in hrp]


def _checksum(hrp: str, data: list[int]) -> list[int]:
    polymod = _polymod(_expand_hrp(hrp) + data + [0] * 6) ^ 1
    return [(polymod >> 5 * (5 - i)) & 31 for i in range(6)]


def _convert_bits(data: bytes | list[int], from_bits: int, to_bits: int, pad: bool) -> list[int]:
    """Regroup a bit string; without ``pad``, leftover bits must be fewer than ``from_bits`` and zero."""
    accumulator = 0
    bits = 0
    out: list[int] = []
    mask = (1 << to_bits) - 1
    keep = (1 << (from_bits + to_bits - 1)) - 1
    for value in data:
        accumulator = ((accumulator << from_bits) | value) & keep
        bits += from_bits
        while bits >= to_bits:
            bits -= to_bits
            out.append((accumulator >> bits) & mask)
    if pad:
        if bits:
            out.append((accumulator << (to_bits - bits)) & mask)
    elif bits >= from_bits or (accumulator << (to_bits - bits)) & mask:
        raise Bech32Error("invalid padding in the data part")
    return out


def encode(hrp: str, data: list[int]) -> str:
    """Bech32 string of ``hrp`` and 5-bit ``data`` values (lower case)."""
    return hrp + "1" + "".join(CHARSET[value] for value in data + _checksum(hrp, data))


def decode(text: str) -> tuple[str, list[int]]:
    """Split a bech32 string into its HRP (lower case) and 5-bit data values, checksum verified."""
    if len(text) > MAX_LENGTH:
        raise Bech32Error(f"longer than {MAX_LENGTH} characters")
    if any(not 33 <= ord(char) <= 126 for char in text):
        raise Bech32Error("characters outside US-ASCII 33-126")
    if text.lower() != text and text.upper() != text:
        raise Bech32Error("mixed case")
    text = text.lower()
    separator = text.rfind("1")
    if separator < 1:
        raise Bech32Error("empty or missing human-readable part")
    if separator + 7 > len(text):
        raise Bech32Error("checksum shorter than 6 characters")
    hrp = text[:separator]
    try:
        data = [_VALUES[char] for char in text[separator + 1 :]]
    except KeyError as error:
        raise Bech32Error(f"invalid data character {error.args[0]!r}") from None
    if _polymod(_expand_hrp(hrp) + data) != 1:
        raise Bech32Error("checksum mismatch")
    return hrp, data[:-6]


# The address path (every event of a block carries one) checks two 5-bit values a step: what the
# update xors in for each value of the 10 bits it shifts out, as one lookup; the state once the
# HRP is in; the pairs' characters. A 32-byte key padded to 260 bits is 26 pairs, high to low.
_PAIR_MASKS = tuple(_polymod([0, 0], top << 20) for top in range(1024))  # linear: values xored in after
_HRP_STATE = _polymod(_expand_hrp(HRP))
_PAIR_TEXT = tuple(CHARSET[pair >> 5] + CHARSET[pair & 31] for pair in range(1024))
_PAIR_SHIFTS = tuple(range(250, -1, -10))


def _encode_key(public_key: bytes) -> str:
    """``encode(HRP, _convert_bits(public_key, 8, 5, pad=True))`` for a 32-byte key, at a fraction
    of its cost: pairs of 5-bit groups read from one integer, the checksum two groups a step."""
    number = int.from_bytes(public_key, "big") << 4
    pairs = [(number >> shift) & 1023 for shift in _PAIR_SHIFTS]
    masks = _PAIR_MASKS
    state = _HRP_STATE
    for pair in pairs:
        state = (state & 0xFFFFF) << 10 ^ pair ^ masks[state >> 20]
    for _ in range(3):  # six zero values
        state = (state & 0xFFFFF) << 10 ^ masks[state >> 20]
    state ^= 1
    pairs.extend(((state >> 20) & 1023, (state >> 10) & 1023, state & 1023))
    text = _PAIR_TEXT
    return HRP + "1" + "".join([text[pair] for pair in pairs])


def encode_address(public_key: bytes) -> str:
    """``erd1...`` of a 32-byte address."""
    if len(public_key) != ADDRESS_LENGTH:
        raise Bech32Error(f"an address is {ADDRESS_LENGTH} bytes, not {len(public_key)}")
    return _encode_key(public_key)


def decode_address(address: str) -> bytes:
    """The 32 bytes of an ``erd1...`` address (either case)."""
    hrp, data = decode(address)
    if hrp != HRP:
        raise Bech32Error(f"human-readable part is {hrp!r}, not {HRP!r}")
    public_key = bytes(_convert_bits(data, 5, 8, pad=False))
    if len(public_key) != ADDRESS_LENGTH:
        raise Bech32Error(f"an address is {ADDRESS_LENGTH} bytes, not {len(public_key)}")
    return public_key


@lru_cache(maxsize=65536)
def try_encode_address(public_key: bytes) -> str | None:
    """``erd1...``, or None when the bytes are not an address (the node's events can carry any).

    Cached: a block repeats a few addresses many times, and the checksum is pure-Python work.
    """
    if len(public_key) != ADDRESS_LENGTH:
        return None
    return _encode_key(public_key)
