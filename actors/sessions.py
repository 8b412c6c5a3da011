"""SessionTable: connection state that outlives a gateway's view of it.

A session is one client connection: who it is (identity, capabilities), where it is (location),
and what it holds (registrations, subscriptions). Gateways keep none of this authoritatively; on
a gateway's death its sessions are looked up here to clean up, and dialects that restore state
on reconnect read it from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Location = tuple[str, int]


@dataclass(slots=True)
class Session:
    session_id: str
    dialect: str
    location: Location
    identity: str | None
    capabilities: tuple[str, ...]
    opened_at: int  # epoch ms
    registrations: set[str] = field(default_factory=set)
    subscriptions: set[str] = field(default_factory=set)


class SessionTable:
    def __init__(self) -> None:
        self._sessions: dict[str, Session] = {}
        self._by_gateway: dict[str, set[str]] = {}

    def open(
        self,
        session_id: str,
        dialect: str,
        location: Location,
        identity: str | None,
        capabilities: list[str] | tuple[str, ...],
        opened_at: int,
    ) -> Session:
        """Open (or re-bind, when the session id exists) a session at ``location``."""
        previous = self._sessions.get(session_id)
        if previous is not None:
            self._unindex(previous)
        session = Session(session_id, dialect, location, identity, tuple(capabilities), opened_at)
        if previous is not None:
            session.registrations = previous.registrations
            session.subscriptions = previous.subscriptions
        self._sessions[session_id] = session
        self._by_gateway.setdefault(location[0], set()).add(session_id)
        return session

    def close(self, session_id: str) -> Session | None:
        session = self._sessions.pop(session_id, None)
        if session is not None:
            self._unindex(session)
        return session

    def get(self, session_id: str) -> Session | None:
        return self._sessions.get(session_id)

    def record(self, session_id: str, kind: str, value: str, present: bool) -> bool:
        """Note that a session holds (``present``) or no longer holds a registration or subscription."""
        session = self._sessions.get(session_id)
        if session is None:
            return False
        held: set[str] = session.registrations if kind == "registration" else session.subscriptions
        if present:
            held.add(value)
        else:
            held.discard(value)
        return True

    def purge_gateway(self, gateway_id: str) -> list[Session]:
        ids = self._by_gateway.pop(gateway_id, set())
        return [self._sessions.pop(session_id) for session_id in sorted(ids) if session_id in self._sessions]

    def _unindex(self, session: Session) -> None:
        ids = self._by_gateway.get(session.location[0])
        if ids is not None:
            ids.discard(session.session_id)
            if not ids:
                del self._by_gateway[session.location[0]]

    def stats(self) -> dict[str, Any]:
        by_dialect: dict[str, int] = {}
        for session in self._sessions.values():
            by_dialect[session.dialect] = by_dialect.get(session.dialect, 0) + 1
        return {"sessions": len(self._sessions), "by_dialect": by_dialect, "gateways": len(self._by_gateway)}
