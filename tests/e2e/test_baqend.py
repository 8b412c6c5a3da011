"""Baqend real-time queries over real sockets and REST: the window table, filters, initial results,
errors, limits, acl, and the live window against the query re-run from scratch.

``baqend``: two gateways (subscribers on one, writes through the other), two document shards and
two query shards, a JWT validator, small limits, rates too high to trip.
"""

from __future__ import annotations

import itertools
import json
import random
import subprocess
import time

import jwt
import pytest

from tests.e2e.baqend_client import Events, Rest, key_of
from tests.e2e.client import eventually, run
from tests.e2e.conftest import RunningRouter, start_router

pytestmark = pytest.mark.e2e

SECRET = "baqend-secret-" + "0123456789abcdef" * 4
SCHEMA = [{"class": "/db/Todo", "fields": {"name": {"name": "name", "type": "/db/String"},
                                           "n": {"name": "n", "type": "/db/Integer"},
                                           "on": {"name": "on", "type": "/db/Boolean"}}}]


@pytest.fixture(scope="module")
def baqend(ray_runtime, tmp_path_factory) -> RunningRouter:
    running = start_router(
        namespace="e2e-baqend", data_dir=tmp_path_factory.mktemp("baqend-data"), port=0, gateways=2,
        ray_dashboard=False, shards={"session": 1, "topic": 1, "registry": 1, "document": 2, "query": 2},
        signal={"enabled": False}, cashu={"enabled": False}, mx={"enabled": False}, analytics={"enabled": False},
        baqend={"max_subscriptions": 12, "max_message_bytes": 4096, "max_result_bytes": 4096, "schema": SCHEMA,
                "auth": {"enabled": True, "secret": SECRET},
                # functional tests never trip the rates (test_baqend_limits.py tests them)
                "rest_rate_limit_per_minute": 6_000_000, "rest_rate_limit_burst": 100_000,
                "subscribe_rate_limit_per_minute": 6_000_000, "subscribe_rate_limit_burst": 100_000},
    )
    yield running
    running.router.stop()


def urls(running: RunningRouter) -> list[tuple[str, str]]:
    """(events url, REST base) of each gateway."""
    out = []
    for gateway in running.router.endpoints():
        port = gateway["listeners"][0]["port"]
        out.append((f"ws://127.0.0.1:{port}/v1/events", f"http://127.0.0.1:{port}/v1"))
    return out


_buckets = itertools.count(1)


def fresh_bucket(prefix: str = "B") -> str:
    """A bucket no other test uses (the router lives for the whole module)."""
    return f"{prefix}{next(_buckets)}x{time.monotonic_ns()}"


def token(user: str, roles: list[str] | None = None, secret: str = SECRET, expires_in: float = 3600) -> str:
    return jwt.encode({"sub": user, "roles": roles or [], "exp": int(time.time() + expires_in)}, secret,
                      algorithm="HS256")


# -- the window table (baqend-notes.md, "Sorted windows") -------------------------------------------
# Documents d10..d70 with n = 10..70 and on = true; the query {on: true} sorted by n with offset 2 and
# limit 3 shows [d30, d40, d50]; d10, d20 are in the offset zone, d60, d70 past the limit.

WINDOW_ROWS = [
    ("insert landing in window", [("insert", "d35", {"n": 35, "on": True})],
     [("remove", "none", "d50", None), ("add", "insert", "d35", 1)]),
    ("insert landing in offset zone", [("insert", "d05", {"n": 5, "on": True})],
     [("remove", "none", "d50", None), ("add", "none", "d20", 0)]),
    ("update inside window, moves", [("set", "d30", {"n": 45})], [("changeIndex", "update", "d30", 1)]),
    ("update inside window, same place", [("set", "d40", {"name": "renamed"})], [("change", "update", "d40", 1)]),
    ("window to offset zone", [("set", "d40", {"n": 15})],
     [("remove", "update", "d40", None), ("add", "none", "d20", 0)]),
    ("offset zone to window", [("set", "d10", {"n": 45})],
     [("remove", "none", "d30", None), ("add", "update", "d10", 1)]),
    ("window past limit", [("set", "d40", {"n": 65})],
     [("remove", "update", "d40", None), ("add", "none", "d60", 2)]),
    ("past limit to window", [("set", "d60", {"n": 35})],
     [("remove", "none", "d50", None), ("add", "update", "d60", 1)]),
    ("window to non-match", [("set", "d40", {"on": False})],
     [("remove", "update", "d40", None), ("add", "none", "d60", 2)]),
    ("delete in window", [("delete", "d40", {})], [("remove", "delete", "d40", None), ("add", "none", "d60", 2)]),
    ("offset zone to non-match", [("set", "d10", {"on": False})],
     [("remove", "none", "d30", None), ("add", "none", "d60", 2)]),
    ("delete in offset zone", [("delete", "d10", {})], [("remove", "none", "d30", None), ("add", "none", "d60", 2)]),
    ("changes in offset zone, past limit, non-matching",
     [("set", "d10", {"n": 12}), ("set", "d70", {"n": 80}), ("insert", "x1", {"n": 35, "on": False})], []),
]


