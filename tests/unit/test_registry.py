"""actors/registry.py: named actors with TTL, ownership, discovery and broadcast routes."""

from __future__ import annotations

import pytest

from actors.signal.registry import Registration, Registry, new_renewal_token
from router.errors import CommandError
from router.patterns import compile_pattern

A = ("g1", 1)
B = ("g1", 2)
C = ("g2", 7)

T0 = 10_000  # a "now" in epoch ms
TTL = 1_000


@pytest.fixture
def registry(tokens) -> Registry:
    return Registry(max_entries=100, token_factory=tokens)


def register(registry: Registry, address: str, location=A, now: int = T0, ttl: int = TTL,
             capabilities=("send",), metadata=None, session: str = "s1") -> Registration:
    return registry.register(address, location, session, list(capabilities), metadata or {}, ttl, now)


def addresses(registrations: list[Registration]) -> list[str]:
    return [r.address for r in registrations]


# -- register -------------------------------------------------------------------------------


def test_register_returns_the_registration(registry):
    reg = registry.register("rt/a", A, "sess-1", ["send", "receive"], {"k": "v"}, 1_000, T0)
    assert reg.address == "rt/a"
    assert reg.location == A
    assert reg.session_id == "sess-1"
    assert reg.capabilities == ("send", "receive")
    assert reg.metadata == {"k": "v"}
    assert reg.registered_at == T0
    assert reg.expires_at == T0 + 1_000
    assert reg.version == 1
    assert reg.renewal_token == "tok-1"
    assert registry.lookup("rt/a", T0) is reg


def test_describe_is_the_public_view(registry):
    reg = register(registry, "rt/a", capabilities=("send", "receive"), metadata={"k": [1, True]})
    assert reg.describe() == {
        "actorAddress": "rt/a",
        "capabilities": ["send", "receive"],
        "metadata": {"k": [1, True]},
        "registeredAt": T0,
    }


def test_repr_hides_the_renewal_token(registry):
    reg = register(registry, "rt/a")
    assert "tok-1" not in repr(reg)
    assert "rt/a" in repr(reg)


def test_is_live_until_expiry_exclusive(registry):
    reg = register(registry, "rt/a")
    assert reg.is_live(T0 + TTL - 1) is True
    assert reg.is_live(T0 + TTL) is False
    assert registry.lookup("rt/a", T0 + TTL - 1) is reg
    assert registry.lookup("rt/a", T0 + TTL) is None


def test_default_token_factory_issues_distinct_tokens():
    first, second = new_renewal_token(), new_renewal_token()
    assert first.startswith("tok_") and second.startswith("tok_")
    assert len(first) == len("tok_") + 24  # token_urlsafe(18): 18 bytes -> 24 characters
    assert first != second


def test_conflict_when_another_live_connection_holds_the_address(registry):
    original = register(registry, "rt/a", location=A)
    with pytest.raises(CommandError) as raised:
        register(registry, "rt/a", location=B, now=T0 + 500)
    error = raised.value
    assert error.code == "conflict"
    assert error.message == "Actor rt/a already registered"
    assert error.details == {
        "existingVersion": 1,
        "existingExpiresAt": T0 + TTL,
        "hint": "Wait for expiration or use different address",
    }
    # Nothing changed.
    assert registry.lookup("rt/a", T0 + 500) is original
    assert original.renewal_token == "tok-1"
    assert registry.addresses_of(B) == set()


def test_conflict_reports_the_current_version(registry):
    register(registry, "rt/a", location=A)
    register(registry, "rt/a", location=A, now=T0 + 1)
    register(registry, "rt/a", location=A, now=T0 + 2)
    with pytest.raises(CommandError) as raised:
        register(registry, "rt/a", location=C, now=T0 + 3)
    assert raised.value.details["existingVersion"] == 3
    assert raised.value.details["existingExpiresAt"] == T0 + 2 + TTL


