"""Cashu NUT-17 over real sockets: subscriptions, current state first, ordering, errors, the state feed.

``cashu``: two gateways, two topic shards, the state feed on (API key), small limits.
``cashu_quiet``: one gateway, the feed off, a short idle timeout, a low rate limit, and unknown
proof Ys answered with nothing (as CDK) instead of UNSPENT (as Nutshell).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from gateways.cashu.feed import FeedError
from tests.e2e.cashu_client import API_KEY, Y1, Y2, Wallet, feed, melt_quote, mint_quote, proof_state, push
from tests.e2e.client import run
from tests.e2e.conftest import RunningRouter, start_router
from tests.e2e.npm import node_project

pytestmark = pytest.mark.e2e


def endpoints(running: RunningRouter) -> list[tuple[str, str]]:
    """(ws url, http url) of each gateway's main port."""
    out = []
    for gateway in running.router.endpoints():
        port = gateway["listeners"][0]["port"]
        out.append((f"ws://127.0.0.1:{port}/v1/ws", f"http://127.0.0.1:{port}"))
    return out


@pytest.fixture(scope="module")
def cashu(ray_runtime, tmp_path_factory) -> RunningRouter:
    running = start_router(
        namespace="e2e-cashu", data_dir=tmp_path_factory.mktemp("cashu-data"), port=0, gateways=2,
        ray_dashboard=False, shards={"session": 1, "topic": 2, "registry": 1}, signal={"enabled": False},
        cashu={"state_api_key": API_KEY, "max_subscriptions": 4, "max_filters": 5, "max_filters_per_connection": 12,
               "max_message_bytes": 4096, "max_frame_bytes": 8192, "rate_limit_per_second": 1000,
               "rate_limit_burst": 1000},
    )
    yield running
    running.router.stop()


@pytest.fixture(scope="module")
def cashu_quiet(ray_runtime, tmp_path_factory) -> RunningRouter:
    running = start_router(
        namespace="e2e-cashu-quiet", data_dir=tmp_path_factory.mktemp("cashu-quiet"), port=0, gateways=1,
        ray_dashboard=False, shards={"session": 1, "topic": 1, "registry": 1}, signal={"enabled": False},
        analytics={"enabled": False}, gateway={"sweep_interval_s": 0.1},
        cashu={"idle_timeout_s": 1.5, "rate_limit_per_second": 2, "rate_limit_burst": 3, "unknown_proof_state": "none"},
    )
    yield running
    running.router.stop()


_counter = iter(range(1, 1_000_000))


def fresh(prefix: str = "q") -> str:
    """A quote id no other test uses (the routers live for the whole module)."""
    return f"{prefix}{next(_counter)}-{time.monotonic_ns()}"


# -- current state first, then every change ----------------------------------------------------

KINDS = [
    ("bolt11_mint_quote", lambda q, s: mint_quote(q, s), ["UNPAID", "PAID", "ISSUED"]),
    ("bolt12_mint_quote", lambda q, s: mint_quote(q, s, amount_paid=0 if s == "UNPAID" else 100), ["UNPAID", "PAID", "ISSUED"]),
    ("bolt11_melt_quote", lambda q, s: melt_quote(q, s), ["UNPAID", "PENDING", "PAID"]),
    ("bolt12_melt_quote", lambda q, s: melt_quote(q, s), ["UNPAID", "PENDING", "PAID"]),
]


@pytest.mark.parametrize("kind, make, states", KINDS, ids=[k[0] for k in KINDS])
def test_quote_kinds_current_state_then_changes(cashu, kind, make, states):
    (ws_url, http_url), _ = endpoints(cashu)

    async def scenario():
        quote = fresh()
        stored = await push(http_url, kind, make(quote, states[0]))
        assert stored == {"kind": kind, "id": quote, "stored": True, "version": 1, "subscribers": 0}
        wallet = await Wallet.open(ws_url)
        request_id = await wallet.subscribe(kind, [quote], "sub-a")
        await wallet.expect_ok(request_id, "sub-a")
        assert await wallet.notification() == ("sub-a", make(quote, states[0]))
        for version, state in enumerate(states[1:], start=2):
            result = await push(http_url, kind, make(quote, state))
            assert (result["version"], result["subscribers"]) == (version, 1)
            assert await wallet.notification() == ("sub-a", make(quote, state))
        await wallet.quiet()
        await wallet.close()

    run(scenario())