async def setup_window(rest: Rest, bucket: str) -> None:
    for n in range(10, 80, 10):
        await rest.insert(bucket, f"d{n}", n=n, on=True, name=f"d{n}")


async def write(rest: Rest, bucket: str, action: str, key: str, fields: dict) -> None:
    if action == "insert":
        await rest.insert(bucket, key, **fields)
    elif action == "set":
        await rest.set(bucket, key, **fields)
    else:
        await rest.delete(bucket, key)


def apply_events(window: list[str], events: list[tuple]) -> None:
    """What the SDK's resultStream does with match events."""
    for match_type, _, key, index in events:
        if match_type in ("remove", "changeIndex"):
            window.remove(key)
        if match_type in ("add", "changeIndex"):
            window.insert(index, key)


@pytest.mark.parametrize("row, writes, expected", WINDOW_ROWS, ids=[row[0] for row in WINDOW_ROWS])
def test_window_table_row(baqend, row, writes, expected):
    (events_url, _), (_, rest_url) = urls(baqend)

    async def scenario():
        bucket = fresh_bucket("Win")
        async with Rest(rest_url) as rest:
            await setup_window(rest, bucket)
            client = await Events.open(events_url)
            await client.subscribe("w", bucket, query={"on": True}, sort={"n": 1}, offset=2, limit=3, initial=True)
            window = [key_of(d) for d in await client.result("w")]
            assert window == ["d30", "d40", "d50"]
            for action, key, fields in writes:
                await write(rest, bucket, action, key, fields)
            events = await client.matches(len(expected))
            assert events == expected
            for _, _, _, index in events:  # never null: omitted on remove
                assert index is None or isinstance(index, int)
            apply_events(window, events)
            # Nothing else came: the next frame is the change of a sentinel write to the first visible item.
            await rest.set(bucket, window[0], name="sentinel")
            assert await client.matches(1) == [("change", "update", window[0], 0)]
            check = await Events.open(events_url)
            await check.subscribe("c", bucket, query={"on": True}, sort={"n": 1}, offset=2, limit=3, initial=True)
            assert [key_of(d) for d in await check.result("c")] == window
            await check.close()
            await client.close()

    run(scenario())


def test_delete_sends_the_last_image_without_version(baqend):
    (events_url, rest_url), _ = urls(baqend)

    async def scenario():
        bucket = fresh_bucket()
        async with Rest(rest_url) as rest:
            stored = await rest.insert(bucket, "a", n=1)
            client = await Events.open(events_url)
            await client.subscribe("s", bucket, sort={"n": 1}, initial=True)
            assert await client.result("s") == [stored]
            await rest.delete(bucket, "a")
            frame = await client.recv()
            assert frame == {"id": "s", "type": "match", "matchType": "remove", "operation": "delete",
                             "data": {k: v for k, v in stored.items() if k != "version"}}
            await client.close()

    run(scenario())


# -- matchTypes and operations ------------------------------------------------------------------------
# Writes: insert d35, rename d35, d35 -> 45, delete d35. Unfiltered events:
#   remove/none d50, add/insert d35 @1, change/update d35 @1, changeIndex/update d35 @2,
#   remove/delete d35, add/none d50 @2.
# Each filter's sentinel is a later write whose events pass the filter: nothing else came before it.

FILTER_WRITES = [("insert", "d35", {"n": 35, "on": True}), ("set", "d35", {"name": "x"}),
                 ("set", "d35", {"n": 45}), ("delete", "d35", {})]
RENAME_D40 = ("set", "d40", {"name": "sentinel"})
MOVE_D40 = ("set", "d40", {"n": 55})
INSERT_D45 = ("insert", "d45", {"n": 45, "on": True})
DELETE_D40 = ("delete", "d40", {})

