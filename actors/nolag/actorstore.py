"""What a session shard keeps of each NoLag actor, durable: SQLite at ``<data_dir>/nolag-actors.sqlite3``.

An actor's kept state (:class:`Actor`): its subscriptions, per topic the replay positions (the
last message written to it, and the floor just before the oldest one it had not acked), whether
it has shown it acks, and the QoS 2 ids it has had. The session shard changes it in memory and
appends each change to an ordered list; :meth:`ActorStore.commit` writes that list in one
transaction in ``after_batch``, before the batch's results leave the shard, so whatever a gateway
was answered (a QoS 2 id recorded before its write above all) survives a ``kill -9`` of the shard.
A restarted shard reloads the actors it owns with :meth:`ActorStore.load`.

One file for every session shard of the machine (WAL: a writer waits for another); each actor's
rows are written by the one shard that owns its key.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from actors.nolag.contract import SubscriptionRecord
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


class ActorStore:
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
        """Every actor ``owned`` says belongs to this shard, as last committed."""
        db = self._db
        actors: dict[str, Actor] = {}
        for actor, acks in db.execute("SELECT actor, acks FROM actors").fetchall():
            if owned(actor):
                actors[actor] = Actor(acks=bool(acks))
        for actor, topic, qos, filters, load_balance, group, resume, floor in db.execute(
                "SELECT actor, topic, qos, filters, load_balance, grp, resume, floor FROM subscriptions"):
            state = actors.get(actor)
            if state is None:
                continue
            state.subscriptions[topic] = SubscriptionRecord(qos, tuple(json.loads(filters)), bool(load_balance), group)
            if resume is not None:
                state.resume[topic] = resume
            if floor is not None:
                state.floors[topic] = floor
        for actor, msg_id, topic, ts_ms in db.execute("SELECT actor, msg_id, topic, ts_ms FROM seen ORDER BY seq"):
            state = actors.get(actor)
            if state is not None:
                state.seen[msg_id] = (topic, ts_ms)
        return actors

    def commit(self, actors: dict[str, Actor], changes: list[Change]) -> None:
        """Write ``changes`` in order, in one transaction (all or none)."""
        with write_transaction(self._db) as db:
            for change in changes:
                kind, actor = change[0], change[1]
                if kind == "reset":
                    db.execute("DELETE FROM subscriptions WHERE actor = ?", (actor,))
                    db.execute("DELETE FROM seen WHERE actor = ?", (actor,))
                    db.execute("DELETE FROM actors WHERE actor = ?", (actor,))
                elif kind == "acks":
                    db.execute("INSERT INTO actors (actor, acks) VALUES (?, ?) "
                               "ON CONFLICT (actor) DO UPDATE SET acks = excluded.acks", (actor, int(change[2])))
                elif kind == "sub":
                    topic = change[2]
                    state = actors.get(actor)
                    record = None if state is None else state.subscriptions.get(topic)
                    if record is None:
                        db.execute("DELETE FROM subscriptions WHERE actor = ? AND topic = ?", (actor, topic))
                        continue
                    db.execute("INSERT INTO actors (actor, acks) VALUES (?, ?) ON CONFLICT (actor) DO NOTHING",
                               (actor, int(state.acks)))
                    db.execute(
                        "INSERT INTO subscriptions (actor, topic, qos, filters, load_balance, grp, resume, floor) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (actor, topic) DO UPDATE SET qos = excluded.qos, "
                        "filters = excluded.filters, load_balance = excluded.load_balance, grp = excluded.grp, "
                        "resume = excluded.resume, floor = excluded.floor",
                        (actor, topic, record.qos, json.dumps(list(record.filters)), int(record.load_balance),
                         record.group, state.resume.get(topic), state.floors.get(topic)))
                elif kind == "seen":
                    db.execute("INSERT INTO seen (actor, msg_id, topic, ts_ms) VALUES (?, ?, ?, ?) "
                               "ON CONFLICT (actor, msg_id) DO NOTHING", (actor, *change[2:]))
                elif kind == "unseen":
                    db.execute("DELETE FROM seen WHERE actor = ? AND msg_id = ?", (actor, change[2]))
                else:
                    raise ValueError(f"unknown change {kind!r}")

    def close(self) -> None:
        self._db.close()
