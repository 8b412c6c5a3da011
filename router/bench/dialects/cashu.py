"""Cashu NUT-17 in ``router bench``: wallets subscribed to quotes, the mint's states pushed to them.

A mint pushes each quote's new state through ``POST /v1/ws/state`` (API key); the router stores
it and notifies every wallet subscription to the quote. Two scenarios of its own:

- ``notify`` (flooded): ``cashu.connections`` wallet connections (100) holding
  ``cashu.subscriptions`` subscriptions (1,000), each to one of ``cashu.objects`` mint quotes
  (100; so 10 subscriptions per quote), receive ``cashu.rounds`` states of every quote (default:
  ``--deliveries`` notifications in all). A pusher process sends the states in requests of
  ``cashu.batch`` (100) with ``cashu.concurrency`` (4) requests in flight, over plain HTTP/1.1
  keep-alive connections (a few bytes of parsing per request: it is never the bottleneck); the
  receivers count notifications by their frame headers. Value: notifications/s; received must
  equal expected.
- ``latency``: the same wallets (``--latency-subscribers`` connections) and quotes, states pushed
  at ``--rate`` states/s for ``--latency-seconds``, one state per request, each carrying its
  intended send time in the quote's ``request`` field (which the router passes through as the
  mint wrote it); the receivers read it in the notification: push → notification p50/p99/p99.9.

Before a case the mint's current state of every quote (UNPAID) is pushed, so each subscription
gets its OK and then the quote's current state (NUT-17: current state first), as a wallet does.
Shared scenarios: ``connections`` and ``churn`` (a churn cycle subscribes to a quote nobody
pushed: OK only).

Parameters (``--param``): ``cashu.connections``, ``cashu.subscriptions``, ``cashu.objects``,
``cashu.rounds``, ``cashu.batch``, ``cashu.concurrency``, ``cashu.nutshell_rounds``.

The peer ``nutshell``: the reference mint's own NUT-17 WebSocket (Nutshell, PyPI ``cashu``) with
its fake Lightning backend, in the same run (``--systems nutshell,router``); it runs ``notify``
and ``churn``. Nutshell has no state feed: a quote's state changes when the mint learns its
invoice is paid, once per quote (UNPAID → PAID). FakeWallet is set never to pay on its own, and
``GET /v1/mint/quote/bolt11/{id}`` asks the backend, which answers "paid", so the mint stores
PAID and notifies every subscription to the quote: the pusher "pays" quotes from outside. As a
quote is paid only once, round r of a quote is a quote of its own (created before the case, at
about 50 quotes/s here: each is a bolt11 invoice signed and a row written), and each subscription
holds one filter per round; ``cashu.nutshell_rounds`` (5) rounds, so 5,000 notifications by
default. Nutshell often notifies a paid quote twice (its invoice listener notifies again what the
payment check has just stored): its wallets read every notification and count each
subscription's PAID once (``repeated``: the others). On this 2-core machine (Nutshell 0.20.2,
SQLite, pinned to one core, 4 payments in flight) it pays about 100 quotes/s at 98 % CPU:
about 1,000 notifications/s with 10 subscriptions per quote. It does not run ``latency``
(states cannot be offered at 1,000/s: a payment costs the mint about 10 ms, so the figure would
be its queue, and each state needs a quote made in advance) nor ``connections`` (Nutshell
refuses a 1,001st WebSocket client, ``MAX_CLIENTS``).
Install it outside the project's environment (cashu 0.20.2 pins websockets<13, the router needs 15+), e.g.::

    python3 -m venv /opt/nutshell
    /opt/nutshell/bin/pip install cashu 'marshmallow<4' 'limits<4'
    NUTSHELL_MINT=/opt/nutshell/bin/mint router bench notify --dialect cashu --systems nutshell,router

(``marshmallow<4`` and ``limits<4``: cashu 0.20.2 does not start with the newest of either.)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import orjson

from router.bench import loadgen
from router.bench.dialects import Profile, register
from router.bench.report import delivery_rate
from router.bench.scenarios import Case, Options, latency_row, scalar, split
from router.bench.systems import System, Unavailable, SubprocessSystem
from router.bench.wire import HANDLE, WsClient, split_url, stamp
from router.proc import free_port

API_KEY = "router-bench-state-feed"
KIND = "bolt11_mint_quote"
FEED_PATH = "/v1/ws/state"
NUTSHELL_ENV = "NUTSHELL_MINT"  # the Nutshell ``mint`` executable


# -- the load generators' side -----------------------------------------------------------------

def _filters(topic: str | list[str]) -> list[str]:
    return [topic] if isinstance(topic, str) else list(topic)


class CashuDialect(loadgen.Dialect):
    """NUT-17 JSON-RPC: a ``subscribe`` per topic (a topic is a quote id, or a list of them: one
    subscription with several filters), answered by an OK and, when the spec says the quotes
    exist (``initial``), each quote's current state."""

    name = "cashu"

    async def subscribe(self, client: WsClient, name: str, topics: list) -> None:
        filters = 0
        for index, topic in enumerate(topics):
            quotes = _filters(topic)
            filters += len(quotes)
            client.send(orjson.dumps({"jsonrpc": "2.0", "id": index, "method": "subscribe",
                                      "params": {"kind": KIND, "filters": quotes, "subId": f"s{index}"}}))
        replies = await client.messages(len(topics) + (filters if self.spec.get("initial") else 0))
        accepted = sum(1 for reply in replies if b'"result"' in reply and b'"OK"' in reply)
        if accepted != len(topics):
            refused = next((reply for reply in replies if b'"error"' in reply), replies[:1])
            raise RuntimeError(f"subscribe refused: {refused!r}")


