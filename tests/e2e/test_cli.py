"""The router started the way a user starts it: `router serve` joining Ray, `make serve`, `router status`."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path


from tests.e2e.client import HubClient, run
from tests.e2e.conftest import store_env

ROOT = Path(__file__).resolve().parents[2]
ROUTER = str(Path(sys.executable).with_name("router"))
READY_URL = re.compile(r"signal\s+(ws://\S+)")
HEALTH_LINE = re.compile(r"^\s+health\s+http://")
ENDPOINT = re.compile(r"signal\s+(ws://\S+)\s+\(gateway (\S+)\)")


class Served:
    """A `router serve` process, its output collected on a thread."""

    def __init__(self, command: list[str], env: dict[str, str] | None = None) -> None:
        env = env or {}
        if "ROUTER_DATA_DIR" in env:  # under --store postgresql, that data dir's schema
            env = {**store_env(env["ROUTER_DATA_DIR"]), **env}
        self.lines: list[str] = []
        self.process = subprocess.Popen(
            command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, **env}, start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, pattern: str, timeout: float) -> re.Match:
        """The first line matching ``pattern``, once the reading thread has it: a line the process
        printed before it exited may still be on its way to ``lines``."""
        deadline = time.monotonic() + timeout
        compiled = re.compile(pattern)
        while time.monotonic() < deadline:
            ended = self.process.poll() is not None and not self._reader.is_alive()  # before the look
            for line in list(self.lines):
                match = compiled.search(line)
                if match:
                    return match
            if ended:
                break
            time.sleep(0.05)
        raise AssertionError(f"{pattern!r} not seen in {timeout}s; output:\n" + "\n".join(self.lines))

    def signal_urls(self, gateways: int, timeout: float) -> list[str]:
        """The Signal Hub URLs ``router serve`` printed, once all of them are: it prints
        ``router: ready`` first, then each gateway's endpoints, a health line last."""
        self.wait_for(r"router: ready", timeout)
        deadline = time.monotonic() + timeout
        while sum(bool(HEALTH_LINE.match(line)) for line in list(self.lines)) < gateways:
            assert time.monotonic() < deadline and self.process.poll() is None, "\n".join(self.lines)
            time.sleep(0.05)
        return [m for line in list(self.lines) for m in READY_URL.findall(line)]

    def interrupt(self, timeout: float = 60) -> int:
        os.killpg(self.process.pid, signal.SIGINT)  # what Ctrl-C does in a terminal
        try:
            return self.process.wait(timeout)
        finally:
            self.kill()

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)


async def _hello(url: str) -> dict:
    client = await HubClient.open(url, "cli/probe")
    reply = await client.request("hub:heartbeat", {})
    await client.close()
    return reply


def test_router_serve_joins_a_running_cluster_and_stops_on_ctrl_c(ray_runtime, tmp_path):
    served = Served([ROUTER, "serve", "--address", ray_runtime, "--namespace", "e2e-cli", "--port", "0",
                     "--gateways", "2"], env={"ROUTER_RAY_DASHBOARD": "false", "ROUTER_DATA_DIR": str(tmp_path)})
    try:
        urls = served.signal_urls(2, 120)
        assert len(urls) == 2
        for url in urls:
            assert run(_hello(url))["type"] == "hub:heartbeat_ack"

        # A gateway killed: the supervisor replaces it on the port it had (an ephemeral one here: the
        # clients reconnect where they were) and prints where its gateways listen now.
        import ray

        from router.shardmap import gateway_name

        doomed = ENDPOINT.search(next(line for line in served.lines if urls[1] in line))[2]
        ray.kill(ray.get_actor(gateway_name(doomed), namespace="e2e-cli"), no_restart=True)
        served.wait_for(r"^router: a gateway was replaced; listening:$", 60)
        start = served.lines.index("router: a gateway was replaced; listening:") + 1
        deadline = time.monotonic() + 30
        while sum(bool(HEALTH_LINE.match(line)) for line in served.lines[start:]) < 2:
            assert time.monotonic() < deadline and served.process.poll() is None, "\n".join(served.lines)
            time.sleep(0.05)
        now = [found.groups() for line in served.lines[start:] if (found := ENDPOINT.search(line))]
        assert [url for url, _ in now] == urls
        assert now[0][1] == ENDPOINT.search(next(line for line in served.lines if urls[0] in line))[2]
        assert now[1][1] != doomed and now[1][1].startswith("any-1-")
        for url in urls:
            assert run(_hello(url))["type"] == "hub:heartbeat_ack"

        status = subprocess.run(
            [ROUTER, "status", "--address", ray_runtime, "--namespace", "e2e-cli", "--json"],
            cwd=ROOT, capture_output=True, text=True, timeout=120,
        )
        assert status.returncode == 0, status.stderr
        report = json.loads(status.stdout)
        assert len(report["gateways"]) == 2
        assert sorted(shard["name"] for shard in report["shards"]) == [
            "document-shard-0", "document-shard-1", "query-shard-0", "query-shard-1",
            "registry-shard-0", "registry-shard-1", "session-shard-0", "session-shard-1",
            "topic-shard-0", "topic-shard-1",
        ]
        assert served.interrupt() == 0
        served.wait_for(r"^router: stopped$", 30)
    finally:
        served.kill()


