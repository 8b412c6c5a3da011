"""Registry: named actors (Signal Hub addresses) with TTL, capabilities, metadata and versions."""

from __future__ import annotations

import heapq
import secrets
from dataclasses import dataclass, field
from typing import Any, Callable

from sortedcontainers import SortedDict

from router.errors import CommandError

Location = tuple[str, int]
Routes = dict[str, tuple[int, ...]]


def new_renewal_token() -> str:
    return "tok_" + secrets.token_urlsafe(18)


@dataclass(slots=True)
class Registration:
    address: str
    location: Location
    session_id: str
    capabilities: tuple[str, ...]
    metadata: dict[str, Any]
    registered_at: int  # epoch ms
    expires_at: int  # epoch ms
    version: int
    renewal_token: str = field(repr=False)

    def is_live(self, now_ms: int) -> bool:
        return self.expires_at > now_ms

    def describe(self) -> dict[str, Any]:
        """The public view used in discovery results."""
        return {
            "actorAddress": self.address,
            "capabilities": list(self.capabilities),
            "metadata": self.metadata,
            "registeredAt": self.registered_at,
        }


class Registry:
    """Registered addresses of one shard.

    Rules (documented in docs/signal-hub.md):
    - an address held by a live registration of *another* connection is a conflict;
    - the same connection registering again replaces its registration (new version and token);
    - an expired registration is invisible (lookups, discovery, broadcast) and may be taken over;
      versions keep counting up while the shard remembers the address;
    - only the owning connection may unregister or renew, and renewing needs the current token.
    """

    def __init__(self, max_entries: int, token_factory: Callable[[], str] = new_renewal_token) -> None:
        self.max_entries = max_entries
        self._new_token = token_factory
        # In address order, so discovery walks only as far as the page it is asked for.
        self._entries: SortedDict[str, Registration] = SortedDict()
        self._by_connection: dict[Location, set[str]] = {}
        self._expiry_heap: list[tuple[int, str]] = []

    # -- writes ---------------------------------------------------------------------------

    def register(
        self,
        address: str,
        location: Location,
        session_id: str,
        capabilities: list[str] | tuple[str, ...],
        metadata: dict[str, Any],
        ttl_ms: int,
        now_ms: int,
    ) -> Registration:
        existing = self._entries.get(address)
        if existing is not None and existing.is_live(now_ms) and existing.location != location:
            raise CommandError(
                "conflict",
                f"Actor {address} already registered",
                {
                    "existingVersion": existing.version,
                    "existingExpiresAt": existing.expires_at,
                    "hint": "Wait for expiration or use different address",
                },
            )
        if existing is None or not existing.is_live(now_ms):
            if self.live_count(now_ms) >= self.max_entries:
                raise CommandError(
                    "registry_full",
                    f"Registry at capacity ({self.max_entries} actors); existing actors can still renew",
                    {"limit": self.max_entries},
                )
        if existing is not None:
            self._detach(existing)
        registration = Registration(
            address=address,
            location=location,
            session_id=session_id,
            capabilities=tuple(capabilities),
            metadata=metadata,
            registered_at=now_ms,
            expires_at=now_ms + ttl_ms,
            version=existing.version + 1 if existing is not None else 1,
            renewal_token=self._new_token(),
        )
        self._entries[address] = registration
        self._by_connection.setdefault(location, set()).add(address)
        heapq.heappush(self._expiry_heap, (registration.expires_at, address))
        return registration

    def restore(self, registration: Registration, now_ms: int) -> bool:
        """Take back ``registration`` as its connection's gateway last saw it (the shard restarted
        empty): same token, version and expiry. False if it expired meanwhile or another live
        connection took the address first."""
        if not registration.is_live(now_ms):
            return False
        existing = self._entries.get(registration.address)
        if existing is not None:
            if existing.is_live(now_ms) and existing.location != registration.location:
                return False
            self._detach(existing)
        self._entries[registration.address] = registration
        self._by_connection.setdefault(registration.location, set()).add(registration.address)
        heapq.heappush(self._expiry_heap, (registration.expires_at, registration.address))
        return True

    def unregister(self, address: str, location: Location, now_ms: int) -> Registration:
        registration = self._owned(address, location, now_ms)
        self._detach(registration)
        del self._entries[address]
        return registration

    def renew(self, address: str, location: Location, token: str, ttl_ms: int, now_ms: int) -> Registration:
        registration = self._owned(address, location, now_ms)
        if not secrets.compare_digest(registration.renewal_token, token):
            raise CommandError("bad_renewal_token", "Invalid or expired renewal token", {"actorAddress": address})
        registration.expires_at = now_ms + ttl_ms
        registration.renewal_token = self._new_token()
        heapq.heappush(self._expiry_heap, (registration.expires_at, address))
        return registration

    def _owned(self, address: str, location: Location, now_ms: int) -> Registration:
        registration = self._entries.get(address)
        if registration is None or not registration.is_live(now_ms):
            raise CommandError(
                "unknown_actor", f"Actor {address} not registered or expired", {"actorAddress": address}
            )
        if registration.location != location:
            raise CommandError(
                "not_owner", f"Actor {address} is registered by another connection", {"actorAddress": address}
            )
        return registration

    def _detach(self, registration: Registration) -> None:
        addresses = self._by_connection.get(registration.location)
        if addresses is not None:
            addresses.discard(registration.address)
            if not addresses:
                del self._by_connection[registration.location]

    # -- reads ----------------------------------------------------------------------------

    def lookup(self, address: str, now_ms: int) -> Registration | None:
        registration = self._entries.get(address)
        if registration is None or not registration.is_live(now_ms):
            return None
        return registration

    def live_count(self, now_ms: int) -> int:
        if len(self._entries) >= self.max_entries:
            self.sweep(now_ms)
        return len(self._entries)

    def discover(
        self,
        now_ms: int,
        window: int,
        matcher: Any = None,
        capabilities: list[str] | tuple[str, ...] = (),
        metadata: dict[str, Any] | None = None,
    ) -> tuple[int, list[Registration]]:
        """The first ``window`` live registrations matching every criterion, in address order, and
        how many matched: exact up to ``window``, ``window + 1`` when more did.

        The walk stops at the match after the window, so it costs what the page needs (plus one
        look at each entry a filter rejects on the way), not the whole registry."""
        required = set(capabilities)
        found: list[Registration] = []
        for registration in self._entries.values():
            if not registration.is_live(now_ms):
                continue
            if matcher is not None and matcher.search(registration.address) is None:
                continue
            if required and not required.issubset(registration.capabilities):
                continue
            if metadata and not _metadata_matches(registration.metadata, metadata):
                continue
            if len(found) == window:
                return window + 1, found
            found.append(registration)
        return len(found), found

    def broadcast_routes(self, now_ms: int, exclude: Location | None = None) -> tuple[int, Routes]:
        """Connections of every live registration, one delivery per connection."""
        grouped: dict[str, set[int]] = {}
        for registration in self._entries.values():
            if registration.is_live(now_ms) and registration.location != exclude:
                gateway_id, connection_id = registration.location
                grouped.setdefault(gateway_id, set()).add(connection_id)
        routes = {gateway_id: tuple(sorted(ids)) for gateway_id, ids in grouped.items()}
        return sum(len(ids) for ids in routes.values()), routes

    def addresses_of(self, location: Location) -> set[str]:
        return set(self._by_connection.get(location, ()))

    # -- cleanup --------------------------------------------------------------------------

    def purge_connection(self, location: Location) -> list[str]:
        addresses = self._by_connection.pop(location, set())
        for address in addresses:
            self._entries.pop(address, None)
        return sorted(addresses)

    def purge_gateway(self, gateway_id: str) -> int:
        gone = [location for location in self._by_connection if location[0] == gateway_id]
        for location in gone:
            self.purge_connection(location)
        return len(gone)

    def sweep(self, now_ms: int) -> int:
        """Forget registrations whose TTL has passed; returns how many."""
        removed = 0
        heap = self._expiry_heap
        while heap and heap[0][0] <= now_ms:
            expires_at, address = heapq.heappop(heap)
            registration = self._entries.get(address)
            # Renewals push a new heap entry; only the entry matching the current expiry counts.
            if registration is not None and registration.expires_at == expires_at:
                self._detach(registration)
                del self._entries[address]
                removed += 1
        return removed

    def stats(self, now_ms: int) -> dict[str, int]:
        return {
            "registrations": sum(1 for r in self._entries.values() if r.is_live(now_ms)),
            "connections": len(self._by_connection),
        }


def _metadata_matches(actual: dict[str, Any], wanted: dict[str, Any]) -> bool:
    for key, value in wanted.items():
        if key not in actual or not _json_equal(actual[key], value):
            return False
    return True


def _json_equal(a: Any, b: Any) -> bool:
    """Equality as JSON means it: ``true`` is not ``1``, key order does not matter."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b