def test_same_connection_reregistering_replaces_and_bumps_version(registry):
    first = register(registry, "rt/a", location=A, capabilities=("send",), metadata={"v": 1})
    second = registry.register("rt/a", A, "sess-2", ["receive"], {"v": 2}, 5_000, T0 + 100)
    assert second is not first
    assert second.version == 2
    assert second.renewal_token == "tok-2"
    assert second.session_id == "sess-2"
    assert second.capabilities == ("receive",)
    assert second.metadata == {"v": 2}
    assert second.registered_at == T0 + 100
    assert second.expires_at == T0 + 5_100
    assert registry.lookup("rt/a", T0 + 100) is second
    assert registry.addresses_of(A) == {"rt/a"}
    # The replaced registration's token no longer renews.
    with pytest.raises(CommandError) as raised:
        registry.renew("rt/a", A, "tok-1", TTL, T0 + 200)
    assert raised.value.code == "bad_renewal_token"


def test_expired_registration_is_invisible(registry):
    register(registry, "rt/a", location=A)
    later = T0 + TTL
    assert registry.lookup("rt/a", later) is None
    assert registry.discover(later, WINDOW) == (0, [])
    assert registry.broadcast_routes(later) == (0, {})
    assert registry.stats(later)["registrations"] == 0


def test_expired_registration_can_be_taken_over_and_version_continues(registry):
    register(registry, "rt/a", location=A)
    register(registry, "rt/a", location=A, now=T0 + 10)  # version 2
    taken = register(registry, "rt/a", location=B, now=T0 + 10 + TTL, session="s2")
    assert taken.version == 3
    assert taken.location == B
    assert taken.session_id == "s2"
    assert registry.lookup("rt/a", T0 + 10 + TTL) is taken
    assert registry.addresses_of(A) == set()
    assert registry.addresses_of(B) == {"rt/a"}
    # The previous owner lost it.
    with pytest.raises(CommandError) as raised:
        registry.unregister("rt/a", A, T0 + 10 + TTL)
    assert raised.value.code == "not_owner"


def test_takeover_after_sweep_starts_a_new_version_sequence(registry):
    register(registry, "rt/a", location=A)
    register(registry, "rt/a", location=A, now=T0 + 10)
    assert registry.sweep(T0 + 10 + TTL) == 1
    taken = register(registry, "rt/a", location=B, now=T0 + 10 + TTL)
    assert taken.version == 1


def test_register_copies_capabilities_into_a_tuple(registry):
    caps = ["send", "receive"]
    reg = registry.register("rt/a", A, "s", caps, {}, TTL, T0)
    caps.append("broadcast")
    assert reg.capabilities == ("send", "receive")


# -- capacity -------------------------------------------------------------------------------


def test_registry_full_at_max_entries(tokens):
    registry = Registry(max_entries=2, token_factory=tokens)
    register(registry, "rt/a", location=A)
    register(registry, "rt/b", location=B)
    with pytest.raises(CommandError) as raised:
        register(registry, "rt/c", location=C)
    error = raised.value
    assert error.code == "registry_full"
    assert error.message == "Registry at capacity (2 actors); existing actors can still renew"
    assert error.details == {"limit": 2}
    assert registry.lookup("rt/c", T0) is None
    assert tokens.issued == 2


def test_full_registry_still_allows_reregister_and_renew_of_existing(tokens):
    registry = Registry(max_entries=2, token_factory=tokens)
    register(registry, "rt/a", location=A)
    register(registry, "rt/b", location=B)
    again = register(registry, "rt/a", location=A, now=T0 + 1)
    assert again.version == 2
    renewed = registry.renew("rt/b", B, "tok-2", 5_000, T0 + 2)
    assert renewed.expires_at == T0 + 5_002


def test_full_registry_conflict_is_reported_before_capacity(tokens):
    registry = Registry(max_entries=1, token_factory=tokens)
    register(registry, "rt/a", location=A)
    with pytest.raises(CommandError) as raised:
        register(registry, "rt/a", location=B)
    assert raised.value.code == "conflict"