def test_proof_state_unknown_y_is_unspent_then_pending_then_spent(cashu):
    (ws_url, http_url), _ = endpoints(cashu)

    async def scenario():
        y = "02" + fresh("").replace("-", "").rjust(64, "0")[-64:]
        wallet = await Wallet.open(ws_url)
        request_id = await wallet.subscribe("proof_state", [y], "Ua_IYvRHoCoF_wsZFlJ1m4gBDB--O0_6_n0zHg2T")
        await wallet.expect_ok(request_id, "Ua_IYvRHoCoF_wsZFlJ1m4gBDB--O0_6_n0zHg2T")
        assert await wallet.notification() == ("Ua_IYvRHoCoF_wsZFlJ1m4gBDB--O0_6_n0zHg2T",
                                               {"Y": y, "state": "UNSPENT", "witness": None})
        await push(http_url, "proof_state", {"Y": y, "state": "PENDING"})
        await push(http_url, "proof_state", proof_state(y, "SPENT", '{"signatures":["ab"]}'))
        assert (await wallet.notification())[1] == {"Y": y, "state": "PENDING"}
        assert (await wallet.notification())[1] == {"Y": y, "state": "SPENT", "witness": '{"signatures":["ab"]}'}
        await wallet.quiet()
        await wallet.close()

    run(scenario())


def test_unknown_quote_gets_no_initial_notification_until_the_mint_reports_it(cashu):
    (ws_url, http_url), _ = endpoints(cashu)

    async def scenario():
        quote = fresh()
        wallet = await Wallet.open(ws_url)
        await wallet.expect_ok(await wallet.subscribe("bolt11_mint_quote", [quote], "s"), "s")
        await wallet.quiet()
        await push(http_url, "bolt11_mint_quote", mint_quote(quote, "PAID"))
        assert await wallet.notification() == ("s", mint_quote(quote, "PAID"))
        await wallet.close()

    run(scenario())


def test_several_filters_and_two_subscriptions_to_one_object(cashu):
    (ws_url, http_url), _ = endpoints(cashu)

    async def scenario():
        first, second = fresh(), fresh()
        await push(http_url, "bolt11_melt_quote", melt_quote(first, "UNPAID"))
        await push(http_url, "bolt11_melt_quote", melt_quote(second, "PENDING"))
        wallet = await Wallet.open(ws_url)
        await wallet.expect_ok(await wallet.subscribe("bolt11_melt_quote", [second, first, second], "both"), "both")
        initial = [await wallet.notification(), await wallet.notification()]
        assert initial == [("both", melt_quote(second, "PENDING")), ("both", melt_quote(first, "UNPAID"))]
        await wallet.expect_ok(await wallet.subscribe("bolt11_melt_quote", [first], "one"), "one")
        assert await wallet.notification() == ("one", melt_quote(first, "UNPAID"))
        await push(http_url, "bolt11_melt_quote", melt_quote(first, "PAID", payment_preimage="00ff"))
        got = [await wallet.notification(), await wallet.notification()]
        assert sorted(sub for sub, _ in got) == ["both", "one"]
        assert all(payload == melt_quote(first, "PAID", payment_preimage="00ff") for _, payload in got)
        await wallet.quiet()
        await wallet.close()

    run(scenario())


def test_changes_reach_every_subscriber_in_order_across_gateways(cashu):
    (ws_a, http_a), (ws_b, _) = endpoints(cashu)

    async def scenario():
        quote = fresh()
        await push(http_a, "bolt11_mint_quote", mint_quote(quote, "UNPAID", amount_paid=0))
        wallets = [await Wallet.open(ws_a), await Wallet.open(ws_b), await Wallet.open(ws_b)]
        for index, wallet in enumerate(wallets):
            await wallet.expect_ok(await wallet.subscribe("bolt11_mint_quote", [quote], f"w{index}"), f"w{index}")
            assert (await wallet.notification())[1]["amount_paid"] == 0
        updates = 60
        client = feed(http_a)
        await asyncio.to_thread(client.push_many,
                                [("bolt11_mint_quote", mint_quote(quote, "UNPAID", amount_paid=n)) for n in range(1, 31)])
        for n in range(31, updates + 1):
            await asyncio.to_thread(client.push, "bolt11_mint_quote", mint_quote(quote, "PAID", amount_paid=n))
        for index, wallet in enumerate(wallets):
            seen = [(await wallet.notification())[1]["amount_paid"] for _ in range(updates)]
            assert seen == list(range(1, updates + 1))
            await wallet.quiet()
            await wallet.close()

    run(scenario())


