"""The router started the way a user starts it: `router serve` joining Ray, `make serve`, `router status`."""

from __future__ import annotations

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

ROOT = Path(__file__).resolve().parents[2]
ROUTER = str(Path(sys.executable).with_name("router"))
READY_URL = re.compile(r"signal\s+(ws://\S+)")


class Served:
    """A `router serve` process, its output collected on a thread."""

    def __init__(self, command: list[str], env: dict[str, str] | None = None) -> None:
        self.lines: list[str] = []
        self.process = subprocess.Popen(
            command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, **(env or {})}, start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, pattern: str, timeout: float) -> re.Match:
        deadline = time.monotonic() + timeout
        compiled = re.compile(pattern)
        while time.monotonic() < deadline:
            for line in list(self.lines):
                match = compiled.search(line)
                if match:
                    return match
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"{pattern!r} not seen in {timeout}s; output:\n" + "\n".join(self.lines))

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
        served.wait_for(r"router: ready", 120)
        urls = [m for line in served.lines for m in READY_URL.findall(line)]
        assert len(urls) == 2
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
        assert "router: stopped" in served.lines
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
        served.wait_for(r"router: ready", 180)
        url = next(m for line in served.lines for m in READY_URL.findall(line))
        assert run(_hello(url))["type"] == "hub:heartbeat_ack"
        served.interrupt()
        assert "router: stopped" in served.lines
    finally:
        served.kill()