loadgen.DIALECTS["cashu"] = CashuDialect


class HttpConnection(asyncio.Protocol):
    """One HTTP/1.1 keep-alive connection, one request at a time; answers are read by their
    ``Content-Length`` (both servers send it), nothing else is parsed."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.waiter: asyncio.Future | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError("connection closed before the answer"))

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer
        buffer += data
        end = buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        lines = bytes(buffer[:end]).split(b"\r\n")
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if len(buffer) < end + 4 + length:
            return
        status = int(lines[0].split()[1])
        body = bytes(buffer[end + 4:end + 4 + length])
        del buffer[:end + 4 + length]
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result((status, body))

    async def request(self, data: bytes, timeout: float = 30) -> tuple[int, bytes]:
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        return await asyncio.wait_for(self.waiter, timeout)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


async def open_http(base: str) -> HttpConnection:
    host, port, _ = split_url(base)
    _, connection = await asyncio.wait_for(
        asyncio.get_running_loop().create_connection(HttpConnection, host, port), 30)
    return connection


def http_request(method: str, base: str, path: str, body: bytes = b"", api_key: str | None = None) -> bytes:
    host, port, _ = split_url(base)
    head = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}"]
    if api_key is not None:
        head.append(f"Authorization: Bearer {api_key}")
    if body:
        head += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def quote_state(quote: str, marker: str = "", state: str = "PAID") -> dict[str, Any]:
    """A bolt11 mint quote as a mint pushes it, ``PAYLOAD_BYTES`` long: ``request`` (the invoice,
    here padding) carries the latency stamp when there is one."""
    payload = {"quote": quote, "request": "", "state": state, "amount": 100, "unit": "sat"}
    room = loadgen.PAYLOAD_BYTES - len(orjson.dumps(payload))
    payload["request"] = marker + "x" * max(0, room - len(marker))
    return payload


class Pusher:
    """The mint's side: states pushed over HTTP/1.1 keep-alive connections (``concurrency`` of
    them, one request in flight each). ``mode`` ``feed``: the router's state feed, ``rounds``
    states of every quote in requests of ``batch``, or (``rate``) ``messages`` single-state
    requests at a fixed rate, each stamped with its intended send time. ``mode`` ``nutshell``:
    ``GET /v1/mint/quote/bolt11/{id}`` of every quote of ``rounds`` (the mint learns it is paid)."""

    @staticmethod
    async def setup(dialect: loadgen.Dialect, spec: dict[str, Any]) -> dict[str, Any]:
        bases, requests = spec["http"], []
        if spec["mode"] == "nutshell":
            requests = [(f"GET /v1/mint/quote/bolt11/{quote}", 1, http_request("GET", bases[0],
                                                                            f"/v1/mint/quote/bolt11/{quote}"))
                        for round_ in spec["rounds"] for quote in round_]
        elif not spec.get("rate"):
            quotes, batch = spec["quotes"], spec["batch"]
            states = [quote_state(quote) for quote in quotes]
            for _ in range(spec["rounds"]):
                for offset in range(0, len(quotes), batch):
                    chunk = [{"kind": KIND, "payload": payload} for payload in states[offset:offset + batch]]
                    body = orjson.dumps({"states": chunk})
                    requests.append((FEED_PATH, len(chunk), http_request("POST", bases[0], FEED_PATH, body,
                                                                         spec["api_key"])))
        return {"requests": requests, "connections": []}

    @staticmethod
    async def run(dialect: loadgen.Dialect, spec: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
        bases = spec["http"]
        connections = state["connections"]
        for index in range(spec["concurrency"]):
            connections.append(await open_http(bases[index % len(bases)]))
        started = time.monotonic()
        if spec.get("rate"):
            sent = await Pusher._at_rate(spec, connections)
        else:
            sent = await Pusher._flood(state["requests"], connections)
        return {"sent": sent, "start": started, "end": time.monotonic()}

    @staticmethod
    async def _flood(requests: list[tuple[str, int, bytes]], connections: list[HttpConnection]) -> int:
        pending = iter(requests)
        sent = [0]

        async def loop(connection: HttpConnection) -> None:
            for what, states, data in pending:
                status, body = await connection.request(data)
                if status != 200:
                    raise RuntimeError(f"{what}: HTTP {status}: {body[:200]!r}")
                sent[0] += states

        await asyncio.gather(*(loop(connection) for connection in connections))
        return sent[0]

    @staticmethod
    async def _at_rate(spec: dict[str, Any], connections: list[HttpConnection]) -> int:
        """One state per request, quote ``i % len(quotes)``, stamped with its intended send time
        (a push that waits for a free connection is late by that much: no coordinated omission)."""
        quotes, messages, base, key = spec["quotes"], spec["messages"], spec["http"][0], spec["api_key"]
        free: asyncio.Queue[HttpConnection] = asyncio.Queue()
        for connection in connections:
            free.put_nowait(connection)
        failures: list[str] = []

        async def push(connection: HttpConnection, data: bytes) -> None:
            try:
                status, body = await connection.request(data)
                if status != 200:
                    failures.append(f"HTTP {status}: {body[:200]!r}")
            except (ConnectionError, asyncio.TimeoutError) as error:
                failures.append(f"{type(error).__name__}: {error}")
            finally:
                free.put_nowait(connection)

        tasks = []
        async for index, due in loadgen.paced(messages, spec["rate"]):
            body = orjson.dumps({"kind": KIND, "payload": quote_state(quotes[index % len(quotes)], stamp(due))})
            connection = await free.get()
            tasks.append(asyncio.ensure_future(push(connection, http_request("POST", base, FEED_PATH, body, key))))
            if failures:
                break
        await asyncio.gather(*tasks)
        if failures:
            raise RuntimeError(f"state push refused: {failures[0]}")
        return messages

    @staticmethod
    def close(state: dict[str, Any]) -> None:
        for connection in state["connections"]:
            connection.close()


loadgen.ROLES["cashu_pusher"] = Pusher


class NutshellWallets(loadgen.Subscribers):
    """Wallets that read each notification: a quote's PAID counts once per subscription.
    Nutshell sometimes notifies a paid quote twice (its invoice listener notifies again what the
    payment check has just stored); the repeats are reported, not counted."""

    @staticmethod
    async def setup(dialect: loadgen.Dialect, spec: dict[str, Any]) -> dict[str, Any]:
        state = await loadgen.Subscribers.setup(dialect, spec)
        state["repeated"] = [0]
        for client in state["clients"]:
            client.handler = NutshellWallets._handler(state["repeated"])
            client.mode = HANDLE
        return state

    @staticmethod
    def _handler(repeated: list[int]) -> Any:
        seen: set[tuple[str, str]] = set()

        def handle(frame: bytes) -> int:
            params = orjson.loads(frame).get("params") or {}
            payload = params.get("payload") or {}
            if payload.get("state") != "PAID":
                return 0
            key = (params.get("subId"), payload.get("quote"))
            if key in seen:
                repeated[0] += 1
                return 0
            seen.add(key)
            return 1

        return handle

    @staticmethod
    async def run(dialect: loadgen.Dialect, spec: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
        return {**await loadgen.Subscribers.run(dialect, spec, state), "repeated": state["repeated"][0]}


loadgen.ROLES["nutshell_wallets"] = NutshellWallets
RECEIVERS = ("Subscribers", "NutshellWallets")


# -- the orchestrator's side -------------------------------------------------------------------

def _layout(connections: int, subscriptions: int, objects: int) -> list[list[int]]:
    """Quote indexes each wallet connection subscribes to (one subscription each): every quote
    gets subscriptions/objects subscribers, spread over the connections."""
    per = max(1, subscriptions // connections)
    return [[(connection * per + n) % objects for n in range(per)] for connection in range(connections)]


def _push_initial(system: System, quotes: list[str]) -> None:
    """The mint's current state of every quote (UNPAID), so a subscription gets it first."""
    from gateways.cashu.feed import StateFeed

    config = system.client_config()
    feed = StateFeed(config["http"][0], config["api_key"])
    for offset in range(0, len(quotes), 500):
        feed.push_many([(KIND, quote_state(quote, state="UNPAID")) for quote in quotes[offset:offset + 500]])


