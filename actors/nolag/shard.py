"""NoLag's parts of the shards: topics, rooms and lobbies (topic shards); actors (session shards).

Topic shards hold the topics (``nolag/<project>/<topic>``: subscribers with filters, QoS and
load-balance groups, and the message log), the rooms (``nolag-room/<project>/<room>``: presence,
and which connections are in the room) and lobby listeners. A connection's state is spread over
several shards (its topics and its rooms hash apart), so every hook scans every index of this
component: a purge that looked only at rooms left subscriptions behind as ghosts that still won
load-balanced turns.
"""

from __future__ import annotations

import logging
from typing import Any

from actors.nolag.contract import (ActorState, LobbyChange, LobbySpec, LoggedMessage, Op, PresenceChange,
                                   SubscriptionRecord, message, topic_of)
from actors.nolag.keys import pattern_matches
from actors.nolag.messagelog import LogRecord, MessageLog, SqliteMessageLog
from actors.nolag.state import Lobby, Presence, Subscriptions
from actors.shard import Component, Handler
from router.contract import DELIVER_EVENT, Location, group_by_gateway
from router.shardmap import SESSION, TOPIC

logger = logging.getLogger(__name__)

PRUNE_EVERY_MS = 60_000
# A topic's last stamp matters only while the clock could still be at or below it (a burst runs
# stamps ahead of the clock; a wall clock may step back a little): older ones are dropped, so the
# map does not keep every topic a client ever named.
STAMPS_KEPT_MS = 5_000
STAMPS_PRUNED_EVERY_MS = 1_000
MAX_SEEN = 1000  # QoS 2 ids kept per actor
# Logged messages kept in memory while the message log cannot store them (retried every batch);
# beyond this the oldest are dropped, and said so.
MAX_LOG_BACKLOG = 100_000


