"""A session shard's NoLag actors are durable: what a batch changed is committed before its
results leave, and a shard built again over the same data (Ray restarted it) has it back.

Every test takes ``store_settings``: each runs with the actor store on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import sqlite3

import psycopg
import pytest

from actors.nolag import contract as nolag
from actors.nolag.actorstore import Actor, ActorStore, PostgresActorStore, SqliteActorStore, open_actor_store
from actors.nolag.contract import ActorState, SubscriptionRecord
from actors.nolag.shard import NolagActors
from actors.shard import Shard
from router.errors import CommandError
from router.settings import load_settings
from router.shardmap import SESSION, shard_index

A = "actor_a"
T = "chat/r/t"
U = "chat/r/u"
RECORD = SubscriptionRecord(2, ("f1", "f2"), True, "workers")


def build(store_settings, count: int = 1, index: int = 0) -> Shard:
    """A session shard over the store of ``store_settings`` (the same data every time)."""
    store = {} if store_settings.store.postgres is None else {"url": store_settings.store.postgres}
    settings = load_settings(data_dir=store_settings.data_dir, store=store, metrics={"enabled": False},
                             shards={"session": count})
    return Shard(SESSION, index, settings, (NolagActors,))


def ask(shard: Shard, *commands: tuple) -> list:
    return shard.handle("g", list(commands))[0]


def test_a_restarted_shard_has_every_committed_change_back(store_settings):
    shard = build(store_settings)
    assert ask(shard, nolag.actor_save(A, T, RECORD, 100), nolag.actor_save(A, U, SubscriptionRecord(1, (), False, None),
                                                                             200),
               nolag.actor_seen(A, (("q1", T, 101), ("q2", T, 102))),
               nolag.actor_checkpoint(A, {T: 110, U: 250, "x/y/z": 1}, {T: 101, U: 240}, True)) == [True] * 4
    again = build(store_settings)
    assert ask(again, nolag.actor_get(A)) == [ActorState(
        {T: RECORD, U: SubscriptionRecord(1, (), False, None)}, {T: 110, U: 250}, {T: 101, U: 240}, ["q2"], True)]
    # q1 (at 101) is at the floor: never replayed again, so forgotten; q2 (102) is above it


def test_unsubscribe_and_reset_are_durable_too(store_settings):
    shard = build(store_settings)
    ask(shard, nolag.actor_save(A, T, RECORD, 1), nolag.actor_save(A, U, RECORD, 2),
        nolag.actor_seen(A, (("q", U, 3),)))
    ask(shard, nolag.actor_save(A, T, None, None))
    assert ask(build(store_settings), nolag.actor_get(A)) == [ActorState({U: RECORD}, {U: 2}, {U: 2}, ["q"], False)]
    ask(shard, nolag.actor_reset(A), nolag.actor_save(A, T, RECORD, 5))  # reset, then a new subscription
    assert ask(build(store_settings), nolag.actor_get(A)) == [ActorState({T: RECORD}, {T: 5}, {T: 5}, [], False)]
    ask(shard, nolag.actor_reset(A))
    assert ask(build(store_settings), nolag.actor_get(A)) == [None]


def test_acks_once_seen_stays_until_a_reset(store_settings):
    shard = build(store_settings)
    ask(shard, nolag.actor_save(A, T, RECORD, 1), nolag.actor_checkpoint(A, {T: 2}, {T: 2}, True))
    ask(shard, nolag.actor_checkpoint(A, {T: 3}, {T: 3}, False))  # another connection, not acking (yet)
    assert ask(build(store_settings), nolag.actor_get(A))[0].acks is True


def test_each_shard_reloads_only_the_actors_it_owns(store_settings):
    actors = [f"actor_{n}" for n in range(20)]
    shards = [build(store_settings, 2, index) for index in (0, 1)]
    owners = {actor: shard_index(nolag.actor_key(actor), 2) for actor in actors}
    for actor, index in owners.items():
        ask(shards[index], nolag.actor_save(actor, T, RECORD, 1))
    for index in (0, 1):
        reloaded = build(store_settings, 2, index).component(NolagActors).actors
        assert set(reloaded) == {actor for actor, owner in owners.items() if owner == index}


def test_a_failed_commit_answers_errors_and_is_written_with_the_next_batch(store_settings):
    shard = build(store_settings)
    component = shard.component(NolagActors)
    real = component.store

    class Failing(ActorStore):
        def __init__(self) -> None:
            self.fail = True

        def load(self, owned):
            return real.load(owned)

        def commit(self, actors, changes):
            if self.fail:
                raise OSError("disk full")
            real.commit(actors, changes)

    component._store = failing = Failing()
    results = ask(shard, nolag.actor_seen(A, (("q", T, 1),)))
    assert isinstance(results[0], CommandError) and results[0].code == "internal_error"  # not confirmed
    failing.fail = False
    assert ask(shard, nolag.actor_save(A, T, RECORD, 1)) == [True]
    assert ask(build(store_settings), nolag.actor_get(A)) == [ActorState({T: RECORD}, {T: 1}, {T: 1}, ["q"], False)]


def test_seen_ids_are_capped_per_actor(store_settings, monkeypatch):
    from actors.nolag import shard as nolag_shard
    monkeypatch.setattr(nolag_shard, "MAX_SEEN", 3)
    shard = build(store_settings)
    ask(shard, nolag.actor_save(A, T, RECORD, 0), nolag.actor_seen(A, tuple((f"q{n}", T, n + 1) for n in range(5))))
    assert ask(build(store_settings), nolag.actor_get(A))[0].seen == ["q2", "q3", "q4"]


def test_the_store_alone_round_trips(store_settings):
    store = open_actor_store(store_settings)
    if store_settings.store.postgres is None:
        assert type(store) is SqliteActorStore and store.path == store_settings.data_dir / "nolag-actors.sqlite3"
    else:
        assert type(store) is PostgresActorStore
    actor = Actor({T: RECORD}, {T: 7}, {T: 6}, acks=True)
    actor.seen["q"] = (T, 7)
    store.commit({A: actor}, [("acks", A, True), ("sub", A, T), ("seen", A, "q", T, 7)])
    loaded = store.load(lambda name: True)
    assert loaded == {A: actor}
    assert store.load(lambda name: False) == {}
    with pytest.raises(ValueError):
        store.commit({}, [("nonsense", A)])
    store.close()


def test_a_commit_is_all_or_none(store_settings):
    """A change that fails (here: an unknown one, after valid ones) writes nothing of the batch."""
    store = open_actor_store(store_settings)
    actor = Actor({T: RECORD}, {T: 1}, {T: 1})
    store.commit({A: actor}, [("sub", A, T)])
    actor.subscriptions[U] = RECORD
    actor.seen["q"] = (U, 2)
    with pytest.raises(ValueError):
        store.commit({A: actor}, [("sub", A, U), ("seen", A, "q", U, 2), ("acks", A, True), ("nonsense", A)])
    assert store.load(lambda name: True) == {A: Actor({T: RECORD}, {T: 1}, {T: 1})}
    store.close()


def test_a_failing_statement_rolls_back_the_batch(store_settings):
    """The database refuses a row (topic NULL) after other writes of the batch: none is kept."""
    store = open_actor_store(store_settings)
    actor = Actor({T: RECORD}, {T: 1}, {T: 1})
    store.commit({A: actor}, [("sub", A, T)])
    error = sqlite3.IntegrityError if store_settings.store.postgres is None else psycopg.errors.NotNullViolation
    with pytest.raises(error):
        store.commit({A: actor}, [("reset", A), ("acks", A, True), ("seen", A, "q", None, 3)])
    assert store.load(lambda name: True) == {A: Actor({T: RECORD}, {T: 1}, {T: 1})}
    store.close()


def test_two_stores_see_each_others_commits_and_order_is_kept(store_settings):
    """Two store objects (two shard processes) over the same data; within a batch the changes
    apply in order (reset, then a new subscription and ids; seen then unseen)."""
    one, two = open_actor_store(store_settings), open_actor_store(store_settings)
    first = Actor({T: RECORD}, {T: 1}, {T: 1}, acks=True)
    first.seen["old"] = (T, 1)
    one.commit({A: first}, [("acks", A, True), ("sub", A, T), ("seen", A, "old", T, 1)])
    fresh = Actor({U: RECORD}, {U: 9}, {U: 8})
    fresh.seen["q2"] = (U, 9)
    fresh.seen["q1"] = (U, 8)
    two.commit({A: fresh}, [("reset", A), ("sub", A, U), ("seen", A, "q2", U, 9), ("seen", A, "q1", U, 8),
                            ("seen", A, "gone", U, 7), ("unseen", A, "gone"), ("sub", "actor_b", T)])
    loaded = one.load(lambda name: True)
    assert loaded == {A: fresh} and list(loaded[A].seen) == ["q2", "q1"]
    one.close()
    two.close()


def test_ids_recorded_but_never_written_are_forgotten_again(store_settings):
    """A connection that ended with QoS 2 messages recorded but not yet written hands them back."""
    shard = build(store_settings)
    ask(shard, nolag.actor_save(A, T, RECORD, 0), nolag.actor_seen(A, (("q1", T, 1), ("q2", T, 2))))
    assert ask(shard, nolag.actor_unseen(A, ("q2", "unknown")), nolag.actor_unseen("actor_x", ("q1",))) == [True, True]
    assert ask(build(store_settings), nolag.actor_get(A))[0].seen == ["q1"]


def test_client_chosen_text_with_nul_is_stored_and_read_back(store_settings):
    """Actor names, load-balance groups and ids come from clients: NUL survives on both stores."""
    store = open_actor_store(store_settings)
    name, topic = "actor\x00\x01", "a/b/c"
    actor = Actor({topic: SubscriptionRecord(1, ("f\x00",), True, "group\x00")}, {topic: 3}, {})
    actor.seen["id\x00"] = (topic, 3)
    store.commit({name: actor}, [("sub", name, topic), ("seen", name, "id\x00", topic, 3)])
    assert store.load(lambda owner: True) == {name: actor}
    store.close()