FILTERS = [
    ({"matchTypes": ["add"]}, [("add", "insert", "d35", 1), ("add", "none", "d50", 2)], INSERT_D45,
     [("add", "insert", "d45", 2)]),
    ({"matchTypes": ["remove"]}, [("remove", "none", "d50", None), ("remove", "delete", "d35", None)], INSERT_D45,
     [("remove", "none", "d50", None)]),
    ({"matchTypes": ["change"]}, [("change", "update", "d35", 1)], RENAME_D40, [("change", "update", "d40", 1)]),
    ({"matchTypes": ["changeIndex"]}, [("changeIndex", "update", "d35", 2)], MOVE_D40,
     [("changeIndex", "update", "d40", 2)]),
    ({"matchTypes": ["match"]}, [("match", "insert", "d35", 1), ("match", "update", "d35", 1),
                                 ("match", "update", "d35", 2), ("match", "none", "d50", 2)], RENAME_D40,
     [("match", "update", "d40", 1)]),
    ({"matchTypes": ["add", "remove"]}, [("remove", "none", "d50", None), ("add", "insert", "d35", 1),
                                         ("remove", "delete", "d35", None), ("add", "none", "d50", 2)], INSERT_D45,
     [("remove", "none", "d50", None), ("add", "insert", "d45", 2)]),
    ({"operations": ["insert"]}, [("add", "insert", "d35", 1)], INSERT_D45, [("add", "insert", "d45", 2)]),
    ({"operations": ["update"]}, [("change", "update", "d35", 1), ("changeIndex", "update", "d35", 2)], RENAME_D40,
     [("change", "update", "d40", 1)]),
    ({"operations": ["delete"]}, [("remove", "delete", "d35", None)], DELETE_D40, [("remove", "delete", "d40", None)]),
    ({"operations": ["none"]}, [("remove", "none", "d50", None), ("add", "none", "d50", 2)], INSERT_D45,
     [("remove", "none", "d50", None)]),
    ({"matchTypes": ["all"]}, [("remove", "none", "d50", None), ("add", "insert", "d35", 1),
                               ("change", "update", "d35", 1), ("changeIndex", "update", "d35", 2),
                               ("remove", "delete", "d35", None), ("add", "none", "d50", 2)], RENAME_D40,
     [("change", "update", "d40", 1)]),
    ({"operations": ["any"]}, [("remove", "none", "d50", None), ("add", "insert", "d35", 1),
                               ("change", "update", "d35", 1), ("changeIndex", "update", "d35", 2),
                               ("remove", "delete", "d35", None), ("add", "none", "d50", 2)], RENAME_D40,
     [("change", "update", "d40", 1)]),
]


@pytest.mark.parametrize("fields, expected, sentinel, after", FILTERS, ids=[json.dumps(f[0]) for f in FILTERS])
def test_match_type_and_operation_filters(baqend, fields, expected, sentinel, after):
    (events_url, _), (_, rest_url) = urls(baqend)

    async def scenario():
        bucket = fresh_bucket("Flt")
        async with Rest(rest_url) as rest:
            await setup_window(rest, bucket)
            client = await Events.open(events_url)
            await client.subscribe("f", bucket, query={"on": True}, sort={"n": 1}, offset=2, limit=3, initial=True,
                                   **fields)
            # The result says the subscription is live (filters apply to match messages only).
            assert [key_of(d) for d in await client.result("f")] == ["d30", "d40", "d50"]
            for action, key, values in FILTER_WRITES:
                await write(rest, bucket, action, key, values)
            await write(rest, bucket, *sentinel)
            assert await client.matches(len(expected) + len(after)) == expected + after
            await client.close()

    run(scenario())


def test_unsorted_query_events_carry_no_index_and_the_result_lists_every_match(baqend):
    (events_url, rest_url), _ = urls(baqend)

    async def scenario():
        bucket = fresh_bucket()
        async with Rest(rest_url) as rest:
            a = await rest.insert(bucket, "a", tag="x", n=1)
            await rest.insert(bucket, "b", tag="y", n=2)
            client = await Events.open(events_url)
            await client.subscribe("u", bucket, query={"tag": {"$in": ["x", "z"]}}, initial=True)
            assert await client.result("u") == [a]
            await rest.set(bucket, "b", tag="z")
            await rest.set(bucket, "a", n=5)
            await rest.set(bucket, "b", tag="q")
            assert await client.matches(3) == [("add", "update", "b", None), ("change", "update", "a", None),
                                               ("remove", "update", "b", None)]
            await client.unsubscribe("u")
            await client.subscribe("u2", bucket, query='{"n": {"$gt": 4}}', initial=True)
            assert [key_of(d) for d in await client.result("u2")] == ["a"]  # "u" sent nothing more
            await client.close()

    run(scenario())