class NolagTopics(Component):
    name = "nolag"

    def __init__(self, shard: Any) -> None:
        super().__init__(shard)
        self.subscriptions = Subscriptions()
        self.presence = Presence()
        self.room_members: dict[str, set[Location]] = {}
        self.lobby_listeners: dict[tuple[str, str], tuple[Lobby, set[Location]]] = {}
        self._log: MessageLog | None = None
        self._log_pending: list[LogRecord] = []
        self._topic_ts: dict[str, int] = {}  # topic key -> its last stamp, while it matters
        self._stamps_pruned_at = 0
        self._next_prune = 0

    def operations(self) -> dict[str, Handler]:
        return {
            Op.SUBSCRIBE: self.subscribe,
            Op.UNSUBSCRIBE: self.unsubscribe,
            Op.SET_FILTERS: self.set_filters,
            Op.PUBLISH: self.publish,
            Op.LOG: self.logged,
            Op.ROOM: self.room,
            Op.PRESENCE: self.set_presence,
            Op.PRESENCE_LIST: self.presence_list,
            Op.LOBBY_SUBSCRIBE: self.lobby_subscribe,
            Op.LOBBY_UNSUBSCRIBE: self.lobby_unsubscribe,
        }

    # -- the message log ------------------------------------------------------------------

    @property
    def message_log(self) -> MessageLog:
        if self._log is None:
            self._log = SqliteMessageLog(self.settings.data_dir / "nolag-log.sqlite3", self._retention_ms)
        return self._log

    def _retention_ms(self, key: str) -> int:
        """How long a topic's messages are kept: the first matching `nolag.log_retention` pattern, else the default."""
        config = self.settings.nolag
        topic = topic_of(key)
        for pattern, seconds in config.log_retention.items():
            if pattern_matches(pattern, topic):
                return int(seconds * 1000)
        return int(config.log_retention_s * 1000)

    # -- topics ---------------------------------------------------------------------------

    def subscribe(self, gateway_id: str, key: str, connection_id: int, actor: str, filters: tuple[str, ...],
                  qos: int, group: str | None) -> int:
        self.subscriptions.subscribe(key, (gateway_id, connection_id), filters, qos, group)
        # Without a stamp kept, every message so far is older than now and the next is stamped now or later.
        return self._topic_ts.get(key, self.now - 1)

    def unsubscribe(self, gateway_id: str, key: str, connection_id: int) -> bool:
        return self.subscriptions.unsubscribe(key, (gateway_id, connection_id))

    def set_filters(self, gateway_id: str, key: str, connection_id: int, filters: tuple[str, ...]) -> bool:
        return self.subscriptions.set_filters(key, (gateway_id, connection_id), filters)

    def publish(self, gateway_id: str, key: str, topic: str, packed: bytes, qos: int, filter_: str | None,
                exclude: int | None, msg_id: str | None, sender: str, meta: tuple | None = None) -> int:
        # The shard stamps the time: strictly increasing per topic, so a position in a topic is exact.
        ts_ms = max(self.now, self._topic_ts.get(key, 0) + 1)
        self._topic_ts[key] = ts_ms
        if msg_id is not None:
            self._log_pending.append(LogRecord(key, msg_id, ts_ms, packed, qos, filter_))
        chosen = self.subscriptions.route(key, filter_, None if exclude is None else (gateway_id, exclude))
        if chosen:
            self.emit(group_by_gateway(chosen), message(topic, packed, msg_id, qos, filter_, ts_ms, sender, meta),
                      DELIVER_EVENT)
        return len(chosen)

    def logged(self, gateway_id: str, key: str, after_ms: int, limit: int) -> list[LoggedMessage]:
        topic = topic_of(key)
        return [LoggedMessage(topic, r.msg_id, r.ts_ms, r.data_packed, r.qos, r.filter)
                for r in self.message_log.since([key], after_ms, limit)]

    # -- rooms and presence ---------------------------------------------------------------

    def room(self, gateway_id: str, room: str, connection_id: int, join: bool) -> bool:
        members = self.room_members.setdefault(room, set())
        (members.add if join else members.discard)((gateway_id, connection_id))
        if not members:
            del self.room_members[room]
        return True

    def set_presence(self, gateway_id: str, room: str, connection_id: int, actor: str, data: Any, now: int) -> int:
        location = (gateway_id, connection_id)
        events = self.presence.set(room, actor, location, data, now)
        self._presence_out(room, events, extra=location)
        return len(events)

    def presence_list(self, gateway_id: str, room: str) -> list[dict[str, Any]]:
        return self.presence.list(room)

    def _presence_out(self, room: str, events: list, extra: Location | None = None) -> None:
        """Presence events to the room's members (and the actor itself), lobby events to listeners."""
        if not events:
            return
        _, project, plain = room.split("/", 2)
        members = set(self.room_members.get(room, ()))
        if extra is not None:
            members.add(extra)
        routes = group_by_gateway(members)
        listeners = [(lobby_id, located) for (p, lobby_id), (lobby, located) in self.lobby_listeners.items()
                     if p == project and lobby.contains(plain) and located]
        for event in events:
            if routes:
                self.emit(routes, PresenceChange(plain or None, event.event, event.actor_id, event.data,
                                                 event.joined_at), DELIVER_EVENT)
            for lobby_id, located in listeners:
                self.emit(group_by_gateway(located),
                          LobbyChange(lobby_id, plain, event.event, event.actor_id, event.data), DELIVER_EVENT)

    # -- lobbies --------------------------------------------------------------------------

    def lobby_subscribe(self, gateway_id: str, lobby_id: str, spec: LobbySpec, connection_id: int,
                        listen: bool) -> dict[str, dict[str, Any]]:
        project, rooms, prefix = spec
        lobby = Lobby(lobby_id, None if rooms is None else frozenset(rooms), prefix)
        if listen:
            _, listeners = self.lobby_listeners.setdefault((project, lobby_id), (lobby, set()))
            listeners.add((gateway_id, connection_id))
        snapshot: dict[str, dict[str, Any]] = {}
        for room in self.presence.rooms():
            _, room_project, plain = room.split("/", 2)
            if room_project == project and lobby.contains(plain):
                snapshot[plain] = {entry["actorTokenId"]: entry["presence"] for entry in self.presence.list(room)}
        return snapshot

    def lobby_unsubscribe(self, gateway_id: str, lobby_id: str, connection_id: int) -> bool:
        for (project, listened), (lobby, located) in list(self.lobby_listeners.items()):
            if listened == lobby_id:
                located.discard((gateway_id, connection_id))
                if not located:
                    del self.lobby_listeners[(project, listened)]
        return True

    # -- hooks ----------------------------------------------------------------------------

    def before_batch(self) -> None:
        now = self.now
        if not self._stamps_pruned_at <= now < self._stamps_pruned_at + STAMPS_PRUNED_EVERY_MS:
            self._stamps_pruned_at = now  # also when the clock stepped back
            horizon = now - STAMPS_KEPT_MS
            # a new dict: deleting keys never shrinks one
            self._topic_ts = {key: ts for key, ts in self._topic_ts.items() if ts >= horizon}

    def stats(self) -> dict[str, Any]:
        return {"nolag_topic_stamps": len(self._topic_ts)}

    def _locations(self) -> set[Location]:
        """Every connection this component holds anything of, in any of its indexes."""
        held = set(self.subscriptions.locations())
        held.update(self.presence.locations())
        for members in self.room_members.values():
            held.update(members)
        for _, located in self.lobby_listeners.values():
            held.update(located)
        return held

    def purge_connection(self, location: Location) -> None:
        self.subscriptions.purge_connection(location)
        gateway_id, connection_id = location
        for room in [room for room, members in self.room_members.items() if location in members]:
            self.room(gateway_id, room, connection_id, False)
        for room, event in self.presence.purge_connection(location):
            self._presence_out(room, [event])
        for key, (lobby, located) in list(self.lobby_listeners.items()):
            located.discard(location)
            if not located:
                del self.lobby_listeners[key]

    def purge_gateway(self, gateway_id: str) -> int:
        gone = [location for location in self._locations() if location[0] == gateway_id]
        for location in sorted(gone):
            self.purge_connection(location)
        return len(gone)

    def after_batch(self) -> None:
        if self._log_pending:
            try:
                self.message_log.append_many(self._log_pending)  # before the results leave: a published message is kept
            except Exception:
                # Delivered live already; kept here and stored with a later batch, so a failed
                # write (disk full, a locked file) loses nothing from the replay log.
                backlog = self._log_pending
                if len(backlog) > MAX_LOG_BACKLOG:
                    logger.error("%s: message log failing; %d logged message(s) dropped from the backlog",
                                 self.shard.name, len(backlog) - MAX_LOG_BACKLOG)
                    del backlog[:-MAX_LOG_BACKLOG]
                logger.exception("%s: message log write failed; %d message(s) kept for the next batch",
                                 self.shard.name, len(backlog))
            else:
                self._log_pending = []
        now = self.now
        if self._log is not None and now >= self._next_prune:
            self._next_prune = now + PRUNE_EVERY_MS
            self._log.prune(now)