def test_invalid_configuration_fails_at_start_naming_the_field():
    result = subprocess.run([ROUTER, "serve"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                            env={**os.environ, "ROUTER_SIGNAL__HEARTBEAT_TIMEOUT_S": "soon"})
    assert result.returncode == 2
    assert "invalid configuration:" in result.stderr
    assert "signal.heartbeat_timeout_s: Input should be a valid number" in result.stderr


def test_make_serve_starts_an_embedded_router_that_answers_a_signal_hub_client(tmp_path):
    served = Served(["make", "serve", "ARGS=--port 0 --namespace e2e-make"],
                    env={"ROUTER_RAY_DASHBOARD": "false", "ROUTER_DATA_DIR": str(tmp_path)})
    try:
        (url,) = served.signal_urls(1, 180)
        assert run(_hello(url))["type"] == "hub:heartbeat_ack"
        served.interrupt()
        served.wait_for(r"^router: stopped$", 30)
    finally:
        served.kill()


def test_shards_outlive_the_router_that_created_them_and_router_stop_ends_the_rest(ray_runtime, tmp_path):
    """Two `router serve` on one cluster: SIGKILL the first (it created the shards, and its gateways
    end with it). The shards stay, the second router serves on, and the dead gateway's Signal
    registrations are purged on every shard at once (not left to their TTL). `router stop` then
    ends the second router and removes every actor of the namespace."""
    import ray

    namespace = "e2e-two-routers"
    env = {"ROUTER_RAY_DASHBOARD": "false", "ROUTER_DATA_DIR": str(tmp_path)}
    command = [ROUTER, "serve", "--address", ray_runtime, "--namespace", namespace, "--port", "0"]
    creator = Served(command, env)
    joiner = None
    try:
        (creator_url,) = creator.signal_urls(1, 120)
        joiner = Served(command, env)
        (joiner_url,) = joiner.signal_urls(1, 120)

        async def register(url: str, address: str) -> HubClient:
            client = await HubClient.open(url, address)
            reply = await client.request("hub:register", {"actorAddress": address, "ttl": 3_600_000})
            assert reply["type"] == "hub:registered", reply
            return client

        async def discovered(client: HubClient) -> list[str]:
            found = await client.request("hub:discover", {"pattern": "^two/"})
            assert found["type"] == "hub:discovery_result", found
            return [actor["actorAddress"] for actor in found["payload"]["actors"]]

        async def scenario() -> float:
            await register(creator_url, "two/doomed")  # left open: its gateway dies under it
            survivor = await register(joiner_url, "two/survivor")
            observer = await HubClient.open(joiner_url, "two/observer")
            assert await discovered(observer) == ["two/doomed", "two/survivor"]
            creator.kill()  # SIGKILL: no clean stop, and no supervisor left for its gateway
            started = time.monotonic()
            while await discovered(observer) != ["two/survivor"]:
                assert time.monotonic() - started < 30, "the dead gateway's registration is still there"
                await asyncio.sleep(0.1)
            waited = time.monotonic() - started
            await observer.send("hub:send", {"still": "here"}, to="two/survivor")
            assert (await survivor.recv())["payload"] == {"still": "here"}  # the shards lived on
            await survivor.close()
            await observer.close()
            return waited

        assert run(scenario()) < 30  # a TTL of an hour would say otherwise
        stopped = subprocess.run([ROUTER, "stop", "--address", ray_runtime, "--namespace", namespace],
                                 cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert stopped.returncode == 0, stopped.stderr
        assert re.search(r"stopped 1 gateway\(s\) and \d+ shard\(s\)", stopped.stdout), stopped.stdout
        assert joiner.process.wait(60) == 0
        joiner.wait_for(r"^router: stopped$", 30)
        deadline = time.monotonic() + 30
        while [entry for entry in ray.util.list_named_actors(all_namespaces=True)
               if entry.get("namespace") == namespace]:
            assert time.monotonic() < deadline, "actors left in the namespace"
            time.sleep(0.1)
    finally:
        creator.kill()
        if joiner is not None:
            joiner.kill()