def test_ok_comes_first_and_no_state_repeats_while_changes_race_the_subscription(cashu):
    (ws_a, http_a), (ws_b, http_b) = endpoints(cashu)

    async def scenario():
        quote = fresh()
        await push(http_a, "bolt11_mint_quote", mint_quote(quote, "UNPAID", amount_paid=0))
        last = 150
        client = feed(http_b)

        def pusher():
            for n in range(1, last + 1):
                client.push("bolt11_mint_quote", mint_quote(quote, "UNPAID", amount_paid=n))

        pushing = asyncio.create_task(asyncio.to_thread(pusher))
        wallets = []
        for index in range(8):
            wallet = await Wallet.open(ws_a if index % 2 else ws_b)
            await wallet.expect_ok(await wallet.subscribe("bolt11_mint_quote", [quote], f"r{index}"), f"r{index}")
            wallets.append(wallet)
            await asyncio.sleep(0)
        await pushing
        for wallet in wallets:
            seen = []
            while not seen or seen[-1] != last:
                seen.append((await wallet.notification())[1]["amount_paid"])
            assert seen == sorted(set(seen)), seen  # increasing, no repeats
            await wallet.quiet()
            await wallet.close()

    run(scenario())


def test_unsubscribe_stops_notifications(cashu):
    (ws_url, http_url), _ = endpoints(cashu)

    async def scenario():
        quote = fresh()
        wallet = await Wallet.open(ws_url)
        await wallet.expect_ok(await wallet.subscribe("bolt11_mint_quote", [quote], "gone"), "gone")
        request_id = await wallet.send("unsubscribe", {"subId": "gone"})
        await wallet.expect_ok(request_id, "gone")
        result = await push(http_url, "bolt11_mint_quote", mint_quote(quote, "PAID"))
        assert result["subscribers"] == 0
        await wallet.quiet()
        request_id = await wallet.send("unsubscribe", {"subId": "gone"})
        assert await wallet.recv() == {"jsonrpc": "2.0", "id": request_id, "error": {
            "code": -32602, "message": "Invalid params: subscription not found: gone"}}
        # the subId is free again
        await wallet.expect_ok(await wallet.subscribe("bolt11_mint_quote", [quote], "gone"), "gone")
        assert await wallet.notification() == ("gone", mint_quote(quote, "PAID"))
        await wallet.close()

    run(scenario())


def test_unsubscribe_right_after_subscribe_is_answered_after_its_ok(cashu):
    (ws_url, http_url), _ = endpoints(cashu)

    async def scenario():
        quote = fresh()
        await push(http_url, "bolt11_mint_quote", mint_quote(quote, "PAID"))
        wallet = await Wallet.open(ws_url)
        sub = await wallet.subscribe("bolt11_mint_quote", [quote], "brief")
        unsub = await wallet.send("unsubscribe", {"subId": "brief"})
        frames = [await wallet.recv(), await wallet.recv()]
        ok = {"jsonrpc": "2.0", "result": {"status": "OK", "subId": "brief"}}
        if frames[1].get("id") == unsub and frames[0].get("id") == sub:
            assert frames == [{**ok, "id": sub}, {**ok, "id": unsub}]
        else:  # the subscription completed first: OK, its state, then the unsubscribe's OK
            assert frames == [{**ok, "id": sub}, {"jsonrpc": "2.0", "method": "subscribe",
                              "params": {"subId": "brief", "payload": mint_quote(quote, "PAID")}}]
            assert await wallet.recv() == {**ok, "id": unsub}
        await wallet.quiet()
        await wallet.close()

    run(scenario())


def test_heartbeat(cashu):
    (ws_url, _), _ = endpoints(cashu)

    async def scenario():
        wallet = await Wallet.open(ws_url)
        await wallet.send("heartbeat", request_id=1)
        assert await wallet.recv() == {"jsonrpc": "2.0", "id": 1, "result": "heartbeat"}
        await wallet.close()

    run(scenario())


# -- errors ------------------------------------------------------------------------------------

def rpc_error(request_id, code, message):
    return {"jsonrpc": "2.0", "error": {"code": code, "message": message}, "id": request_id}