class NolagActors(Component):
    """Each NoLag actor's subscriptions, replay positions and QoS 2 ids, kept while it is away."""

    name = "nolag"

    def __init__(self, shard: Any) -> None:
        super().__init__(shard)
        self.actors: dict[str, ActorState] = {}

    def operations(self) -> dict[str, Handler]:
        return {
            Op.ACTOR_RESET: self.reset,
            Op.ACTOR_GET: self.get,
            Op.ACTOR_SAVE: self.save,
            Op.ACTOR_CHECKPOINT: self.checkpoint,
            Op.ACTOR_LEAVE: self.leave,
        }

    def _state(self, actor: str) -> ActorState:
        state = self.actors.get(actor)
        if state is None:
            state = self.actors[actor] = ActorState({}, {}, [])
        return state

    def reset(self, gateway_id: str, actor: str) -> bool:
        self.actors[actor] = ActorState({}, {}, [])
        return True

    def get(self, gateway_id: str, actor: str) -> ActorState | None:
        state = self.actors.get(actor)
        if state is None:
            return None
        return ActorState(dict(state.subscriptions), dict(state.resume), list(state.seen))

    def save(self, gateway_id: str, actor: str, topic: str, record: SubscriptionRecord | None,
             position: int | None) -> bool:
        state = self._state(actor)
        if record is None:
            state.subscriptions.pop(topic, None)
            state.resume.pop(topic, None)
        else:
            state.subscriptions[topic] = record
            if position is not None:
                state.resume.setdefault(topic, position)
        return True

    def checkpoint(self, gateway_id: str, actor: str, resume: dict[str, int]) -> bool:
        state = self.actors.get(actor)
        if state is not None:
            state.resume.update({topic: ts for topic, ts in resume.items() if topic in state.subscriptions})
        return True

    def leave(self, gateway_id: str, actor: str, resume: dict[str, int], seen: list[str]) -> bool:
        self.checkpoint(gateway_id, actor, resume)
        state = self.actors.get(actor)
        if state is not None:
            kept = (state.seen + seen)[-MAX_SEEN:]
            self.actors[actor] = state._replace(seen=kept)
        return True

    def stats(self) -> dict[str, Any]:
        return {"nolag_actors": len(self.actors)}


# What NoLag adds to which shard kind (the dialect table reads it).
COMPONENTS = {TOPIC: (NolagTopics,), SESSION: (NolagActors,)}
