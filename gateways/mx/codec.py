"""mx-notifier hub wire format: binary ``WsMessage`` frames on ``/hub/ws`` (mx-notifier-hub.md).

Pure functions: bytes in, a validated :class:`Frame` or :class:`Subscription` out; frames out as
bytes. An invalid frame raises :class:`InvalidFrame` whose ``reason`` the caller counts before it
drops the frame silently, as the spec asks. No sockets, no Ray.

Outbound PAYLOAD frames differ per connection only in ``counter``, so the bytes after it (type,
topic, payload) are built once per event (:func:`frame_tail`) and each recipient's frame is a
few header bytes plus that tail (:func:`frame_with_tail`), byte for byte what protobuf would write.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

from google.protobuf.message import DecodeError

from actors.mx.match import (
    ADDRESS,
    ADDRESS_IDENTIFIER,
    ALL,
    IDENTIFIER,
    MATCH_LEVELS,
    TOPICS,
    Subscription,
)
from gateways.mx.bech32 import Bech32Error, decode_address, encode_address
from gateways.mx.pb import mx_hub_pb2

PROTOCOL_VERSION = 1
ACK = 1
PAYLOAD = 2

# Topics of PAYLOAD frames.
SUBSCRIBE_TOPIC = "subscribe"  # consumer -> router: SubscribeEvent
EVENTS_TOPIC = "all_events"  # router -> consumer: NormalizedEvent
REVERT_TOPIC = "revert_events"  # RevertEvent
FINALIZED_TOPIC = "finalized_events"  # FinalizedEvent
BLOCK_TXS_TOPIC = "block_txs"  # BlockTxs
BLOCK_SCRS_TOPIC = "block_scrs"  # BlockScrs

# Why a frame is dropped (metrics labels).
EMPTY_FRAME = "empty_frame"
UNDECODABLE = "undecodable"
BAD_TYPE = "bad_type"
BAD_VERSION = "bad_version"
MISSING_TOPIC = "missing_topic"
EMPTY_PAYLOAD = "empty_payload"
TEXT_FRAME = "text_frame"  # for the session: the endpoint is binary-only
UNKNOWN_TOPIC = "unknown_topic"  # for the session: a PAYLOAD topic consumers may not send

# Why a subscribe payload is refused.
UNDECODABLE_SUBSCRIBE = "undecodable_subscribe"
UNKNOWN_MATCH_LEVEL = "unknown_match_level"
MISSING_ADDRESS = "missing_address"
INVALID_ADDRESS = "invalid_address"
MISSING_IDENTIFIER = "missing_identifier"
MISSING_TOPICS = "missing_topics"
INVALID_TOPIC = "invalid_topic"
TOO_MANY_TOPICS = "too_many_topics"
TOO_LONG = "too_long"

MAX_SUBSCRIBE_TOPICS = 32
MAX_FIELD_LENGTH = 256  # identifier characters; each topic's base64 characters

_NEEDS_ADDRESS = frozenset({ADDRESS, ADDRESS_IDENTIFIER, TOPICS})
_NEEDS_IDENTIFIER = frozenset({IDENTIFIER, ADDRESS_IDENTIFIER, TOPICS})


class InvalidFrame(Exception):
    """A frame the spec says to drop silently; ``reason`` is for metrics, never sent."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class InvalidSubscription(Exception):
    """A ``subscribe`` payload that does not make a filter."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(reason, message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True, slots=True)
class Frame:
    version: int
    with_acknowledge: bool
    counter: int
    type: int
    topic: str
    payload: bytes

    @property
    def is_ack(self) -> bool:
        return self.type == ACK


def validate(frame: Frame) -> str | None:
    """The spec's drop rules: the reason a frame is invalid, or None.

    ACK frames are accepted with version 0 (a node's ACK carries only counter and type) and with
    whatever topic or payload they carry, which is ignored.
    """
    if frame.type == ACK:
        return None
    if frame.type != PAYLOAD:
        return BAD_TYPE
    if frame.version < 1:
        return BAD_VERSION
    if not frame.topic:
        return MISSING_TOPIC
    if not frame.payload:
        return EMPTY_PAYLOAD
    return None


def decode_frame(data: bytes) -> Frame:
    """Parse and validate one binary frame; raises :class:`InvalidFrame`."""
    if not data:
        raise InvalidFrame(EMPTY_FRAME)
    message = mx_hub_pb2.WsMessage()
    try:
        message.ParseFromString(data)
    except DecodeError:
        raise InvalidFrame(UNDECODABLE) from None
    frame = Frame(
        message.version, message.with_acknowledge, message.counter, message.type, message.topic, message.payload
    )
    reason = validate(frame)
    if reason is not None:
        raise InvalidFrame(reason)
    return frame


def encode_frame(
    type: int, counter: int, topic: str = "", payload: bytes = b"", with_acknowledge: bool = False,
    version: int = PROTOCOL_VERSION,
) -> bytes:
    return mx_hub_pb2.WsMessage(
        version=version, with_acknowledge=with_acknowledge, counter=counter, type=type, topic=topic,
        payload=payload,
    ).SerializeToString()


def ack_frame(counter: int) -> bytes:
    """The reply to a PAYLOAD frame that asked for one: same counter, no topic, no payload."""
    return encode_frame(ACK, counter)


def payload_frame(counter: int, topic: str, payload: bytes, with_acknowledge: bool = False) -> bytes:
    return encode_frame(PAYLOAD, counter, topic, payload, with_acknowledge)


def frame_tail(topic: str, payload: bytes) -> bytes:
    """Fields 4-6 of a PAYLOAD frame (type, topic, payload): the part shared by every recipient.

    Written as protobuf writes them (field order, empty fields omitted), without building a
    message: one per event of every block (1.2 → 0.5 µs)."""
    head = _tail_head(topic)
    length = len(payload)
    if not length:
        return head
    if 0x80 <= length < 0x4000:  # the common case: the field's length in 2 varint bytes
        return b"".join((head, bytes((0x32, (length & 0x7F) | 0x80, length >> 7)), payload))
    return b"".join((head, _varint_field(0x32, length), payload))


@lru_cache(maxsize=64)
def _tail_head(topic: str) -> bytes:
    """Fields 4 (type PAYLOAD) and 5 (``topic``, when not empty) of a tail."""
    encoded = topic.encode()
    return bytes((0x20, PAYLOAD)) + (_varint_field(0x2A, len(encoded)) + encoded if encoded else b"")


def _varint_field(tag: int, value: int) -> bytes:
    """A field's tag byte and a varint (a length-delimited field's length, or a varint field's value)."""
    out = bytearray((tag,))
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def frame_with_tail(counter: int, tail: bytes, with_acknowledge: bool = False) -> bytes:
    """A recipient's PAYLOAD frame: fields 1-3 (version, with_acknowledge, counter), then ``tail``.

    Protobuf writes fields in number order and omits zero values, so this equals
    ``payload_frame(counter, topic, payload, with_acknowledge)``.
    """
    return frame_head(counter, with_acknowledge) + tail


def frame_head(counter: int, with_acknowledge: bool = False) -> bytes:
    """Fields 1-3 of a PAYLOAD frame (version 1, with_acknowledge, counter): what precedes the tail."""
    if not with_acknowledge and 0 < counter < 0x200000:  # the common case, without a loop
        if counter < 0x80:
            return bytes((0x08, 0x01, 0x18, counter))
        if counter < 0x4000:
            return bytes((0x08, 0x01, 0x18, (counter & 0x7F) | 0x80, counter >> 7))
        return bytes((0x08, 0x01, 0x18, (counter & 0x7F) | 0x80, ((counter >> 7) & 0x7F) | 0x80, counter >> 14))
    # field 1 (version), varint 1; field 2, true; field 3, varint (zero values are omitted)
    return (b"\x08\x01" + (b"\x10\x01" if with_acknowledge else b"")
            + (_varint_field(0x18, counter) if counter else b""))


# -- subscribe -----------------------------------------------------------------------------------


def parse_subscribe(
    payload: bytes, max_topics: int = MAX_SUBSCRIBE_TOPICS, max_field_length: int = MAX_FIELD_LENGTH
) -> Subscription:
    """A ``SubscribeEvent`` as a filter; raises :class:`InvalidSubscription`.

    Only the fields the level uses are kept (an ``All`` filter that names an address is just
    ``All``); addresses are normalised to lower-case bech32; topics are decoded from base64, and
    ``""`` becomes the wildcard ``None``.
    """
    message = mx_hub_pb2.SubscribeEvent()
    try:
        message.ParseFromString(payload)
    except DecodeError:
        raise InvalidSubscription(UNDECODABLE_SUBSCRIBE, "the payload is not a SubscribeEvent") from None
    level = message.event_type
    if level not in MATCH_LEVELS:
        raise InvalidSubscription(
            UNKNOWN_MATCH_LEVEL, f"event_type must be one of {', '.join(MATCH_LEVELS)}, not {level[:64]!r}"
        )
    if level == ALL:
        return Subscription(ALL)
    address = None
    identifier = None
    topics: tuple[bytes | None, ...] = ()
    if level in _NEEDS_ADDRESS:
        address = _address(message.address)
    if level in _NEEDS_IDENTIFIER:
        if not message.identifier:
            raise InvalidSubscription(MISSING_IDENTIFIER, f"a {level} subscription needs an identifier")
        if len(message.identifier) > max_field_length:
            raise InvalidSubscription(TOO_LONG, f"identifier is longer than {max_field_length} characters")
        identifier = message.identifier
    if level == TOPICS:
        topics = _topics(message.topics, max_topics, max_field_length)
    return Subscription(level, address, identifier, topics)


def _address(text: str) -> str:
    if not text:
        raise InvalidSubscription(MISSING_ADDRESS, "this match level needs an address")
    try:
        return encode_address(decode_address(text))
    except Bech32Error as error:
        raise InvalidSubscription(INVALID_ADDRESS, f"address is not an erd1 bech32 address: {error}") from None


def _topics(texts: Sequence[str], max_topics: int, max_field_length: int) -> tuple[bytes | None, ...]:
    if not texts:
        raise InvalidSubscription(MISSING_TOPICS, "a Topics subscription needs at least one topic")
    if len(texts) > max_topics:
        raise InvalidSubscription(TOO_MANY_TOPICS, f"at most {max_topics} topics")
    topics: list[bytes | None] = []
    for position, text in enumerate(texts):
        if not text:
            topics.append(None)
            continue
        if len(text) > max_field_length:
            raise InvalidSubscription(TOO_LONG, f"topics[{position}] is longer than {max_field_length} characters")
        try:
            # Standard alphabet; missing padding is forgiven.
            topics.append(base64.b64decode(text + "=" * (-len(text) % 4), validate=True))
        except (binascii.Error, ValueError):
            raise InvalidSubscription(INVALID_TOPIC, f"topics[{position}] is not base64") from None
    return tuple(topics)


def subscribe_payload(
    level: str, address: str = "", identifier: str = "", topics: Sequence[bytes | None] = ()
) -> bytes:
    """A ``SubscribeEvent`` as a consumer writes it (topics as bytes; None for a wildcard)."""
    return mx_hub_pb2.SubscribeEvent(
        event_type=level,
        address=address,
        identifier=identifier,
        topics=["" if topic is None else base64.b64encode(topic).decode("ascii") for topic in topics],
    ).SerializeToString()