@pytest.mark.parametrize("frame, expected", [
    ("{not json", (None, -32700, None)),
    ("[1, 2]", (None, -32600, "Invalid Request: batch requests are not supported")),
    ('{"jsonrpc": "2.0", "method": "heartbeat"}', (None, -32600, "Invalid Request: 'id' must be an integer or a string")),
    ('{"id": 3, "method": "heartbeat"}', (3, -32600, "Invalid Request: 'jsonrpc' must be \"2.0\"")),
    ('{"jsonrpc": "2.0", "id": 4, "method": "melt"}', (4, -32601, "Method not found: melt")),
    ('{"jsonrpc": "2.0", "id": 5, "method": "subscribe", "params": []}', (5, -32602, "Invalid params: 'params' must be an object")),
    ('{"jsonrpc": "2.0", "id": 6, "method": "subscribe", "params": {"kind": "proof_state", "filters": ["x"]}}',
     (6, -32602, "Invalid params: 'subId' must be a non-empty string")),
    ('{"jsonrpc": "2.0", "id": 7, "method": "subscribe", "params": {"kind": "bolt13_quote", "filters": ["x"], "subId": "s"}}',
     (7, -32602, "Invalid params: unsupported kind 'bolt13_quote'; supported: bolt11_melt_quote, bolt11_mint_quote, "
                 "bolt12_melt_quote, bolt12_mint_quote, proof_state")),
    ('{"jsonrpc": "2.0", "id": 8, "method": "subscribe", "params": {"kind": "proof_state", "subId": "s"}}',
     (8, -32602, "Invalid params: 'filters' must be a non-empty array of strings")),
    ('{"jsonrpc": "2.0", "id": 9, "method": "subscribe", "params": {"kind": "bolt11_mint_quote", "subId": "s", '
     '"filters": ["a", "b", "c", "d", "e", "f"]}}', (9, -32602, "Invalid params: 6 filters; at most 5 per subscription")),
    ('{"jsonrpc": "2.0", "id": 10, "method": "subscribe", "params": {"kind": "proof_state", "subId": "s", "filters": ["abc"]}}',
     (10, -32602, "Invalid params: filters[0] is not a proof Y (33-byte compressed point, 66 hex digits)")),
    ('{"jsonrpc": "2.0", "id": 11, "method": "unsubscribe", "params": {"subId": "never"}}',
     (11, -32602, "Invalid params: subscription not found: never")),
])
def test_every_bad_request_gets_its_json_rpc_error(cashu, frame, expected):
    (ws_url, _), _ = endpoints(cashu)

    async def scenario():
        wallet = await Wallet.open(ws_url)
        await wallet.ws.send(frame)
        reply = await wallet.recv()
        request_id, code, message = expected
        assert set(reply) == {"jsonrpc", "error", "id"} and reply["id"] == request_id
        assert reply["error"]["code"] == code
        if message is None:
            assert reply["error"]["message"].startswith("Parse error: ")
        else:
            assert reply["error"]["message"] == message
        await wallet.quiet()  # the connection stays usable
        await wallet.close()

    run(scenario())


def test_limits_per_connection(cashu):
    (ws_url, _), _ = endpoints(cashu)

    async def scenario():
        wallet = await Wallet.open(ws_url)
        await wallet.expect_ok(await wallet.subscribe("bolt11_mint_quote", [fresh()], "dup"), "dup")
        request_id = await wallet.subscribe("bolt11_mint_quote", [fresh()], "dup")
        assert await wallet.recv() == rpc_error(request_id, -32602,
                                                "Invalid params: subId 'dup' is already in use on this connection")
        for index in range(3):
            quotes = [fresh() for _ in range(3)]
            await wallet.expect_ok(await wallet.subscribe("bolt11_mint_quote", quotes, f"s{index}"), f"s{index}")
        request_id = await wallet.subscribe("bolt11_mint_quote", [fresh()], "fifth")
        assert await wallet.recv() == rpc_error(request_id, -32602,
                                                "Invalid params: too many subscriptions; at most 4 per connection")
        await wallet.expect_ok(await wallet.send("unsubscribe", {"subId": "dup"}), "dup")
        request_id = await wallet.subscribe("bolt11_mint_quote", [fresh() for _ in range(4)], "over")
        assert await wallet.recv() == rpc_error(request_id, -32602,
                                                "Invalid params: too many filters; at most 12 per connection")
        big = json.dumps({"jsonrpc": "2.0", "id": 99, "method": "heartbeat", "pad": "x" * 5000})
        await wallet.ws.send(big)
        reply = await wallet.recv()
        assert reply == rpc_error(None, -32600, f"Invalid Request: message of {len(big)} bytes exceeds the limit of 4096 bytes")
        await wallet.quiet()
        await wallet.close()

    run(scenario())