def test_expired_entries_are_swept_to_make_room(tokens):
    registry = Registry(max_entries=2, token_factory=tokens)
    register(registry, "rt/a", location=A, ttl=500)
    register(registry, "rt/b", location=B, ttl=5_000)
    fresh = register(registry, "rt/c", location=C, now=T0 + 500)
    assert fresh.version == 1
    assert registry.lookup("rt/c", T0 + 500) is fresh
    assert registry.addresses_of(A) == set()  # rt/a was swept, not just hidden
    assert registry.live_count(T0 + 500) == 2
    assert registry.stats(T0 + 500) == {"registrations": 2, "connections": 2}


def test_expired_address_taken_over_in_a_full_registry(tokens):
    registry = Registry(max_entries=1, token_factory=tokens)
    register(registry, "rt/a", location=A)
    register(registry, "rt/a", location=A, now=T0 + 1)  # version 2, expires T0 + 1 + TTL
    taken = register(registry, "rt/a", location=B, now=T0 + 1 + TTL)
    assert taken.version == 3
    assert taken.location == B


# -- unregister / renew ---------------------------------------------------------------------


def test_unregister_by_owner(registry):
    reg = register(registry, "rt/a", location=A)
    assert registry.unregister("rt/a", A, T0 + 1) is reg
    assert registry.lookup("rt/a", T0 + 1) is None
    assert registry.addresses_of(A) == set()
    assert registry.stats(T0 + 1) == {"registrations": 0, "connections": 0}
    # The shard forgot the address: registering again starts at version 1.
    assert register(registry, "rt/a", location=B, now=T0 + 2).version == 1


def test_unregister_unknown_actor(registry):
    with pytest.raises(CommandError) as raised:
        registry.unregister("rt/x", A, T0)
    error = raised.value
    assert error.code == "unknown_actor"
    assert error.message == "Actor rt/x not registered or expired"
    assert error.details == {"actorAddress": "rt/x"}


def test_unregister_expired_is_unknown_actor(registry):
    register(registry, "rt/a", location=A)
    with pytest.raises(CommandError) as raised:
        registry.unregister("rt/a", A, T0 + TTL)
    assert raised.value.code == "unknown_actor"


def test_unregister_by_another_connection_is_not_owner(registry):
    reg = register(registry, "rt/a", location=A)
    with pytest.raises(CommandError) as raised:
        registry.unregister("rt/a", B, T0 + 1)
    error = raised.value
    assert error.code == "not_owner"
    assert error.message == "Actor rt/a is registered by another connection"
    assert error.details == {"actorAddress": "rt/a"}
    assert registry.lookup("rt/a", T0 + 1) is reg


def test_renew_extends_expiry_and_rotates_token(registry):
    reg = register(registry, "rt/a", location=A)
    renewed = registry.renew("rt/a", A, "tok-1", 2_000, T0 + 900)
    assert renewed is reg
    assert renewed.expires_at == T0 + 2_900
    assert renewed.renewal_token == "tok-2"
    assert renewed.version == 1  # renewing is not a new registration
    assert renewed.registered_at == T0
    assert registry.lookup("rt/a", T0 + 2_000) is reg
    # The rotated-out token is refused; the new one works.
    with pytest.raises(CommandError) as raised:
        registry.renew("rt/a", A, "tok-1", 2_000, T0 + 1_000)
    assert raised.value.code == "bad_renewal_token"
    assert registry.renew("rt/a", A, "tok-2", 2_000, T0 + 1_000).renewal_token == "tok-3"


def test_renew_with_bad_token(registry):
    reg = register(registry, "rt/a", location=A)
    with pytest.raises(CommandError) as raised:
        registry.renew("rt/a", A, "nope", 2_000, T0 + 1)
    error = raised.value
    assert error.code == "bad_renewal_token"
    assert error.message == "Invalid or expired renewal token"
    assert error.details == {"actorAddress": "rt/a"}
    assert reg.expires_at == T0 + TTL
    assert reg.renewal_token == "tok-1"


