"""gateways/mx/bech32.py: BIP-173 bech32, and MultiversX ``erd1`` addresses of 32-byte keys."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from gateways.mx.bech32 import (
    CHARSET,
    Bech32Error,
    _convert_bits,
    decode,
    decode_address,
    encode,
    encode_address,
    try_encode_address,
)

# -- BIP-173's test vectors ------------------------------------------------------------------------

BIP173_VALID = [
    ("A12UEL5L", "a"),
    ("a12uel5l", "a"),
    ("an83characterlonghumanreadablepartthatcontainsthenumber1andtheexcludedcharactersbio1tt5tgs",
     "an83characterlonghumanreadablepartthatcontainsthenumber1andtheexcludedcharactersbio"),
    ("abcdef1qpzry9x8gf2tvdw0s3jn54khce6mua7lmqqqxw", "abcdef"),
    ("split1checkupstagehandshakeupstreamerranterredcaperred2y9e3w", "split"),
    ("?1ezyfcl", "?"),
]


@pytest.mark.parametrize(("text", "hrp"), BIP173_VALID)
def test_bip173_valid_checksums(text, hrp):
    decoded_hrp, data = decode(text)
    assert decoded_hrp == hrp
    assert encode(decoded_hrp, data) == text.lower()


def test_bip173_data_part_of_the_charset_vector():
    # "abcdef1" + the 32 characters in order + checksum: the data values are 0..31.
    assert decode("abcdef1qpzry9x8gf2tvdw0s3jn54khce6mua7lmqqqxw") == ("abcdef", list(range(32)))


BIP173_INVALID = [
    ("\x201nwldj5", "US-ASCII"),  # HRP character out of range
    ("\x7f1axkwrx", "US-ASCII"),
    ("\x801eym55h", "US-ASCII"),
    ("an84characterslonghumanreadablepartthatcontainsthenumber1andtheexcludedcharactersbio1569pvx",
     "longer than 90"),
    ("pzry9x0s0muk", "human-readable part"),  # no separator
    ("1pzry9x0s0muk", "human-readable part"),  # empty HRP
    ("x1b4n0q5v", "invalid data character 'b'"),
    ("li1dgmt3", "checksum shorter"),
    ("de1lg7wt\xff", "US-ASCII"),
    ("A1G7SGD8", "checksum mismatch"),  # checksum computed over the upper-case HRP
    ("10a06t8", "human-readable part"),
    ("1qzzfhee", "human-readable part"),
    ("a12UEL5L", "mixed case"),
]


@pytest.mark.parametrize(("text", "message"), BIP173_INVALID)
def test_bip173_invalid_strings(text, message):
    with pytest.raises(Bech32Error, match=message):
        decode(text)


# -- MultiversX addresses --------------------------------------------------------------------------

# Hex key -> address pairs published by MultiversX: the all-zero address and the ESDT system smart
# contract (docs.multiversx.com, ESDT events), and the "alice" test wallet of the MultiversX SDKs.
KNOWN_ADDRESSES = [
    ("00" * 32, "erd1qqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqq6gq4hu"),
    ("000000000000000000010000000000000000000000000000000000000002ffff",
     "erd1qqqqqqqqqqqqqqqpqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqzllls8a5w6u"),
    ("0139472eff6886771a982f3083da5d421f24c29181e63888228dc81ca60d69e1",
     "erd1qyu5wthldzr8wx5c9ucg8kjagg0jfs53s8nr3zpz3hypefsdd8ssycr6th"),
]


@pytest.mark.parametrize(("key_hex", "address"), KNOWN_ADDRESSES)
def test_known_addresses_encode_and_decode(key_hex, address):
    assert encode_address(bytes.fromhex(key_hex)) == address
    assert decode_address(address) == bytes.fromhex(key_hex)


# Addresses from the MultiversX CAIP-10 namespace document (mainnet wallet, mainnet contract,
# devnet, testnet) and the docs' ESDTNFTCreate example: valid checksums written by others.
PUBLISHED_ADDRESSES = [
    "erd1uapegx64zk6yxa9kxd2ujskkykdnvzlla47uawh7sh0rhwx6y60sv68me9",
    "erd1qqqqqqqqqqqqqpgqhe8t5jewej70zupmh44jurgn29psua5l2jps3ntjj3",
    "erd1devnet6uy8xjusvusfy3q83qadfhwrtty5fwa8ceh9cl60q2p6ysra7aaa",
    "erd1sea63y47u569ns3x5mqjf4vnygn9whkk7p6ry4rfpqyd6rd5addqyd9lf2",
    "erd1qqqqqqqqqqqqqpgq0tajepcazernwt74820t8ef7t28vjfgukp2sw239f3",
]


@pytest.mark.parametrize("address", PUBLISHED_ADDRESSES)
def test_published_addresses_round_trip(address):
    key = decode_address(address)
    assert len(key) == 32
    assert encode_address(key) == address
    assert len(address) == 62


@pytest.mark.parametrize("address", [PUBLISHED_ADDRESSES[1], PUBLISHED_ADDRESSES[4]])
def test_contract_addresses_start_with_eight_zero_bytes(address):
    # "deployed Smart Contracts ... have their hex addresses prefixed with 8 zero bytes"
    assert decode_address(address)[:8] == bytes(8)
    assert address.startswith("erd1qqqqqqqqqqqq")


def test_upper_case_address_decodes_to_the_same_key():
    address = KNOWN_ADDRESSES[2][1]
    assert decode_address(address.upper()) == decode_address(address)


def test_another_hrp_is_not_an_erd_address():
    key = bytes.fromhex(KNOWN_ADDRESSES[2][0])
    other = encode("moa", _convert_bits(key, 8, 5, pad=True))
    assert decode(other)[0] == "moa"
    with pytest.raises(Bech32Error, match="'moa', not 'erd'"):
        decode_address(other)


def test_an_address_is_32_bytes():
    twenty = encode("erd", _convert_bits(bytes(20), 8, 5, pad=True))
    with pytest.raises(Bech32Error, match="32 bytes, not 20"):
        decode_address(twenty)
    with pytest.raises(Bech32Error, match="32 bytes, not 31"):
        encode_address(bytes(31))
    assert try_encode_address(bytes(31)) is None
    assert try_encode_address(bytes(33)) is None
    assert try_encode_address(bytes(32)) == KNOWN_ADDRESSES[0][1]


def test_non_zero_padding_bits_are_refused():
    # 32 bytes = 256 bits -> 52 five-bit groups with 4 padding bits, which must be zero.
    data = _convert_bits(bytes(32), 8, 5, pad=True)
    data[-1] = 1
    with pytest.raises(Bech32Error, match="padding"):
        decode_address(encode("erd", data))


def test_a_changed_character_fails_the_checksum():
    address = KNOWN_ADDRESSES[2][1]
    changed = address[:10] + ("q" if address[10] != "q" else "p") + address[11:]
    with pytest.raises(Bech32Error, match="checksum mismatch"):
        decode_address(changed)


# -- properties ----------------------------------------------------------------------------------

keys = st.binary(min_size=32, max_size=32)


@given(keys)
def test_round_trip(key):
    address = encode_address(key)
    assert address.startswith("erd1") and len(address) == 62
    assert decode_address(address) == key


@settings(max_examples=500)
@given(keys)
def test_the_address_path_equals_the_general_encoder(key):
    """``encode_address`` (two groups a checksum step, from one integer) writes what BIP-173's
    general ``encode`` of the key's 5-bit groups writes."""
    expected = encode("erd", _convert_bits(key, 8, 5, pad=True))
    assert encode_address(key) == expected
    try_encode_address.cache_clear()
    assert try_encode_address(key) == expected


@pytest.mark.parametrize("key", [bytes(32), b"\xff" * 32, b"\x80" + bytes(31), bytes(31) + b"\x01"])
def test_the_address_path_at_the_edges(key):
    assert encode_address(key) == encode("erd", _convert_bits(key, 8, 5, pad=True))


@given(keys, st.integers(min_value=4, max_value=61), st.sampled_from(CHARSET))
def test_any_single_substitution_is_detected(key, position, replacement):
    address = encode_address(key)
    if address[position] == replacement:
        replacement = CHARSET[(CHARSET.index(replacement) + 1) % 32]
    with pytest.raises(Bech32Error):
        decode_address(address[:position] + replacement + address[position + 1 :])


@settings(max_examples=200)
@given(keys, st.integers(min_value=4, max_value=60))
def test_any_adjacent_swap_is_detected(key, position):
    address = encode_address(key)
    first, second = address[position], address[position + 1]
    assume(first != second)
    swapped = address[:position] + second + first + address[position + 2 :]
    with pytest.raises(Bech32Error):
        decode_address(swapped)
