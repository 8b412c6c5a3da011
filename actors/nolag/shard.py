"""NoLag's parts of the shards: topics, rooms and lobbies (topic shards); actors (session shards).

Topic shards hold the topics (``nolag/<project>/<topic>``: subscribers with filters, QoS and
load-balance groups, and the message log), the rooms (``nolag-room/<project>/<room>``: presence,
and which connections are in the room) and lobby listeners. A connection's state is spread over
several shards (its topics and its rooms hash apart), so every hook scans every index of this
component: a purge that looked only at rooms left subscriptions behind as ghosts that still won
load-balanced turns.

Session shards hold what each actor keeps while away (``NolagActors``), durable in its store
(SQLite or PostgreSQL). A topic shard that Ray restarted gets its subscriptions, rooms, presence and lobby listeners back
from the gateways (``docs/nolag.md``, "Restarts and failures"); a re-announced subscription is
caught up from the log with what this incarnation stamped after the last message it got.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

from actors.nolag.actorstore import Actor, ActorStore, Change, open_actor_store
from actors.nolag.contract import (ActorState, LobbyChange, LobbySpec, LoggedMessage, Op, PresenceChange,
                                   SubscriptionRecord, actor_key, message, topic_of)
from actors.nolag.keys import pattern_matches
from actors.nolag.messagelog import LogRecord, MessageLog, open_message_log
from actors.nolag.state import Lobby, Presence, Subscriptions
from actors.shard import Component, Handler
from router.contract import DELIVER_EVENT, Location, group_by_gateway
from router.shardmap import SESSION, TOPIC, shard_index

logger = logging.getLogger(__name__)

PRUNE_EVERY_MS = 60_000
# A topic's last stamp matters only while the clock could still be at or below it (a burst runs
# stamps ahead of the clock; a wall clock may step back a little): older ones are dropped, so the
# map does not keep every topic a client ever named.
STAMPS_KEPT_MS = 5_000
# For this long after a (re)start a topic shard remembers which connection each logged message
# excluded (echo: false): a subscription re-announced meanwhile is caught up without its own messages.
CATCH_UP_WINDOW_MS = 60_000
# ... and of those, a topic's first ``nolag.max_replay`` (what one catch-up from the start delivers
# at most; all of them for a topic kept less than that minute, whose first ones a prune may take)
# and this many in all: a publisher's stream in that minute is not kept whole in memory.
EXCLUDED_MAX = 100_000
_UNCAPPED = -1  # in _excluded_in: a topic whose exclusions are not capped at max_replay
STAMPS_PRUNED_EVERY_MS = 1_000
MAX_SEEN = 10_000  # QoS 2 ids kept per actor (those at or below the topic's floor go first)
# Logged messages kept in memory while the message log cannot store them (retried every batch);
# beyond this the oldest are dropped, and said so.
MAX_LOG_BACKLOG = 100_000
MAX_ACTOR_BACKLOG = 100_000  # actor changes kept while the actor store cannot write them


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
        self._started_ms = self.now  # this incarnation's first stamp is no earlier
        self._groups_caught_up: set[tuple[str, str]] = set()  # (topic key, group) re-announced here
        self._excluded: dict[str, Location] | None = {}  # msg id -> its sender (echo: false), for a while
        self._excluded_in: dict[str, int] = {}  # topic key -> how many of its messages _excluded holds

    def operations(self) -> dict[str, Handler]:
        return {
            Op.SUBSCRIBE: self.subscribe,
            Op.UNSUBSCRIBE: self.unsubscribe,
            Op.SET_FILTERS: self.set_filters,
            Op.PUBLISH: self.publish,
            Op.LOG: self.logged,
            Op.ROOM: self.room,
            Op.PRESENCE: self.set_presence,
            Op.PRESENCE_RESTORE: self.restore_presence,
            Op.PRESENCE_LIST: self.presence_list,
            Op.LOBBY_SUBSCRIBE: self.lobby_subscribe,
            Op.LOBBY_UNSUBSCRIBE: self.lobby_unsubscribe,
        }

    # -- the message log ------------------------------------------------------------------

    @property
    def message_log(self) -> MessageLog:
        if self._log is None:
            self._log = open_message_log(self.settings, self._retention_ms)
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
                  qos: int, group: str | None, after_ms: int | None) -> int:
        self.subscriptions.subscribe(key, (gateway_id, connection_id), filters, qos, group)
        if after_ms is not None:
            self._catch_up(gateway_id, key, connection_id, filters, group, after_ms)
        # Without a stamp kept, every message so far is older than now and the next is stamped now or later.
        return self._topic_ts.get(key, self.now - 1)

    def _catch_up(self, gateway_id: str, key: str, connection_id: int, filters: tuple[str, ...], group: str | None,
                  after_ms: int) -> None:
        """A subscription re-announced after this shard restarted: deliver the messages this
        incarnation logged after the last one the connection got, published before the re-announce
        reached it (those of the previous incarnation were delivered by it; one whose publish
        met the crash was not confirmed to its sender). Its own messages sent with ``echo: false``
        are left out; of a load-balance group, only the first member re-announced catches up."""
        if group is not None:
            if (key, group) in self._groups_caught_up:
                return
            self._groups_caught_up.add((key, group))
        location = (gateway_id, connection_id)
        excluded = self._excluded or {}
        topic = topic_of(key)
        routes = {gateway_id: [connection_id]}
        for record in self._logged_after(key, max(after_ms, self._started_ms - 1), self.settings.nolag.max_replay):
            if filters and (record.filter is None or record.filter not in filters):
                continue
            if excluded.get(record.msg_id) == location:
                continue
            self.emit(routes, message(topic, record.data_packed, record.msg_id, record.qos, record.filter,
                                      record.ts_ms, "", None), DELIVER_EVENT)

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
            if exclude is not None and self._excluded is not None:
                self._exclude(key, msg_id, (gateway_id, exclude))
        routes, count = self._routes(key, filter_, gateway_id, exclude)
        if count:
            self.emit(routes, message(topic, packed, msg_id, qos, filter_, ts_ms, sender, meta), DELIVER_EVENT)
        return count

    def _exclude(self, key: str, msg_id: str, sender: Location) -> None:
        """Remember that ``msg_id`` (of topic ``key``) is not for its sender's connection, for a
        catch-up (:meth:`_catch_up`): up to the topic's first ``max_replay`` (a catch-up from this
        incarnation's start reads no further) and ``EXCLUDED_MAX`` in all. A topic whose messages
        are kept less than the catch-up window is not capped at ``max_replay``: a prune may take
        its first ones, and a catch-up then reads later ones. A catch-up from a position within
        this incarnation's own stamps can reach past what was kept: the sender's own message is
        then caught up to it too."""
        held = self._excluded_in.get(key)
        if held is None:
            held = 0 if self._retention_ms(key) >= CATCH_UP_WINDOW_MS else _UNCAPPED
        if held >= self.settings.nolag.max_replay or len(self._excluded) >= EXCLUDED_MAX:
            return
        self._excluded_in[key] = held if held == _UNCAPPED else held + 1
        self._excluded[msg_id] = sender

    def _routes(self, key: str, filter_: str | None, gateway_id: str, exclude: int | None) -> tuple[dict, int]:
        """Who gets a publish, as fan-out routes, and how many. An unfiltered publish to a topic
        without load-balance groups goes to every wildcard subscriber: those routes are kept until
        the topic's subscriptions change (a publish no longer walks its subscribers twice), and
        ``exclude`` (``echo: false``) is cut out of its gateway's tuple."""
        plain = None if filter_ is not None else self.subscriptions.memo(key, partial(self._plain_routes, key))
        if plain is None:  # filtered, or load-balance groups taking turns: walked each time
            return self._walk(key, filter_, None if exclude is None else (gateway_id, exclude))
        routes, count, members = plain
        if exclude is not None:
            present = members.get(gateway_id)  # a set: not a scan of the tuple at every publish
            if present is not None and exclude in present:
                ids = routes[gateway_id]
                at = ids.index(exclude)
                routes = dict(routes)
                rest = ids[:at] + ids[at + 1:]
                if rest:
                    routes[gateway_id] = rest
                else:
                    del routes[gateway_id]
                count -= 1
        return routes, count

    def _plain_routes(self, key: str) -> tuple[dict, int, dict] | None:
        """The routes of an unfiltered publish to ``key`` excluding nobody, their count and each
        gateway's connections as a set (None: the topic has load-balance groups)."""
        if self.subscriptions.has_groups(key):
            return None
        routes, count = self._walk(key, None, None)
        return routes, count, {gateway_id: frozenset(ids) for gateway_id, ids in routes.items()}

    def _walk(self, key: str, filter_: str | None, exclude: Location | None) -> tuple[dict, int]:
        chosen = self.subscriptions.route(key, filter_, exclude)
        return group_by_gateway(chosen), len(chosen)

    def logged(self, gateway_id: str, key: str, after_ms: int, limit: int) -> list[LoggedMessage]:
        topic = topic_of(key)
        return [LoggedMessage(topic, r.msg_id, r.ts_ms, r.data_packed, r.qos, r.filter)
                for r in self._logged_after(key, after_ms, limit)]

    def _logged_after(self, key: str, after_ms: int, limit: int) -> list[LogRecord]:
        """The topic's logged messages after ``after_ms``, with those of this batch (or a failed
        write) not yet stored."""
        records = self.message_log.since([key], after_ms, limit)
        pending = [r for r in self._log_pending if r.topic == key and r.ts_ms > after_ms]
        if pending:
            stored = {r.msg_id for r in records}
            records = sorted(records + [r for r in pending if r.msg_id not in stored], key=lambda r: r.ts_ms)[:limit]
        return records

    # -- rooms and presence ---------------------------------------------------------------

    def room(self, gateway_id: str, room: str, connection_id: int, join: bool) -> bool:
        members = self.room_members.setdefault(room, set())
        (members.add if join else members.discard)((gateway_id, connection_id))
        if not members:
            del self.room_members[room]
        return True

    def set_presence(self, gateway_id: str, room: str, connection_id: int, actor: str, data: Any,
                     now: int) -> int | None:
        location = (gateway_id, connection_id)
        events = self.presence.set(room, actor, location, data, now)
        self._presence_out(room, events, extra=location)
        return events[-1].joined_at if events and events[-1].event != "leave" else None

    def restore_presence(self, gateway_id: str, room: str, connection_id: int, actor: str, data: Any,
                         joined_at: int) -> bool:
        """Quiet: the members and lobby listeners heard of this presence before the shard restarted."""
        return self.presence.restore(room, actor, (gateway_id, connection_id), data, joined_at)

    def presence_list(self, gateway_id: str, room: str) -> list[dict[str, Any]]:
        return self.presence.list(room)

    def _presence_out(self, room: str, events: list, extra: Location | None = None) -> None:
        """Presence events to the room's members and the actors present in it (and the actor
        itself), lobby events to listeners."""
        if not events:
            return
        _, project, plain = room.split("/", 2)
        members = set(self.room_members.get(room, ()))
        members.update(self.presence.locations_in(room))  # present without a subscription: the SDK's rooms
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
        if self._excluded is not None and now > self._started_ms + CATCH_UP_WINDOW_MS:
            self._excluded = None
            self._excluded_in = {}
        if not self._stamps_pruned_at <= now < self._stamps_pruned_at + STAMPS_PRUNED_EVERY_MS:
            self._stamps_pruned_at = now  # also when the clock stepped back
            horizon = now - STAMPS_KEPT_MS
            # a new dict: deleting keys never shrinks one
            self._topic_ts = {key: ts for key, ts in self._topic_ts.items() if ts >= horizon}

    def stats(self) -> dict[str, Any]:
        return {"nolag_topic_stamps": len(self._topic_ts)}

    def restore(self) -> None:
        """Stamps stay strictly increasing per topic across a restart: the log's last stamps that
        the clock may not have passed yet (a burst runs ahead of it) are this shard's again."""
        horizon = self.now - STAMPS_KEPT_MS
        count, index = self.settings.shards.topic, self.shard.index
        self._topic_ts = {key: ts for key, ts in self.message_log.last_stamps(horizon).items()
                          if shard_index(key, count) == index}

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
            try:
                self._log.prune(now)
            except Exception:  # housekeeping: the batch's results stand; tried again next time
                logger.exception("%s: pruning the message log failed", self.shard.name)