def test_initial_result_of_a_sorted_query_with_offset_and_limit_is_the_window_in_order(baqend):
    (events_url, rest_url), _ = urls(baqend)

    async def scenario():
        bucket = fresh_bucket()
        async with Rest(rest_url) as rest:
            for key, n, name in [("a", 3, "c"), ("b", 1, "a"), ("c", 2, "b"), ("d", 2, "a"), ("e", 5, "z")]:
                await rest.insert(bucket, key, n=n, name=name)
            client = await Events.open(events_url)
            await client.subscribe("s", bucket, sort={"n": -1, "name": 1}, offset=1, limit=3, initial=True)
            assert [key_of(d) for d in await client.result("s")] == ["a", "d", "c"]
            await client.subscribe("t", bucket, limit=2, initial=True)  # limit without sort: by id
            assert [key_of(d) for d in await client.result("t")] == ["a", "b"]
            await client.close()

    run(scenario())


# -- errors and limits ------------------------------------------------------------------------------------


def error(sub_id, status, reason, message):
    frame = {"type": "error", "status": status, "error": {"message": message, "status": status, "reason": reason}}
    if sub_id is not None:
        frame["id"] = sub_id
    return frame


@pytest.mark.parametrize("message, expected", [
    ('{"id": "e", "type": "subscribe", "bucket": "T", "sort": "{\\"a\\": 1}", "offset": 500}',
     error("e", 400, "Query Not Supported", "Offset + limit may not exceed 500, but offset already was 500.")),
    ('{"id": "e", "type": "subscribe", "bucket": "T", "query": "{\\"a\\": {\\"$near\\": [1, 2]}}"}',
     error("e", 400, "Query Not Supported", "$near is not supported in real-time queries")),
    ('{"id": "e", "type": "subscribe", "bucket": "T", "query": "{\\"a\\": {\\"$foo\\": 1}}"}',
     error("e", 400, "Bad Request", "unknown operator: $foo")),
    ('{"id": "e", "type": "subscribe", "bucket": "T", "query": "{a"}',
     error("e", 400, "Bad Request", "query is not valid JSON: unexpected character, expected a string key")),
    ('{"id": "e", "type": "subscribe", "bucket": "T", "matchTypes": ["add"], "operations": ["update"]}',
     error("e", 400, "Bad Request", "Only subscriptions for either operations or matchTypes are allowed. You cannot "
           "subscribe to a query using matchTypes and operations at the same time!")),
    ('{"id": "e", "type": "subscribe", "bucket": "T", "matchTypes": ["moved"]}',
     error("e", 400, "Bad Request", "moved not allowed for match types! (permitted: add,change,changeIndex,match,"
           "remove.)")),
    ('{"id": "e", "type": "subscribe", "bucket": "T", "limit": -1}',
     error("e", 400, "Bad Request", "limit must be a non-negative integer")),
    ('{"id": "e", "type": "subscribe"}',
     error("e", 400, "Bad Request", "bucket must be the name of a bucket (letters, digits, '_' and '.')")),
    ('{"id": "e", "type": "publish"}', error("e", 400, "Bad Request", "Invalid message type 'publish': use subscribe "
                                             "or unsubscribe")),
    ("not json", error(None, 400, "Bad Request", "Invalid message: not JSON (invalid literal, expected 'null')")),
    ('{"type": "subscribe"}', error(None, 400, "Bad Request", "Invalid message: id must be a non-empty string of at "
                                    "most 256 characters")),
    ('{"id": "e", "type": "subscribe", "bucket": "T", "token": "abc"}',
     error("e", 401, "Unauthorized", "Invalid token: Not enough segments")),
    ('{"id": "big", "pad": "' + "x" * 5000 + '"}',
     error(None, 413, "Payload Too Large", "Message of 5024 bytes exceeds the limit of 4096 bytes")),
])
def test_bad_subscriptions_get_error_messages(baqend, message, expected):
    (events_url, _), _ = urls(baqend)

    async def scenario():
        client = await Events.open(events_url)
        await client.send(message)
        assert await client.recv() == expected
        await client.subscribe("ok", fresh_bucket(), initial=True)  # the connection still works
        assert await client.result("ok") == []
        await client.close()

    run(scenario())


def test_expired_and_foreign_tokens_are_refused(baqend):
    (events_url, _), _ = urls(baqend)

    async def scenario():
        client = await Events.open(events_url)
        await client.subscribe("x", "T", token=token("u1", expires_in=-10))
        assert await client.recv() == error("x", 401, "Unauthorized", "Invalid token: expired")
        await client.subscribe("y", "T", token=token("u1", secret="another-secret-" + "x" * 40))
        assert await client.recv() == error("y", 401, "Unauthorized", "Invalid token: Signature verification failed")
        await client.close()

    run(scenario())


