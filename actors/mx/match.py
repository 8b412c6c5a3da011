"""MxMatchIndex: the mx-notifier hub subscriptions of one shard, matched once per event.

Match levels (the hub spec's ``SubscribeEvent.event_type``):

- ``All``: every event;
- ``Address``: ``event.address == address``;
- ``Identifier``: ``event.identifier == identifier``;
- ``AddressIdentifier``: both equal;
- ``Topics``: both equal, and ``topics`` is a prefix of the event's topics, position by
  position, where a wildcard (``None``; ``""`` on the wire) matches any value; a filter longer
  than the event's topics does not match.

A consumer may hold several filters (each subscribe adds one) and receives an event once when
any of them matches. The index is keyed so that an event costs a few dictionary lookups and a
walk of the topic patterns registered under its (address, identifier), never a scan of every
subscription.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable, Protocol, Sequence

ALL = "All"
ADDRESS = "Address"
IDENTIFIER = "Identifier"
ADDRESS_IDENTIFIER = "AddressIdentifier"
TOPICS = "Topics"
MATCH_LEVELS = (ALL, ADDRESS, IDENTIFIER, ADDRESS_IDENTIFIER, TOPICS)

Key = Hashable  # a connection, e.g. (gateway id, connection id)
TopicPattern = tuple[bytes | None, ...]  # None: any value at that position


@dataclass(frozen=True, slots=True)
class Subscription:
    """One validated filter; fields a level does not use are None / empty, so equal filters are equal."""

    level: str
    address: str | None = None  # bech32 erd1..., lower case
    identifier: str | None = None
    topics: TopicPattern = ()


class MatchableEvent(Protocol):
    """What matching reads of an event (a ``NormalizedEvent`` message has these fields)."""

    address: str
    identifier: str
    topics: Sequence[bytes]


@dataclass(slots=True)
class _TopicNode:
    """A trie over topic patterns: ``ends`` holds the keys whose pattern ends here."""

    ends: set[Key] = field(default_factory=set)
    exact: dict[bytes, _TopicNode] = field(default_factory=dict)
    wildcard: _TopicNode | None = None

    def is_empty(self) -> bool:
        return not self.ends and not self.exact and self.wildcard is None


class MxMatchIndex:
    """Which connections want which events, indexed by the fields each level compares."""

    def __init__(self) -> None:
        self._by_key: dict[Key, set[Subscription]] = {}
        self._all: set[Key] = set()
        self._by_address: dict[str, set[Key]] = {}
        self._by_identifier: dict[str, set[Key]] = {}
        self._by_pair: dict[tuple[str, str], set[Key]] = {}
        self._topics: dict[tuple[str, str], _TopicNode] = {}

    # -- changes ------------------------------------------------------------------------------

    def add(self, key: Key, subscription: Subscription) -> bool:
        """Add a filter for a connection; False when it already had this exact filter."""
        _check(subscription)
        held = self._by_key.setdefault(key, set())
        if subscription in held:
            return False
        held.add(subscription)
        level = subscription.level
        if level == ALL:
            self._all.add(key)
        elif level == ADDRESS:
            self._by_address.setdefault(subscription.address, set()).add(key)
        elif level == IDENTIFIER:
            self._by_identifier.setdefault(subscription.identifier, set()).add(key)
        elif level == ADDRESS_IDENTIFIER:
            self._by_pair.setdefault(_pair(subscription), set()).add(key)
        else:
            node = self._topics.setdefault(_pair(subscription), _TopicNode())
            for topic in subscription.topics:
                if topic is None:
                    if node.wildcard is None:
                        node.wildcard = _TopicNode()
                    node = node.wildcard
                else:
                    node = node.exact.setdefault(topic, _TopicNode())
            node.ends.add(key)
        return True

    def remove_connection(self, key: Key) -> int:
        """Drop every filter of a connection (it closed); returns how many it had."""
        held = self._by_key.pop(key, set())
        for subscription in held:
            level = subscription.level
            if level == ALL:
                self._all.discard(key)
            elif level == ADDRESS:
                _discard(self._by_address, subscription.address, key)
            elif level == IDENTIFIER:
                _discard(self._by_identifier, subscription.identifier, key)
            elif level == ADDRESS_IDENTIFIER:
                _discard(self._by_pair, _pair(subscription), key)
            else:
                self._remove_pattern(key, subscription)
        return len(held)

    def _remove_pattern(self, key: Key, subscription: Subscription) -> None:
        pair = _pair(subscription)
        root = self._topics.get(pair)
        if root is None:
            return
        path: list[tuple[_TopicNode, bytes | None]] = []
        node: _TopicNode | None = root
        for topic in subscription.topics:
            assert node is not None
            path.append((node, topic))
            node = node.wildcard if topic is None else node.exact.get(topic)
            if node is None:
                return
        assert node is not None
        node.ends.discard(key)
        # Prune the branch bottom-up while it holds nothing, so memory follows the live filters.
        for parent, topic in reversed(path):
            if not node.is_empty():
                break
            if topic is None:
                parent.wildcard = None
            else:
                del parent.exact[topic]
            node = parent
        if root.is_empty():
            del self._topics[pair]

    # -- queries ------------------------------------------------------------------------------

    def match(self, event: MatchableEvent) -> set[Key]:
        """Connections with at least one filter that selects ``event``."""
        return self.match_fields(event.address, event.identifier, event.topics)

    def match_fields(self, address: str, identifier: str, topics: Sequence[bytes]) -> set[Key]:
        keys = set(self._all)
        found = self._by_address.get(address)
        if found:
            keys |= found
        found = self._by_identifier.get(identifier)
        if found:
            keys |= found
        if self._by_pair or self._topics:
            pair = (address, identifier)
            found = self._by_pair.get(pair)
            if found:
                keys |= found
            root = self._topics.get(pair)
            if root is not None:
                _collect(root, topics, 0, keys)
        return keys

    def subscriptions_of(self, key: Key) -> set[Subscription]:
        return set(self._by_key.get(key, ()))

    @property
    def empty(self) -> bool:
        return not self._by_key

    def all_connections(self) -> set[Key]:
        """Connections with an ``All`` filter (recipients of the whole-block streams)."""
        return set(self._all)

    def connections(self) -> set[Key]:
        """Every connection with at least one filter (recipients of block-level streams)."""
        return set(self._by_key)

    def stats(self) -> dict[str, int]:
        return {
            "connections": len(self._by_key),
            "subscriptions": sum(len(held) for held in self._by_key.values()),
            "all": len(self._all),
            "addresses": len(self._by_address),
            "identifiers": len(self._by_identifier),
            "pairs": len(self._by_pair),
            "topic_pairs": len(self._topics),
        }


def _collect(node: _TopicNode, topics: Sequence[bytes], depth: int, keys: set[Key]) -> None:
    """Add the keys of every pattern that is a prefix of ``topics[depth:]`` below ``node``."""
    while True:
        if node.ends:
            keys |= node.ends
        if depth == len(topics):
            return
        if node.wildcard is not None:
            _collect(node.wildcard, topics, depth + 1, keys)
        following = node.exact.get(topics[depth])
        if following is None:
            return
        node = following
        depth += 1


_NEEDS = {
    ALL: (False, False, False),
    ADDRESS: (True, False, False),
    IDENTIFIER: (False, True, False),
    ADDRESS_IDENTIFIER: (True, True, False),
    TOPICS: (True, True, True),
}


def _check(subscription: Subscription) -> None:
    """Refuse a filter the index could not place (the codec builds only valid ones)."""
    needs = _NEEDS.get(subscription.level)
    if needs is None:
        raise ValueError(f"unknown match level {subscription.level!r}")
    address, identifier, topics = needs
    if (address and not subscription.address) or (identifier and not subscription.identifier) or (
        topics and not subscription.topics
    ):
        raise ValueError(f"a {subscription.level} filter needs its address / identifier / topics")


def _pair(subscription: Subscription) -> tuple[str, str]:
    return subscription.address, subscription.identifier  # type: ignore[return-value]


def _discard(index: dict, value: object, key: Key) -> None:
    keys = index.get(value)
    if keys is not None:
        keys.discard(key)
        if not keys:
            del index[value]