def test_renew_by_another_connection_is_not_owner_even_with_the_token(registry):
    register(registry, "rt/a", location=A)
    with pytest.raises(CommandError) as raised:
        registry.renew("rt/a", B, "tok-1", 2_000, T0 + 1)
    assert raised.value.code == "not_owner"


def test_renew_expired_or_unknown_is_unknown_actor(registry):
    register(registry, "rt/a", location=A)
    with pytest.raises(CommandError) as raised:
        registry.renew("rt/a", A, "tok-1", 2_000, T0 + TTL)
    assert raised.value.code == "unknown_actor"
    assert raised.value.details == {"actorAddress": "rt/a"}
    with pytest.raises(CommandError) as raised:
        registry.renew("rt/zzz", A, "tok-1", 2_000, T0)
    assert raised.value.code == "unknown_actor"


# -- discover -------------------------------------------------------------------------------


@pytest.fixture
def populated(registry) -> Registry:
    register(registry, "rt/chat-2", location=B, capabilities=("send",),
             metadata={"region": "us", "gpu": 1, "n": 2})
    register(registry, "other/bot", location=C, capabilities=("send", "receive", "broadcast"),
             metadata={"region": "eu", "nothing": None})
    register(registry, "rt/chat-1", location=A, capabilities=("send", "receive"),
             metadata={"region": "eu", "gpu": True, "n": 1, "cfg": {"a": 1, "b": [1, 2]}})
    register(registry, "rt/old", location=A, ttl=10, capabilities=("send", "receive"),
             metadata={"region": "eu"})
    return registry


NOW = T0 + 10  # rt/old has just expired
WINDOW = 100


def test_discover_without_filters_returns_live_sorted(populated):
    total, found = populated.discover(NOW, WINDOW)
    assert total == 3
    assert addresses(found) == ["other/bot", "rt/chat-1", "rt/chat-2"]


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("chat", ["rt/chat-1", "rt/chat-2"]),  # search, not match: anywhere in the address
        ("^rt/", ["rt/chat-1", "rt/chat-2"]),
        ("bot$", ["other/bot"]),
        ("-1", ["rt/chat-1"]),
        ("^chat", []),
        ("o", ["other/bot"]),  # rt/old contains "o" too, but it has expired
    ],
)
def test_discover_by_pattern(populated, pattern, expected):
    total, found = populated.discover(NOW, WINDOW, matcher=compile_pattern(pattern, 256))
    assert total == len(expected)
    assert addresses(found) == expected


def test_discover_requires_all_capabilities(populated):
    assert addresses(populated.discover(NOW, WINDOW, capabilities=["send", "receive"])[1]) == ["other/bot", "rt/chat-1"]
    assert addresses(populated.discover(NOW, WINDOW, capabilities=("broadcast",))[1]) == ["other/bot"]
    assert addresses(populated.discover(NOW, WINDOW, capabilities=["send", "publish"])[1]) == []
    assert populated.discover(NOW, WINDOW, capabilities=[])[0] == 3


@pytest.mark.parametrize(
    ("wanted", "expected"),
    [
        ({"region": "eu"}, ["other/bot", "rt/chat-1"]),
        ({"gpu": True}, ["rt/chat-1"]),  # JSON true is not 1
        ({"gpu": 1}, ["rt/chat-2"]),  # and 1 is not true
        ({"n": 1.0}, ["rt/chat-1"]),  # numbers compare as numbers
        ({"n": "1"}, []),  # a string is not a number
        ({"region": "eu", "gpu": True}, ["rt/chat-1"]),
        ({"cfg": {"b": [1, 2], "a": 1}}, ["rt/chat-1"]),  # key order is irrelevant
        ({"cfg": {"a": 1}}, []),  # nested objects are equal, not subsets
        ({"cfg": {"a": True, "b": [1, 2]}}, []),  # nested true is not 1
        ({"cfg": {"a": 1, "b": [1, 2, 3]}}, []),
        ({"cfg": {"a": 1, "b": [True, 2]}}, []),  # inside lists too
        ({"nothing": None}, ["other/bot"]),  # null matches a present null
        ({"missing": None}, []),  # but not an absent key
        ({"region": "asia"}, []),
        ({}, ["other/bot", "rt/chat-1", "rt/chat-2"]),  # an empty filter filters nothing
    ],
)
def test_discover_by_metadata_uses_json_equality(populated, wanted, expected):
    total, found = populated.discover(NOW, WINDOW, metadata=wanted)
    assert total == len(expected)
    assert addresses(found) == expected