def test_active_subscription_limit_per_connection(baqend):
    (events_url, _), _ = urls(baqend)

    async def scenario():
        bucket = fresh_bucket()
        client = await Events.open(events_url)
        for index in range(12):
            await client.subscribe(f"s{index}", bucket, initial=True)
        frames = [await client.recv() for _ in range(12)]  # from two query shards: in any order
        assert sorted(frames, key=lambda f: int(f["id"][1:])) == [
            {"id": f"s{index}", "type": "result", "data": []} for index in range(12)]
        await client.subscribe("s12", bucket, initial=True)
        assert await client.recv() == error("s12", 429, "Too Many Requests",
                                            "Too many active subscriptions (only 12 allowed)!")
        await client.unsubscribe("s0")
        await client.subscribe("s13", bucket, initial=True)
        assert await client.result("s13") == []
        await client.subscribe("s13", bucket)  # the id is in use: refused, and the subscription ends
        assert await client.recv() == error("s13", 400, "Bad Request", "Subscription id s13 is already in use")
        await client.close()

    run(scenario())


def test_an_initial_result_above_max_result_bytes_ends_the_subscription(baqend):
    (events_url, rest_url), _ = urls(baqend)

    async def scenario():
        bucket = fresh_bucket()
        async with Rest(rest_url) as rest:
            for index in range(30):
                await rest.insert(bucket, f"k{index}", text="y" * 150)
            client = await Events.open(events_url)
            await client.subscribe("big", bucket, initial=True)
            frame = await client.recv()
            assert frame["type"] == "error" and frame["id"] == "big" and frame["status"] == 413
            assert frame["error"]["message"].startswith("The initial result is ")
            await client.subscribe("small", bucket, sort={"text": 1}, limit=5, initial=True)
            assert len(await client.result("small")) == 5
            await client.close()

    run(scenario())


# -- acl: anonymous subscriptions see public documents, a token the ones its user may read ------------------


def test_acl_read_rules_apply_to_subscriptions_and_reads(baqend):
    (events_url, rest_url), _ = urls(baqend)

    async def scenario():
        bucket = fresh_bucket()
        private = {"read": {"/db/User/u1": "allow"}, "write": {}}
        async with Rest(rest_url) as rest:
            await rest.insert(bucket, "pub", n=1)
            await rest.insert(bucket, "priv", n=2, acl=private)
            anonymous, user, role = [await Events.open(events_url) for _ in range(3)]
            await anonymous.subscribe("a", bucket, sort={"n": 1}, initial=True)
            await user.subscribe("u", bucket, sort={"n": 1}, initial=True, token=token("u1"))
            await role.subscribe("r", bucket, sort={"n": 1}, initial=True, token=token("u2", ["staff"]))
            assert [key_of(d) for d in await anonymous.result("a")] == ["pub"]
            assert [key_of(d) for d in await user.result("u")] == ["pub", "priv"]
            assert [key_of(d) for d in await role.result("r")] == ["pub"]
            await rest.set(bucket, "priv", acl={"read": {"/db/Role/staff": "allow"}, "write": {}})
            assert await user.matches(1) == [("remove", "update", "priv", None)]
            assert await role.matches(1) == [("add", "update", "priv", 1)]
            await rest.set(bucket, "priv", acl=None)
            assert await anonymous.matches(1) == [("add", "update", "priv", 1)]
            assert await user.matches(1) == [("add", "update", "priv", 1)]
            status, body = await rest.call("GET", f"/db/{bucket}/pub")
            assert status == 200 and body["id"] == f"/db/{bucket}/pub"
            await rest.set(bucket, "priv", acl=private)
            assert (await rest.call("GET", f"/db/{bucket}/priv"))[0] == 404
            status, body = await rest.call("GET", f"/db/{bucket}/priv", headers={"Authorization": "BAT " + token("u1")})
            assert status == 200 and body["acl"] == private
            for client in (anonymous, user, role):
                await client.close()

    run(scenario())


# -- REST ------------------------------------------------------------------------------------------------------