def test_rate_limit_answers_with_limit_exceeded(cashu_quiet):
    (ws_url, _), = endpoints(cashu_quiet)

    async def scenario():
        wallet = await Wallet.open(ws_url)
        for request_id in range(5):
            await wallet.send("heartbeat", request_id=request_id)
        replies = [await wallet.recv() for _ in range(5)]
        assert replies[:3] == [{"jsonrpc": "2.0", "id": i, "result": "heartbeat"} for i in range(3)]
        refused = replies[3]
        assert refused["id"] is None and refused["error"]["code"] == -32005
        assert refused["error"]["message"].startswith("Rate limit exceeded: at most 2 requests per second; retry in ")
        await wallet.close()

    run(scenario())


def test_unknown_proof_state_can_be_configured_to_send_nothing(cashu_quiet):
    (ws_url, _), = endpoints(cashu_quiet)

    async def scenario():
        wallet = await Wallet.open(ws_url)
        await wallet.expect_ok(await wallet.subscribe("proof_state", [Y2], "p"), "p")
        await wallet.quiet()  # two requests: within this router's burst of three
        await wallet.close()

    run(scenario())


# -- idle connections --------------------------------------------------------------------------

def test_idle_connection_is_closed(cashu_quiet):
    (ws_url, _), = endpoints(cashu_quiet)

    async def scenario():
        wallet = await Wallet.open(ws_url)
        started = time.monotonic()
        await asyncio.wait_for(wallet.ws.wait_closed(), 10)
        assert time.monotonic() - started >= 1.4
        assert wallet.ws.close_code == 1001 and wallet.ws.close_reason == "idle for 1.5 s"

    run(scenario())


def test_websocket_pings_keep_a_connection_alive(cashu_quiet):
    (ws_url, _), = endpoints(cashu_quiet)

    async def scenario():
        wallet = await Wallet.open(ws_url, ping_interval=0.3, ping_timeout=5)
        deadline = time.monotonic() + 3.5  # more than twice the idle timeout, without a message
        while time.monotonic() < deadline:
            assert wallet.ws.close_code is None
            await asyncio.sleep(0.25)
        await wallet.quiet()
        await wallet.close()

    run(scenario())


# -- the state feed and NUT-06 info ------------------------------------------------------------

