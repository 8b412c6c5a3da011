"""What a session shard keeps of each NoLag actor, durable.

An actor's kept state (:class:`Actor`): its subscriptions, per topic the replay positions (the
last message written to it, and the floor just before the oldest one it had not acked), whether
it has shown it acks, and the QoS 2 ids it has had. The session shard changes it in memory and
appends each change to an ordered list; :meth:`ActorStore.commit` writes that list in one
transaction in ``after_batch``, before the batch's results leave the shard, so whatever a gateway
was answered (a QoS 2 id recorded before its write above all) survives a ``kill -9`` of the shard.
A restarted shard reloads the actors it owns with :meth:`ActorStore.load`.

:func:`open_actor_store` picks the store: SQLite at ``<data_dir>/nolag-actors.sqlite3``, one file
for every session shard of the machine (WAL: a writer waits for another), or with ``store.url``
the tables ``nolag_actors``, ``nolag_subscriptions`` and ``nolag_seen`` of the PostgreSQL database
every node shares, so a session shard restarted on another node has its actors back. Either way
each actor's rows are written by the one shard that owns its key.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from psycopg_pool import ConnectionPool

from actors.nolag.contract import SubscriptionRecord
from router.pgtext import from_text, to_text
from router.postgres import create_schema, pool_of, transaction
from router.sqlite import open_wal, write_transaction


@dataclass(slots=True)
class Actor:
    subscriptions: dict[str, SubscriptionRecord] = field(default_factory=dict)  # topic -> record
    resume: dict[str, int] = field(default_factory=dict)  # topic -> the last message written to the actor
    floors: dict[str, int] = field(default_factory=dict)  # topic -> just before its oldest unacked message
    seen: OrderedDict[str, tuple[str, int]] = field(default_factory=OrderedDict)  # QoS 2 id -> (topic, ts)
    acks: bool = False  # it has sent an ack or batchAck: it is replayed from its floors


# The changes a batch made, in order: ("reset", actor) | ("acks", actor, acks) | ("sub", actor, topic)
# (the row as the state holds it when committed; gone from the state: deleted) | ("seen", actor, msg_id,
# topic, ts) | ("unseen", actor, msg_id)
Change = tuple


class ActorStore(ABC):
    @abstractmethod
    def load(self, owned: Callable[[str], bool]) -> dict[str, Actor]:
        """Every actor ``owned`` says belongs to this shard, as last committed."""

    @abstractmethod
    def commit(self, actors: dict[str, Actor], changes: list[Change]) -> None:
        """Write ``changes`` in order, in one transaction (all or none)."""

    def close(self) -> None:
        pass


def _statements(actors: dict[str, Actor], changes: list[Change]) -> list[tuple[str, tuple]]:
    """The writes of ``changes``, in order, as (statement name, parameters); ValueError on an
    unknown change, before anything is written."""
    writes: list[tuple[str, tuple]] = []
    for change in changes:
        kind, actor = change[0], change[1]
        if kind == "reset":
            writes += [("delete_subscriptions", (actor,)), ("delete_seen", (actor,)), ("delete_actor", (actor,))]
        elif kind == "acks":
            writes.append(("set_acks", (actor, int(change[2]))))
        elif kind == "sub":
            topic = change[2]
            state = actors.get(actor)
            record = None if state is None else state.subscriptions.get(topic)
            if record is None:
                writes.append(("delete_subscription", (actor, topic)))
                continue
            writes.append(("add_actor", (actor, int(state.acks))))
            writes.append(("put_subscription", (actor, topic, record.qos, json.dumps(list(record.filters)),
                                                int(record.load_balance), record.group, state.resume.get(topic),
                                                state.floors.get(topic))))
        elif kind == "seen":
            writes.append(("add_seen", (actor, *change[2:])))
        elif kind == "unseen":
            writes.append(("delete_one_seen", (actor, change[2])))
        else:
            raise ValueError(f"unknown change {kind!r}")
    return writes


def _runs(writes: list[tuple[str, tuple]]) -> list[tuple[str, list[tuple]]]:
    """Consecutive writes of one statement together (one ``executemany`` each), order kept."""
    runs: list[tuple[str, list[tuple]]] = []
    for name, parameters in writes:
        if runs and runs[-1][0] == name:
            runs[-1][1].append(parameters)
        else:
            runs.append((name, [parameters]))
    return runs


def _sql(actors: str, subscriptions: str, seen: str, mark: str) -> dict[str, str]:
    """The writes of a commit over these table names, with this placeholder."""
    def marks(count: int) -> str:
        return ", ".join([mark] * count)

    return {
        "delete_subscriptions": f"DELETE FROM {subscriptions} WHERE actor = {mark}",
        "delete_seen": f"DELETE FROM {seen} WHERE actor = {mark}",
        "delete_actor": f"DELETE FROM {actors} WHERE actor = {mark}",
        "set_acks": f"INSERT INTO {actors} (actor, acks) VALUES ({marks(2)}) "
                    "ON CONFLICT (actor) DO UPDATE SET acks = excluded.acks",
        "delete_subscription": f"DELETE FROM {subscriptions} WHERE actor = {mark} AND topic = {mark}",
        "add_actor": f"INSERT INTO {actors} (actor, acks) VALUES ({marks(2)}) ON CONFLICT (actor) DO NOTHING",
        "put_subscription": f"INSERT INTO {subscriptions} (actor, topic, qos, filters, load_balance, grp, resume, "
                            f"floor) VALUES ({marks(8)}) ON CONFLICT (actor, topic) DO UPDATE SET qos = excluded.qos, "
                            "filters = excluded.filters, load_balance = excluded.load_balance, grp = excluded.grp, "
                            "resume = excluded.resume, floor = excluded.floor",
        "add_seen": f"INSERT INTO {seen} (actor, msg_id, topic, ts_ms) VALUES ({marks(4)}) "
                    "ON CONFLICT (actor, msg_id) DO NOTHING",
        "delete_one_seen": f"DELETE FROM {seen} WHERE actor = {mark} AND msg_id = {mark}",
    }


def _loaded(actor_rows: list, subscription_rows: list, seen_rows: list,
            owned: Callable[[str], bool]) -> dict[str, Actor]:
    actors: dict[str, Actor] = {}
    for actor, acks in actor_rows:
        if owned(actor):
            actors[actor] = Actor(acks=bool(acks))
    for actor, topic, qos, filters, load_balance, group, resume, floor in subscription_rows:
        state = actors.get(actor)
        if state is None:
            continue
        state.subscriptions[topic] = SubscriptionRecord(qos, tuple(json.loads(filters)), bool(load_balance), group)
        if resume is not None:
            state.resume[topic] = resume
        if floor is not None:
            state.floors[topic] = floor
    for actor, msg_id, topic, ts_ms in seen_rows:  # in the order they were recorded
        state = actors.get(actor)
        if state is not None:
            state.seen[msg_id] = (topic, ts_ms)
    return actors


_SQLITE = _sql("actors", "subscriptions", "seen", "?")
_POSTGRES = _sql("nolag_actors", "nolag_subscriptions", "nolag_seen", "%s")


class SqliteActorStore(ActorStore):
    def __init__(self, path: Path) -> None:
        self.path = path
        self._db = open_wal(path)
        self._db.executescript(
            "CREATE TABLE IF NOT EXISTS actors (actor TEXT PRIMARY KEY, acks INTEGER NOT NULL);"
            "CREATE TABLE IF NOT EXISTS subscriptions (actor TEXT NOT NULL, topic TEXT NOT NULL, qos INTEGER NOT NULL, "
            "filters TEXT NOT NULL, load_balance INTEGER NOT NULL, grp TEXT, resume INTEGER, floor INTEGER, "
            "PRIMARY KEY (actor, topic));"
            "CREATE TABLE IF NOT EXISTS seen (seq INTEGER PRIMARY KEY AUTOINCREMENT, actor TEXT NOT NULL, "
            "msg_id TEXT NOT NULL, topic TEXT NOT NULL, ts_ms INTEGER NOT NULL, UNIQUE (actor, msg_id));"
        )

    def load(self, owned: Callable[[str], bool]) -> dict[str, Actor]:
        db = self._db
        return _loaded(db.execute("SELECT actor, acks FROM actors").fetchall(),
                       db.execute("SELECT actor, topic, qos, filters, load_balance, grp, resume, floor "
                                  "FROM subscriptions").fetchall(),
                       db.execute("SELECT actor, msg_id, topic, ts_ms FROM seen ORDER BY seq").fetchall(), owned)

    def commit(self, actors: dict[str, Actor], changes: list[Change]) -> None:
        runs = _runs(_statements(actors, changes))
        with write_transaction(self._db) as db:
            for name, rows in runs:
                db.executemany(_SQLITE[name], rows)

    def close(self) -> None:
        self._db.close()


class PostgresActorStore(ActorStore):
    """The actors of every node's session shards in one database. ``close`` leaves the process's
    pool open (other stores share it)."""

    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool
        create_schema(pool, "nolag_actors", [
            "CREATE TABLE IF NOT EXISTS nolag_actors (actor TEXT PRIMARY KEY, acks INTEGER NOT NULL)",
            "CREATE TABLE IF NOT EXISTS nolag_subscriptions (actor TEXT NOT NULL, topic TEXT NOT NULL, "
            "qos INTEGER NOT NULL, filters TEXT NOT NULL, load_balance INTEGER NOT NULL, grp TEXT, resume BIGINT, "
            "floor BIGINT, PRIMARY KEY (actor, topic))",
            "CREATE TABLE IF NOT EXISTS nolag_seen (seq BIGSERIAL PRIMARY KEY, actor TEXT NOT NULL, "
            "msg_id TEXT NOT NULL, topic TEXT NOT NULL, ts_ms BIGINT NOT NULL, UNIQUE (actor, msg_id))",
        ])

    def load(self, owned: Callable[[str], bool]) -> dict[str, Actor]:
        with self._pool.connection() as db:
            return _loaded(*(_from_text(db.execute(query).fetchall()) for query in (
                "SELECT actor, acks FROM nolag_actors",
                "SELECT actor, topic, qos, filters, load_balance, grp, resume, floor FROM nolag_subscriptions",
                "SELECT actor, msg_id, topic, ts_ms FROM nolag_seen ORDER BY seq")), owned)

    def commit(self, actors: dict[str, Actor], changes: list[Change]) -> None:
        # actor names, groups and QoS 2 ids come from clients: text without NUL (router/pgtext.py)
        runs = [(name, [tuple(to_text(value) if type(value) is str else value for value in row) for row in rows])
                for name, rows in _runs(_statements(actors, changes))]
        if not runs:
            return
        # pipelined: the writes go out without waiting for each other, answered together at the end
        with transaction(self._pool) as db, db.pipeline(), db.cursor() as cursor:
            for name, rows in runs:
                cursor.executemany(_POSTGRES[name], rows)


def _from_text(rows: list[tuple]) -> list[tuple]:
    return [tuple(from_text(value) if type(value) is str else value for value in row) for row in rows]


def open_actor_store(settings) -> ActorStore:
    """The actor store ``settings`` name: PostgreSQL with ``store.url``, else
    ``<data_dir>/nolag-actors.sqlite3``."""
    if settings.store.postgres is not None:
        return PostgresActorStore(pool_of(settings.store))
    return SqliteActorStore(settings.data_dir / "nolag-actors.sqlite3")