def test_rest_status_codes_and_json_errors(baqend):
    _, (_, rest_url) = urls(baqend)

    async def scenario():
        bucket = fresh_bucket()
        async with Rest(rest_url) as rest:
            assert await rest.call("GET", "/connect") == (200, {"schema": SCHEMA, "bloomFilterRefresh": 60})
            created = await rest.insert(bucket, "a", name="A", tags=[])
            assert created["version"] == 1 and created["createdAt"] == created["updatedAt"]
            status, body = await rest.call("POST", f"/db/{bucket}", {"id": f"/db/{bucket}/a"})
            assert (status, body["reason"], body["className"]) == (409, "Conflict", "baqend.error.ObjectExists")
            status, body = await rest.call("PUT", f"/db/{bucket}/a", {"name": "B"}, {"If-Match": '"7"'})
            assert (status, body) == (412, {"message": f"the object /db/{bucket}/a is at version 1, not 7",
                                            "reason": "Precondition Failed",
                                            "className": "baqend.error.ObjectOutOfDate", "status": 412})
            status, body = await rest.call("PUT", f"/db/{bucket}/a", {"name": "B"}, {"If-Match": '"1"'})
            assert (status, body["version"], body["name"], "tags" in body) == (200, 2, "B", False)
            status, body = await rest.call("POST", f"/db/{bucket}/a", {"$push": {"tags": "t"}, "$inc": {"n": 2}})
            assert (status, body["version"], body["tags"], body["n"]) == (200, 3, ["t"], 2)
            status, body = await rest.call("POST", f"/db/{bucket}/a", {"$nope": {}})
            assert status == 400 and body["message"].startswith("unknown update operator $nope")
            assert (await rest.call("GET", f"/db/{bucket}/missing"))[0] == 404
            assert (await rest.call("DELETE", f"/db/{bucket}/missing"))[0] == 404
            assert (await rest.call("DELETE", f"/db/{bucket}/a", headers={"If-Match": '"2"'}))[0] == 412
            assert await rest.call("DELETE", f"/db/{bucket}/a", headers={"If-Match": '"3"'}) == (204, None)
            status, body = await rest.call("POST", f"/db/{bucket}", raw=b"{nope")
            assert status == 400 and body["message"].startswith("the body is not JSON")
            status, body = await rest.call("POST", "/db/9bad", {})
            assert status == 400 and body["message"] == "invalid bucket name '9bad'"
            status, body = await rest.call("POST", f"/db/{bucket}", {"blob": "x" * (300 * 1024)})
            assert status == 413
            status, body = await rest.call("POST", f"/db/{bucket}", {"name": "generated"})
            assert status == 201 and body["id"].startswith(f"/db/{bucket}/") and len(key_of(body)) == 36

    run(scenario())


# -- the property: the live window always equals the query re-run from scratch ----------------------------------

QUERIES = [
    dict(query={"on": True}, sort={"n": 1}, offset=2, limit=3),
    dict(query={"n": {"$gte": 3}}, sort={"n": -1, "name": 1}, limit=4),
    dict(query={"on": True}),
]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_live_window_after_random_writes_equals_rerunning_the_query(baqend, seed):
    (events_url, _), (_, rest_url) = urls(baqend)
    rng = random.Random(seed)
    spec = QUERIES[seed % len(QUERIES)]
    sorted_query = "sort" in spec or "limit" in spec

    async def scenario():
        bucket = fresh_bucket("Prop")
        async with Rest(rest_url) as rest:
            live = await Events.open(events_url)
            await live.subscribe("live", bucket, initial=True, **json.loads(json.dumps(spec)))
            window = [key_of(d) for d in await live.result("live")]
            versions: dict[str, int] = {}
            exists: set[str] = set()
            for _ in range(60):
                key = f"k{rng.randrange(10)}"
                fields = {"n": rng.randrange(7), "on": rng.random() < 0.6, "name": rng.choice("ab")}
                if key in exists and rng.random() < 0.25:
                    await rest.delete(bucket, key)
                    exists.discard(key)
                elif key in exists:
                    await rest.set(bucket, key, **fields)
                else:
                    await rest.insert(bucket, key, **fields)
                    exists.add(key)
            fresh = await Events.open(events_url)
            await fresh.subscribe("fresh", bucket, initial=True, **json.loads(json.dumps(spec)))
            expected = [key_of(d) for d in await fresh.result("fresh")]

            async def caught_up() -> bool:
                while True:
                    try:
                        frame = await live.recv(timeout=0.05)
                    except TimeoutError:
                        break
                    event = frame
                    key, match_type = key_of(event["data"]), event["matchType"]
                    if match_type == "add":
                        assert key not in versions, event
                        versions[key] = event["data"]["version"]
                    elif match_type == "remove":
                        assert versions.pop(key, None) is not None, event
                    else:
                        assert event["data"]["version"] > versions[key], event
                        versions[key] = event["data"]["version"]
                    if match_type in ("remove", "changeIndex"):
                        window.remove(key)
                    if match_type in ("add", "changeIndex"):
                        if sorted_query:
                            window.insert(event["index"], key)
                        else:
                            window.append(key)
                return (window if sorted_query else sorted(window)) == (expected if sorted_query else sorted(expected))

            await eventually(caught_up, timeout=15)
            await live.close()
            await fresh.close()

    run(scenario(), timeout=120)