def http(method: str, url: str, body: bytes | None = None, headers: dict | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_state_feed_authentication_and_validation(cashu, cashu_quiet):
    (_, http_url), _ = endpoints(cashu)
    (_, quiet_url), = endpoints(cashu_quiet)
    body = json.dumps({"kind": "bolt11_mint_quote", "payload": mint_quote("auth", "PAID")}).encode()
    assert http("POST", quiet_url + "/v1/ws/state", body, {"Authorization": f"Bearer {API_KEY}"}) == (403, {
        "error": "feed_disabled", "message": "the state feed is off: set cashu.state_api_key to turn it on"})
    unauthorized = (401, {"error": "unauthorized",
                          "message": "send the state feed's API key as 'Authorization: Bearer <key>'"})
    assert http("POST", http_url + "/v1/ws/state", body) == unauthorized
    assert http("POST", http_url + "/v1/ws/state", body, {"Authorization": "Bearer wrong"}) == unauthorized
    assert http("POST", http_url + "/v1/ws/state", body, {"X-Api-Key": API_KEY})[0] == 200
    assert http("POST", http_url + "/v1/ws/state", b'{"kind": "proof_state", "payload": {"Y": "02", "state": "SPENT"}}',
                {"X-Api-Key": API_KEY}) == (400, {"error": "invalid_state",
                                                  "message": "payload.Y is not a 33-byte compressed point in hex"})
    with pytest.raises(FeedError) as caught:
        feed(http_url).push("bolt11_melt_quote", melt_quote("m", "ISSUED"))
    assert caught.value.status == 400
    assert caught.value.body["message"] == \
        "payload.state must be one of ['PAID', 'PENDING', 'UNPAID'] for bolt11_melt_quote"
    results = feed(http_url).push_many([("proof_state", proof_state(Y1, "SPENT")),
                                        ("bolt11_mint_quote", mint_quote("auth", "ISSUED"))])
    assert [(r["kind"], r["id"], r["stored"], r["version"]) for r in results] == [
        ("proof_state", Y1, True, 1), ("bolt11_mint_quote", "auth", True, 2)]


def test_info_advertises_nut17(cashu):
    (_, http_url), _ = endpoints(cashu)
    status, info = http("GET", http_url + "/v1/info")
    assert status == 200
    assert info == {"name": "ray-ws-router", "version": "ray-ws-router/0.1.0", "nuts": {"17": {"supported": [
        {"method": "bolt11", "unit": "sat", "commands": ["bolt11_mint_quote", "bolt11_melt_quote", "proof_state"]},
        {"method": "bolt12", "unit": "sat", "commands": ["bolt12_mint_quote", "bolt12_melt_quote", "proof_state"]},
    ]}}}


# -- the real wallet: @cashu/cashu-ts 4.8.0 ---------------------------------------------------

def test_cashu_ts_wallet_gets_quote_and_proof_updates(cashu):
    project = node_project("cashu-ts", ["@cashu/cashu-ts@4.8.0", "ws@8"], ["cashu_wallet.mjs"])
    (_, http_a), (_, http_b) = endpoints(cashu)
    quote = fresh("cashu-ts-")
    client = feed(http_a)
    client.push("bolt11_mint_quote", mint_quote(quote, "UNPAID"))
    wallet = subprocess.Popen(["node", "cashu_wallet.mjs", http_b, quote], cwd=project, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    events: list[dict] = []
    try:
        lines = _lines(wallet, deadline=time.monotonic() + 60)
        ys: dict[str, str] = {}
        for event in lines:
            events.append(event)
            kind = event["event"]
            if kind == "quote" and event["state"] == "UNPAID":
                client.push("bolt11_mint_quote", mint_quote(quote, "PAID"))
            elif kind == "proof" and event["state"] == "UNSPENT":
                ys[event["secret"]] = event["Y"]
                client.push("proof_state", {"Y": event["Y"], "state": "PENDING"})
                client.push("proof_state", proof_state(event["Y"], "SPENT"))
            if _done(events):
                break
    finally:
        wallet.kill()
        wallet.wait(10)
    assert _done(events), (events, wallet.stderr.read())
    quotes = [(e["quote"], e["state"]) for e in events if e["event"] == "quote"]
    assert quotes == [(quote, "UNPAID"), (quote, "PAID")]
    assert {"event": "paid", "quote": quote, "state": "PAID"} in events
    for secret in ("secret-one", "secret-two"):
        states = [e["state"] for e in events if e["event"] == "proof" and e["secret"] == secret]
        assert states == ["UNSPENT", "PENDING", "SPENT"]
        assert len(ys[secret]) == 66  # the Y cashu-ts computed (hash_to_curve of the secret), echoed back
    assert {"event": "error", "where": "bad request",
            "message": "Invalid params: filters[0] is longer than 256 characters"} in events
    assert not any(e["event"] == "unexpected" for e in events)


def _lines(process: subprocess.Popen, deadline: float):
    """JSON events printed by the wallet, until it exits or the deadline passes."""
    import selectors

    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ)
    while time.monotonic() < deadline:
        if not selector.select(timeout=max(0.0, deadline - time.monotonic())):
            return
        line = process.stdout.readline()
        if not line:
            return
        yield json.loads(line)


def _done(events: list[dict]) -> bool:
    spent = sum(1 for e in events if e["event"] == "proof" and e["state"] == "SPENT")
    return spent == 2 and any(e["event"] == "paid" for e in events) and any(e["event"] == "error" for e in events)


def test_router_cashu_push_command(cashu):
    (ws_url, http_url), _ = endpoints(cashu)
    router_bin = str(Path(sys.executable).with_name("router"))

    async def scenario():
        quote = fresh("cli-")
        wallet = await Wallet.open(ws_url)
        await wallet.expect_ok(await wallet.subscribe("bolt11_mint_quote", [quote], "cli"), "cli")
        done = await asyncio.to_thread(subprocess.run, [
            router_bin, "cashu", "push", "--url", http_url, "--key", API_KEY, "bolt11_mint_quote",
            json.dumps(mint_quote(quote, "PAID"))], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == {"kind": "bolt11_mint_quote", "id": quote, "stored": True, "version": 1,
                                           "subscribers": 1}
        assert await wallet.notification() == ("cli", mint_quote(quote, "PAID"))
        refused = await asyncio.to_thread(subprocess.run, [
            router_bin, "cashu", "push", "--url", http_url, "--key", "wrong", "proof_state", "{}"],
            capture_output=True, text=True, timeout=60)
        assert refused.returncode == 1
        assert refused.stderr.strip() == ("router cashu push: HTTP 401: send the state feed's API key as "
                                          "'Authorization: Bearer <key>'")
        await wallet.close()

    run(scenario())