def test_discover_combines_criteria(populated):
    total, found = populated.discover(
        NOW, WINDOW, matcher=compile_pattern("chat", 256), capabilities=["receive"], metadata={"region": "eu"}
    )
    assert (total, addresses(found)) == (1, ["rt/chat-1"])


def test_discover_window_counts_one_match_beyond_it(registry):
    for name in ("rt/d", "rt/b", "rt/a", "rt/c"):
        register(registry, name, location=A)
    # Exact up to the window; window + 1 says "more than the window" without counting them all.
    assert registry.discover(T0, 2) == (3, [registry.lookup("rt/a", T0), registry.lookup("rt/b", T0)])
    assert registry.discover(T0, 0) == (1, [])
    assert addresses(registry.discover(T0, 3)[1]) == ["rt/a", "rt/b", "rt/c"]
    assert registry.discover(T0, 3)[0] == 4
    assert registry.discover(T0, 4)[0] == 4
    assert registry.discover(T0, 10)[0] == 4


class CountingMatcher:
    """A real pattern that counts the addresses it was asked about."""

    def __init__(self, pattern: str) -> None:
        self.pattern = compile_pattern(pattern, 256)
        self.asked = 0

    def search(self, address: str):
        self.asked += 1
        return self.pattern.search(address)


def test_discover_walks_only_as_far_as_the_window(registry):
    """The issue: every discover matched and sorted the whole registry and shipped offset + limit
    full registrations per shard; now the walk is in address order and stops after the window."""
    for i in reversed(range(90)):
        register(registry, f"rt/{i:02d}", location=A)
    matcher = CountingMatcher("^rt/")
    count, found = registry.discover(T0, 5, matcher)
    assert (count, addresses(found)) == (6, ["rt/00", "rt/01", "rt/02", "rt/03", "rt/04"])
    assert matcher.asked == 6
    # Filters that reject entries still look at each one on the way, and no further than needed.
    odd = CountingMatcher("[13579]$")
    count, found = registry.discover(T0, 3, odd)
    assert (count, addresses(found)) == (4, ["rt/01", "rt/03", "rt/05"])
    assert odd.asked == 8


def test_discover_order_survives_unregister_purge_and_sweep(registry):
    for name in ("rt/e", "rt/a", "rt/d"):
        register(registry, name, location=A)
    register(registry, "rt/c", location=B, ttl=10)
    register(registry, "rt/b", location=C)
    registry.unregister("rt/d", A, T0)
    assert registry.sweep(T0 + 10) == 1
    registry.purge_connection(C)
    register(registry, "rt/bb", location=B)
    assert addresses(registry.discover(T0 + 10, WINDOW)[1]) == ["rt/a", "rt/bb", "rt/e"]


# -- broadcast routes -----------------------------------------------------------------------


def test_broadcast_routes_one_delivery_per_connection(registry):
    register(registry, "rt/c", location=("g1", 9))  # ids are sorted, whatever the order of arrival
    register(registry, "rt/a", location=A)
    register(registry, "rt/b", location=A)  # same connection as rt/a: one delivery
    register(registry, "rt/d", location=C)
    register(registry, "rt/e", location=("g1", 5), ttl=5)  # expired at T0 + 5
    now = T0 + 5
    assert registry.broadcast_routes(now) == (3, {"g1": (1, 9), "g2": (7,)})
    assert registry.broadcast_routes(now, exclude=A) == (2, {"g1": (9,), "g2": (7,)})
    assert registry.broadcast_routes(now, exclude=C) == (2, {"g1": (1, 9)})
    assert registry.broadcast_routes(now, exclude=("g9", 1)) == (3, {"g1": (1, 9), "g2": (7,)})