def test_without_initial_the_first_message_is_a_match(baqend):
    (events_url, rest_url), _ = urls(baqend)

    async def scenario():
        bucket = fresh_bucket()
        async with Rest(rest_url) as rest:
            await rest.insert(bucket, "a", n=0)
            client = await Events.open(events_url)
            await client.subscribe("s", bucket, query={"n": {"$gte": 0}}, initial=False)
            counter = iter(range(1, 1000))

            async def first_frame():
                # No signal tells when the subscription is live: write until a match arrives.
                await rest.set(bucket, "a", n=next(counter))
                try:
                    return await client.recv(timeout=0.2)
                except TimeoutError:
                    return None

            frame = await eventually(first_frame, timeout=10)
            assert frame["type"] == "match" and frame["matchType"] == "change" and frame["operation"] == "update"
            await client.close()

    run(scenario())


# -- the real SDK ------------------------------------------------------------------------------------------------


def test_the_baqend_sdk_writes_over_rest_and_follows_event_and_result_streams(baqend):
    from tests.e2e.npm import node_project

    project = node_project("baqend-sdk", ["baqend@3.4.1", "ws@8"], ["baqend_sdk.mjs"])
    _, (_, rest_url) = urls(baqend)  # the SDK talks to the second gateway; other tests write through both
    done = subprocess.run(["node", "baqend_sdk.mjs", rest_url], cwd=project, capture_output=True, text=True,
                          timeout=120)
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0, (done.stdout, done.stderr)
    steps = {}
    for line in lines:
        steps.setdefault(line["step"], []).append(line)
    assert "error" not in steps, steps["error"]
    assert steps["initial"] == [{"step": "initial", "result": []}]
    keys = [line["key"] for line in steps["inserted"]]
    assert [(line["version"], line["n"]) for line in steps["inserted"]] == [(1, 5), (1, 3), (1, 8), (1, 1)]
    assert steps["updated"] == [{"step": "updated", "key": keys[0], "version": 2}]
    assert steps["partial"] == [{"step": "partial", "key": keys[3], "version": 2, "n": 11}]
    assert [line["result"] for line in steps["result"]] == [
        [f"{keys[3]}:1", f"{keys[1]}:3", f"{keys[0]}:5"],
        [f"{keys[0]}:0", f"{keys[3]}:1", f"{keys[1]}:3"],
        [f"{keys[0]}:0", f"{keys[1]}:3", f"{keys[2]}:8"],
        [f"{keys[1]}:3", f"{keys[2]}:8", f"{keys[3]}:11"],
    ]
    events = [(e["matchType"], e["operation"], e["key"], e["initial"]) for e in steps["events"][0]["events"]]
    sentinel = steps["sentinel"][0]["key"]
    assert events == [("add", "none", sentinel, True), ("add", "insert", keys[0], False), ("add", "insert", keys[2], False),
                      ("add", "insert", keys[3], False), ("change", "update", keys[0], False),
                      ("change", "update", keys[3], False), ("remove", "delete", keys[0], False)]
    assert steps["stale"] == [{"step": "stale", "refused": True, "status": 412}]
    assert steps["done"]


# -- hostile input: what the store cannot hold, what a caller may not read -------------------------------------