class NolagActors(Component):
    """Each NoLag actor's subscriptions, replay positions, whether it acks and its QoS 2 ids, kept
    while it is away: in memory, and in the actor store (``actors/nolag/actorstore.py``) committed in
    ``after_batch`` before the batch's results leave, reloaded by ``restore()``."""

    name = "nolag"

    def __init__(self, shard: Any) -> None:
        super().__init__(shard)
        self.actors: dict[str, Actor] = {}
        self._store: ActorStore | None = None
        self._changes: list[Change] = []
        self._changed_subs: set[tuple[str, str]] = set()  # (actor, topic) with a "sub" change pending

    def operations(self) -> dict[str, Handler]:
        return {
            Op.ACTOR_RESET: self.reset,
            Op.ACTOR_GET: self.get,
            Op.ACTOR_SAVE: self.save,
            Op.ACTOR_CHECKPOINT: self.checkpoint,
            Op.ACTOR_SEEN: self.seen,
            Op.ACTOR_UNSEEN: self.unseen,
        }

    @property
    def store(self) -> ActorStore:
        if self._store is None:
            self._store = open_actor_store(self.settings)
        return self._store

    def _state(self, actor: str) -> Actor:
        state = self.actors.get(actor)
        if state is None:
            state = self.actors[actor] = Actor()
        return state

    def _sub_changed(self, actor: str, topic: str) -> None:
        if (actor, topic) not in self._changed_subs:
            self._changed_subs.add((actor, topic))
            self._changes.append(("sub", actor, topic))

    def reset(self, gateway_id: str, actor: str) -> bool:
        self.actors[actor] = Actor()
        self._changed_subs = {pair for pair in self._changed_subs if pair[0] != actor}
        self._changes.append(("reset", actor))
        return True

    def get(self, gateway_id: str, actor: str) -> ActorState | None:
        state = self.actors.get(actor)
        if state is None:
            return None
        return ActorState(dict(state.subscriptions), dict(state.resume), dict(state.floors), list(state.seen),
                          state.acks)

    def save(self, gateway_id: str, actor: str, topic: str, record: SubscriptionRecord | None,
             position: int | None) -> bool:
        state = self._state(actor)
        if record is None:
            state.subscriptions.pop(topic, None)
            state.resume.pop(topic, None)
            state.floors.pop(topic, None)
        else:
            state.subscriptions[topic] = record
            if position is not None:
                state.resume.setdefault(topic, position)
                state.floors.setdefault(topic, position)
        self._sub_changed(actor, topic)
        return True

    def checkpoint(self, gateway_id: str, actor: str, resume: dict[str, int], floors: dict[str, int],
                   acks: bool) -> bool:
        state = self.actors.get(actor)
        if state is None:
            return True
        subscribed = state.subscriptions
        for topic, position in resume.items():
            if topic in subscribed:
                state.resume[topic] = position
                state.floors[topic] = min(floors.get(topic, position), position)
                self._sub_changed(actor, topic)
        if acks and not state.acks:
            state.acks = True
            self._changes.append(("acks", actor, True))
        # QoS 2 ids at or below their topic's floor are never replayed again: forgotten, oldest first
        seen = state.seen
        while seen:
            msg_id, (topic, ts_ms) = next(iter(seen.items()))
            if topic in subscribed and ts_ms > state.floors.get(topic, ts_ms):
                break
            del seen[msg_id]
            self._changes.append(("unseen", actor, msg_id))
        return True

    def seen(self, gateway_id: str, actor: str, records: tuple[tuple[str, str, int], ...]) -> bool:
        state = self._state(actor)
        seen = state.seen
        for msg_id, topic, ts_ms in records:
            if msg_id not in seen:
                seen[msg_id] = (topic, ts_ms)
                self._changes.append(("seen", actor, msg_id, topic, ts_ms))
        while len(seen) > MAX_SEEN:
            msg_id, _ = seen.popitem(last=False)
            self._changes.append(("unseen", actor, msg_id))
        return True

    def unseen(self, gateway_id: str, actor: str, msg_ids: tuple[str, ...]) -> bool:
        state = self.actors.get(actor)
        if state is not None:
            for msg_id in msg_ids:
                if state.seen.pop(msg_id, None) is not None:
                    self._changes.append(("unseen", actor, msg_id))
        return True

    def after_batch(self) -> None:
        if not self._changes:
            return
        changes = self._changes
        if len(changes) > MAX_ACTOR_BACKLOG:
            logger.error("%s: actor store failing; %d change(s) dropped", self.shard.name,
                         len(changes) - MAX_ACTOR_BACKLOG)
            del changes[:-MAX_ACTOR_BACKLOG]
        # On a failure the changes stay and go with the next batch (the memory is the newer truth);
        # the base answers this batch's commands with an error, so nothing unstored is confirmed.
        self.store.commit(self.actors, changes)
        self._changes = []
        self._changed_subs = set()

    def restore(self) -> None:
        count, index = self.settings.shards.session, self.shard.index
        self.actors = self.store.load(lambda actor: shard_index(actor_key(actor), count) == index)

    def stats(self) -> dict[str, Any]:
        return {"nolag_actors": len(self.actors)}


# What NoLag adds to which shard kind (the dialect table reads it).
COMPONENTS = {TOPIC: (NolagTopics,), SESSION: (NolagActors,)}