# -- cleanup --------------------------------------------------------------------------------


def test_purge_connection(registry):
    for name in ("rt/b", "rt/f", "rt/a", "rt/e", "rt/d", "rt/g"):
        register(registry, name, location=A)
    other = register(registry, "rt/c", location=B)
    assert registry.purge_connection(A) == ["rt/a", "rt/b", "rt/d", "rt/e", "rt/f", "rt/g"]
    assert registry.lookup("rt/a", T0) is None
    assert registry.lookup("rt/b", T0) is None
    assert registry.lookup("rt/c", T0) is other
    assert registry.addresses_of(A) == set()
    assert registry.purge_connection(A) == []
    assert registry.stats(T0) == {"registrations": 1, "connections": 1}
    # The address is free for anyone, from version 1.
    assert register(registry, "rt/a", location=C).version == 1


def test_purge_gateway(registry):
    register(registry, "rt/a", location=A)
    register(registry, "rt/b", location=A)
    register(registry, "rt/c", location=B)
    kept = register(registry, "rt/d", location=C)
    assert registry.purge_gateway("g1") == 2  # connections, not addresses
    assert registry.discover(T0, WINDOW) == (1, [kept])
    assert registry.stats(T0) == {"registrations": 1, "connections": 1}
    assert registry.purge_gateway("g1") == 0
    assert registry.purge_gateway("nope") == 0


def test_sweep_removes_expired_only(registry):
    register(registry, "rt/a", location=A, ttl=100)
    register(registry, "rt/b", location=A, ttl=200)
    register(registry, "rt/c", location=B, ttl=300)
    assert registry.sweep(T0 + 99) == 0
    assert registry.sweep(T0 + 200) == 2
    assert registry.addresses_of(A) == set()
    assert registry.addresses_of(B) == {"rt/c"}
    assert registry.stats(T0 + 200) == {"registrations": 1, "connections": 1}
    assert registry.sweep(T0 + 200) == 0
    assert registry.sweep(T0 + 300) == 1
    assert registry.stats(T0 + 300) == {"registrations": 0, "connections": 0}


def test_sweep_ignores_heap_entries_left_by_renewals(registry):
    register(registry, "rt/a", location=A, ttl=1_000)  # heap: T0 + 1000
    registry.renew("rt/a", A, "tok-1", 1_000, T0 + 500)  # heap: T0 + 1500
    assert registry.sweep(T0 + 1_000) == 0  # the first entry is stale
    assert registry.lookup("rt/a", T0 + 1_000) is not None
    assert registry.sweep(T0 + 1_500) == 1
    assert registry.lookup("rt/a", T0 + 1_500) is None


def test_sweep_after_a_shortening_renewal(registry):
    register(registry, "rt/a", location=A, ttl=1_000)  # heap: T0 + 1000
    registry.renew("rt/a", A, "tok-1", 100, T0 + 500)  # heap: T0 + 600
    assert registry.sweep(T0 + 600) == 1
    assert registry.sweep(T0 + 1_000) == 0  # the stale, later entry finds nothing


def test_sweep_ignores_heap_entries_of_replaced_registrations(registry):
    register(registry, "rt/a", location=A, ttl=1_000)
    register(registry, "rt/a", location=A, now=T0 + 500, ttl=1_000)  # expires T0 + 1500
    assert registry.sweep(T0 + 1_000) == 0
    assert registry.lookup("rt/a", T0 + 1_000).version == 2


def test_stats_and_live_count(registry):
    register(registry, "rt/a", location=A)
    register(registry, "rt/b", location=A)
    register(registry, "rt/c", location=C, ttl=5)
    assert registry.stats(T0) == {"registrations": 3, "connections": 2}
    assert registry.stats(T0 + 5)["registrations"] == 2
    assert registry.live_count(T0) == 3