@pytest.mark.security
def test_values_the_store_cannot_hold_get_400_naming_the_rule_and_every_shard_keeps_working(baqend):
    """Before: a 300-deep body, a $mul past 64 bits or a 300-part $set path was accepted, failed at
    commit and left its document shard failing every later batch."""
    (events_url, _), (_, rest_url) = urls(baqend)

    async def scenario():
        bucket = fresh_bucket()
        async with Rest(rest_url) as rest:
            deep = b'{"x": ' + b"[" * 300 + b"]" * 300 + b"}"
            assert await rest.call("POST", f"/db/{bucket}", raw=deep) == (400, {
                "message": "the body is nested deeper than 32 levels", "reason": "Bad Request",
                "className": "baqend.error.BadRequest", "status": 400})
            await rest.insert(bucket, "big", n=2 ** 62)
            status, body = await rest.call("POST", f"/db/{bucket}/big", {"$mul": {"n": 2 ** 40}})
            assert (status, body["message"]) == (400, "the object: integers must fit in 64 bits")
            status, body = await rest.call("POST", f"/db/{bucket}/big", {"$set": {".".join(["a"] * 300): 1}})
            assert (status, body["message"]) == (400, "a field path has at most 32 parts")
            status, body = await rest.call("POST", f"/db/{bucket}/big", {"$set": {".".join(["a"] * 31): {"b": {"c": 1}}}})
            assert (status, body["message"]) == (400, "the object is nested deeper than 32 levels")
            status, body = await rest.call("GET", f"/db/{bucket}/big")
            assert (status, body["n"], body["version"], "a" in body) == (200, 2 ** 62, 1, False)
            # every document shard still stores and answers (the keys spread over both)
            for index in range(8):
                await rest.insert(bucket, f"k{index}", n=index)
            for index in range(8):
                status, body = await rest.call("GET", f"/db/{bucket}/k{index}")
                assert (status, body["n"]) == (200, index)
            events = await Events.open(events_url)
            await events.subscribe("s", bucket, query={"n": {"$lt": 8}}, sort={"n": 1}, initial=True)
            assert [key_of(d) for d in await events.result("s")] == [f"k{index}" for index in range(8)]
            await events.close()

    run(scenario())


@pytest.mark.security
def test_a_write_answers_only_what_the_caller_may_read_and_hidden_answers_as_missing(baqend):
    """Before: an anonymous partial update of an owner-only document answered the whole document,
    and a hidden document answered 403 where a missing one answers 404."""
    _, (_, rest_url) = urls(baqend)

    async def scenario():
        bucket = fresh_bucket()
        owner = {"Authorization": "BAT " + token("u1")}
        async with Rest(rest_url) as rest:
            # readable by its owner only, writable by anyone (a drop box)
            drop_box = {"read": {"/db/User/u1": "allow"}, "write": {}}
            await rest.insert(bucket, "box", secret="s3cret", acl=drop_box)
            status, body = await rest.call("POST", f"/db/{bucket}/box", {"$unset": {"x": 1}})
            assert status == 200 and set(body) == {"id", "version", "createdAt", "updatedAt"}
            assert (body["id"], body["version"]) == (f"/db/{bucket}/box", 2)
            status, body = await rest.call("PUT", f"/db/{bucket}/box", {"other": 1, "acl": drop_box})
            assert status == 200 and set(body) == {"id", "version", "createdAt", "updatedAt"}
            status, body = await rest.call("POST", f"/db/{bucket}/box", {"$set": {"y": 1}}, owner)
            assert status == 200 and body["other"] == 1 and body["y"] == 1
            # readable and writable by its owner only: to anyone else exactly as a missing one
            private = {"read": {"/db/User/u1": "allow"}, "write": {"/db/User/u1": "allow"}}
            await rest.insert(bucket, "mine", secret="s3cret", acl=private)
            for method, body, headers in (("GET", None, None), ("POST", {"$unset": {"x": 1}}, None),
                                          ("PUT", {"a": 1}, {"If-Match": "*"}), ("DELETE", None, None)):
                hidden = await rest.call(method, f"/db/{bucket}/mine", body, headers)
                missing = await rest.call(method, f"/db/{bucket}/nothing", body, headers)
                assert hidden[0] == missing[0] == 404, (method, hidden, missing)
                assert hidden[1]["message"].replace("mine", "nothing") == missing[1]["message"]
            status, body = await rest.call("POST", f"/db/{bucket}/mine", {"$set": {"z": 1}}, owner)
            assert (status, body["secret"], body["z"]) == (200, "s3cret", 1)

    run(scenario())


@pytest.mark.security
def test_a_subscriber_that_loses_read_access_gets_the_last_image_it_could_see(baqend):
    """Before: the remove carried the new image (new content and the acl that hides it)."""
    (events_url, rest_url), _ = urls(baqend)

    async def scenario():
        bucket = fresh_bucket()
        async with Rest(rest_url) as rest:
            await rest.insert(bucket, "doc", name="old", n=1)
            viewer = await Events.open(events_url)
            await viewer.subscribe("v", bucket, sort={"n": 1}, initial=True, token=token("u2"))
            [seen] = await viewer.result("v")
            await rest.set(bucket, "doc", name="confidential", acl={"read": {"/db/User/u1": "allow"}, "write": {}})
            frame = await viewer.recv()
            assert (frame["type"], frame["matchType"], frame["operation"]) == ("match", "remove", "update")
            assert frame["data"] == seen and "confidential" not in json.dumps(frame)
            await viewer.close()

    run(scenario())