def _prefix() -> str:
    """Quote ids new to the system: cases of one run share a router."""
    return f"bench-{uuid.uuid4().hex[:8]}-"


def notify_cases(options: Options) -> list[Case]:
    connections = scalar(options, "cashu.connections", 100)
    subscriptions = scalar(options, "cashu.subscriptions", 1000)
    objects = scalar(options, "cashu.objects", 100)
    rounds = scalar(options, "cashu.rounds", max(1, options.deliveries // subscriptions))
    batch = scalar(options, "cashu.batch", 100)
    concurrency = scalar(options, "cashu.concurrency", 4)
    nutshell_rounds = scalar(options, "cashu.nutshell_rounds", 5)
    layout = _layout(connections, subscriptions, objects)
    subscribed = sum(len(indexes) for indexes in layout)

    def rounds_on(system: System) -> int:
        return min(rounds, nutshell_rounds) if isinstance(system, NutshellSystem) else rounds

    def jobs(system: System) -> list[tuple[str, dict[str, Any]]]:
        states = rounds_on(system)
        if isinstance(system, NutshellSystem):  # a quote per round: each subscription holds one filter per round
            created = system.create_quotes(objects * states)
            by_round = [created[r * objects:(r + 1) * objects] for r in range(states)]
            topics: list = [[by_round[r][index] for r in range(states)] for index in range(objects)]
            pusher = {"mode": "nutshell", "rounds": by_round}
            role = "nutshell_wallets"
        else:
            prefix = _prefix()
            topics = [f"{prefix}{index}" for index in range(objects)]
            _push_initial(system, topics)
            pusher = {"mode": "feed", "quotes": topics, "rounds": rounds, "batch": batch}
            role = "subscribers"
        urls = system.urls()
        wallets = [{"url": urls[c % len(urls)], "name": f"bench/w{c}", "topics": [topics[index] for index in indexes]}
                   for c, indexes in enumerate(layout)]
        out = [(role, {"connections": group, "expected": sum(len(w["topics"]) for w in group) * states,
                       "initial": True})
               for group in split(wallets, options.procs)]
        config = system.client_config()
        out.append(("cashu_pusher", {**pusher, "http": config["http"], "api_key": config.get("api_key"),
                                     "concurrency": concurrency}))
        return out

    def summarise(system: System, results: list[dict[str, Any]], measured: dict[str, Any]) -> dict[str, Any]:
        receivers = [r for r in results if r["role"] in RECEIVERS]
        pushed = sum(r.get("sent", 0) for r in results if r["role"] == "Pusher")
        received, rate = delivery_rate(receivers)
        expected = sum(r["expected"] for r in receivers)
        busy = [r for r in receivers if r.get("received")]
        window = max(r["last"] for r in busy) - min(r["first"] for r in busy) if busy else 0
        row = {"value": round(rate), "received": received, "expected": expected, "states_pushed": pushed,
               "states_per_s": round(pushed / window) if window > 0 else 0, "subscriptions": subscribed,
               "rounds": rounds_on(system)}
        notes = [f"{pushed:,} states, {row['states_per_s']:,}/s"]
        if isinstance(system, NutshellSystem):
            row["repeated"] = sum(r.get("repeated", 0) for r in receivers)
            notes.append(f"{row['rounds']} rounds of fresh quotes (a quote is paid once)")
            if row["repeated"]:
                notes.append(f"{row['repeated']:,} PAID notified twice (not counted)")
        if received < expected:
            notes.append(f"{expected - received:,} of {expected:,} not received")
        row["notes"] = "; ".join(notes)
        return row

    case = f"{connections} wallets x {subscribed:,} subs, {objects} quotes"
    return [Case("notify", case, "notifications/s", jobs, summarise)]


def latency_cases(options: Options) -> list[Case]:
    connections = options.latency_subscribers
    subscriptions = scalar(options, "cashu.subscriptions", 1000)
    objects = scalar(options, "cashu.objects", 100)
    concurrency = scalar(options, "cashu.concurrency", 4)
    messages = int(options.rate * options.latency_seconds)
    layout = _layout(connections, subscriptions, objects)
    per_quote = [messages // objects + (1 if index < messages % objects else 0) for index in range(objects)]

    def jobs(system: System) -> list[tuple[str, dict[str, Any]]]:
        prefix = _prefix()
        quotes = [f"{prefix}{index}" for index in range(objects)]
        _push_initial(system, quotes)
        urls = system.urls()
        wallets = [{"url": urls[c % len(urls)], "name": f"bench/l{c}", "topics": [quotes[index] for index in indexes],
                    "expected": sum(per_quote[index] for index in indexes)}
                   for c, indexes in enumerate(layout)]
        out = [("subscribers", {"connections": group, "expected": sum(w["expected"] for w in group),
                                "initial": True, "latency": True})
               for group in split(wallets, options.procs)]
        config = system.client_config()
        out.append(("cashu_pusher", {"mode": "feed", "quotes": quotes, "messages": messages, "rate": options.rate,
                                     "http": config["http"], "api_key": config["api_key"], "concurrency": concurrency}))
        return out

    def summarise(system: System, results: list[dict[str, Any]], measured: dict[str, Any]) -> dict[str, Any]:
        row = latency_row([r for r in results if r["role"] == "Subscribers"])
        row["states_pushed"] = sum(r.get("sent", 0) for r in results if r["role"] == "Pusher")
        return row

    case = f"{options.rate:,.0f} states/s x {sum(len(indexes) for indexes in layout):,} subs"
    return [Case("latency", case, "p99_ms", jobs, summarise)]


class CashuProfile(Profile):
    name = "cashu"
    shared = ("connections", "churn")

    def settings(self) -> dict[str, Any]:
        """The state feed on; per-connection limits and the rate limit far above any case; a
        wallet may stay silent for the whole run (load generators send no heartbeats)."""
        return {"cashu": {"state_api_key": API_KEY, "max_subscriptions": 100_000,
                          "max_filters_per_connection": 1_000_000, "rate_limit_per_second": 1e9,
                          "rate_limit_burst": 1_000_000, "idle_timeout_s": 3600, "max_outbound_bytes": 256 * 2**20}}

    def prepare(self, settings: Any) -> dict[str, Any]:
        return {"api_key": API_KEY}

    def plans(self) -> dict[str, Any]:
        return {"notify": notify_cases, "latency": latency_cases}

    def peers(self, pin: int | None) -> list[Any]:
        return [NutshellSystem(pin)]


# -- the peer: Nutshell ------------------------------------------------------------------------

def _nutshell_command() -> list[str]:
    configured = os.environ.get(NUTSHELL_ENV)
    if configured:
        if not (Path(configured).is_file() and os.access(configured, os.X_OK)):
            raise Unavailable(f"{NUTSHELL_ENV}={configured} is not an executable (the Nutshell 'mint' command)")
        return [configured]
    import importlib.util

    if importlib.util.find_spec("cashu") is not None:
        return [sys.executable, "-m", "cashu.mint"]
    raise Unavailable(
        f"the Nutshell mint (PyPI cashu) is not installed; install it in a venv of its own "
        f"(python3 -m venv /opt/nutshell && /opt/nutshell/bin/pip install cashu 'marshmallow<4' 'limits<4') "
        f"and set {NUTSHELL_ENV}=/opt/nutshell/bin/mint")


class NutshellSystem(SubprocessSystem):
    """Nutshell, the reference Cashu mint, with FakeWallet, SQLite and no rate limit, on loopback;
    see the module docstring for how its states are driven and what it runs."""

    name = "nutshell"
    dialect = "cashu"
    SCENARIOS = ("notify", "churn")

    def accepts(self, case: Any) -> bool:
        return case.dialect == "cashu" and case.scenario in self.SCENARIOS

    def start(self) -> None:
        command = _nutshell_command()
        self.port = free_port()
        self.directory = tempfile.mkdtemp(prefix="router-bench-nutshell-")
        settings = {
            "DEBUG": "FALSE", "LOG_LEVEL": "WARNING", "CASHU_DIR": self.directory,
            "MINT_BACKEND_BOLT11_SAT": "FakeWallet", "MINT_LISTEN_HOST": "127.0.0.1",
            "MINT_LISTEN_PORT": str(self.port), "MINT_PRIVATE_KEY": "router-bench",
            "MINT_DATABASE": f"{self.directory}/mint", "MINT_RATE_LIMIT": "FALSE",
            # The backend never pays on its own: a quote is paid when the pusher asks for it.
            "FAKEWALLET_DELAY_INCOMING_PAYMENT": "86400",
        }
        # Nutshell reads .env from its working directory (over the environment, and over ~/.cashu/.env).
        Path(self.directory, ".env").write_text("".join(f"{key}={value}\n" for key, value in settings.items()))
        self.log = open(Path(self.directory, "mint.log"), "wb")
        self.process = subprocess.Popen([*command, "--port", str(self.port), "--host", "127.0.0.1"],
                                        cwd=self.directory, env={**os.environ, **settings}, stdout=self.log,
                                        stderr=subprocess.STDOUT, start_new_session=True)
        self._wait_ready()
        self._pin()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{self.base}/v1/info", timeout=2) as response:
                    self.info = json.loads(response.read())
                    return
            except (OSError, ValueError):
                if time.monotonic() > deadline or self.process.poll() is not None:
                    # A peer the user installs: one that will not start is skipped with its last
                    # word, and the run goes on (it ended the whole run, minutes in, before).
                    lines = Path(self.directory, "mint.log").read_bytes().decode(errors="replace").splitlines()
                    last = next((line.strip() for line in reversed(lines) if line.strip()), "no output")
                    exited = self.process.poll()
                    why = "no answer in 60 s" if exited is None else f"exit status {exited}"
                    self.stop()
                    raise Unavailable(f"the Nutshell mint did not start ({why}: {last[:300]}); "
                                      f"its venv needs cashu 'marshmallow<4' 'limits<4'")
                time.sleep(0.2)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def create_quotes(self, count: int) -> list[str]:
        """``count`` new mint quotes (UNPAID), 4 requests in flight (more and SQLite's lock times
        out); a refused request is tried again, a few times."""
        def one(_: int) -> str:
            for attempt in range(5):
                request = urllib.request.Request(f"{self.base}/v1/mint/quote/bolt11", method="POST",
                                                 data=b'{"amount": 1, "unit": "sat"}',
                                                 headers={"Content-Type": "application/json"})
                try:
                    with urllib.request.urlopen(request, timeout=30) as response:
                        return json.loads(response.read())["quote"]
                except urllib.error.HTTPError as error:
                    if attempt == 4:
                        raise RuntimeError(f"Nutshell refused a mint quote: HTTP {error.code} {error.read()[:200]!r}")
            raise AssertionError("unreachable")

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            return list(pool.map(one, range(count)))

    def client_config(self) -> dict[str, Any]:
        return {"http": [self.base]}

    def urls(self) -> list[str]:
        return [f"ws://127.0.0.1:{self.port}/v1/ws"]

    def stop(self) -> None:
        super().stop()
        if getattr(self, "log", None) is not None:
            self.log.close()
            self.log = None
        shutil.rmtree(getattr(self, "directory", ""), ignore_errors=True)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "version": getattr(self, "info", {}).get("version"),
                "backend": "FakeWallet", "database": "sqlite"}


register(CashuProfile())
