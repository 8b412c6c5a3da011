"""A Ray cluster of several nodes on this machine, with a router on each: the router as a cluster
runs it, for the tests (``tests/cluster/``) and benchmarks.

- **Nodes.** Each is a ``ray start --block`` process in a session of its own, with its own temp
  dir, ports and ``--num-cpus``; node 0 is the head. ``ray start`` rather than
  ``ray.cluster_utils.Cluster``: that one runs the nodes inside the calling process, which may
  already be a driver of another Ray (the test session's), and it cannot lose a node the way a
  machine does.
- **Token authentication stays on.** The cluster has a token of its own, in a file under its
  folder; every process started here gets ``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN_PATH`` (never
  ``~/.ray/auth_token``, which another Ray on this machine may use). :meth:`LocalCluster.env` is
  that environment for a command run beside it (``router status``, ``router analytics``).
- **Routers.** :meth:`LocalCluster.serve` starts ``router serve --address <gcs>`` for one node with
  ``ray_node`` set to that node's name: a driver attaches to the head's raylet whichever node it
  is meant for, so the gateways are pinned by name. The first router creates the shards: start it
  alone (:meth:`serve_all` does), once every node is up, so they are dealt round all of them.
- **A node lost** (:meth:`remove_node`) is a machine lost: SIGKILL at once to every process of the
  node's session (raylet, workers, agents) and to its router; Ray notices it missed the node's
  health checks and restarts the shards that ran there on the nodes left.
- **Logs.** Each node's Ray output is in ``<root>/node-<i>.log``, each router's in
  ``<root>/router-<node>-<n>.log`` (kept when ``root`` was given, as the tests give it).
- :meth:`stop` stops the routers one at a time (SIGINT, as Ctrl-C: the last one removes the shards),
  then the nodes, and raises if any process it started is still there.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from router.proc import free_ports

RAY = str(Path(sys.executable).with_name("ray"))
# A lost node is noticed after health_check_period_ms x health_check_failure_threshold: Ray's
# defaults (3 s x 5) leave the shards of a lost machine down for 15 s; a cluster on one machine
# has no slow network to forgive. docs/cluster.md says how to set it on a real head.
HEALTH_CHECK = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}
OBJECT_STORE_BYTES = 100 * 1024 * 1024  # per node; the router keeps nothing in the object store
READY = re.compile(r"^router: ready$")
ENDPOINT = re.compile(r"^\s+(\w+)\s+(ws://\S+)\s+\(gateway (\S+)\)$")
HEALTH = re.compile(r"^\s+health\s+(http://\S+)/health$")

# Run by a child process (this one may be a driver of another Ray, whose token it holds): the live
# nodes, by name, once ``count`` of them are up.
_LIVE_NODES = """
import json, sys, time
from ray._raylet import GcsClient
from ray.core.generated.gcs_pb2 import GcsNodeInfo

address, count, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
client = GcsClient(address=address)
deadline = time.monotonic() + timeout
while True:
    alive = {info.node_name: info.node_id.hex() for info in client.get_all_node_info(timeout=10).values()
             if info.state == GcsNodeInfo.GcsNodeState.ALIVE}
    if len(alive) >= count or time.monotonic() > deadline:
        print(json.dumps(alive))
        break
    time.sleep(0.2)
"""


def session_processes(session: int) -> list[int]:
    """Every live process of a session (what a node's or a router's start left running), by pid;
    zombies (dead, waiting to be reaped) are not counted."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                state, _, _, sid = stat.read().rsplit(")", 1)[1].split()[:4]
        except OSError:
            continue  # ended meanwhile
        if int(sid) == session and state != "Z":
            found.append(int(entry))
    return found


def _name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as comm:
            return f"{comm.read().strip()} ({pid})"
    except OSError:
        return str(pid)


def _kill_session(session: int) -> None:
    for pid in session_processes(session):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


class ClusterError(RuntimeError):
    """A node or a router did not start, or a process outlived :meth:`LocalCluster.stop`."""


@dataclass
class Node:
    index: int
    name: str
    process: subprocess.Popen  # `ray start --block`, the leader of the node's session
    temp_dir: Path  # its Ray logs: <temp_dir>/session_latest/logs
    node_id: str = ""


@dataclass
class RouterProcess:
    """A ``router serve`` of one node: its output as it came, and what its gateway serves."""

    node: int
    process: subprocess.Popen
    lines: list[str] = field(default_factory=list)
    endpoints: dict[str, str] = field(default_factory=dict)  # dialect -> ws:// URL
    http: str = ""  # http://host:port of its gateway's main port
    gateway: str = ""  # its gateway's id
    log: Path | None = None  # where its output is copied as it comes (it outlives a failed run)

    def _read(self) -> None:
        with open(self.log or os.devnull, "a") as copy:
            for line in self.process.stdout:
                copy.write(line)
                copy.flush()
                self._line(line.rstrip("\n"))

    def _line(self, line: str) -> None:
        self.lines.append(line)
        if match := ENDPOINT.match(line):
            self.endpoints[match[1]] = match[2]
            self.gateway = match[3]
        elif match := HEALTH.match(line):
            self.http = match[1]

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not any(READY.match(line) for line in list(self.lines)):
            if self.process.poll() is not None:
                raise ClusterError(f"the router of node {self.node} exited ({self.process.returncode}):\n"
                                   + "\n".join(self.lines))
            if time.monotonic() > deadline:
                raise ClusterError(f"the router of node {self.node} is not ready after {timeout_s:g} s:\n"
                                   + "\n".join(self.lines))
            time.sleep(0.05)
        # The endpoint lines follow "ready" at once; the health line ends them.
        while not self.http and self.process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)


class LocalCluster:
    """``nodes`` Ray nodes on this machine, and a router on each (see the module's docstring)."""

    def __init__(self, nodes: int, root: Path | None = None, num_cpus: int = 1,
                 system_config: Mapping[str, object] = HEALTH_CHECK) -> None:
        if nodes < 1:
            raise ValueError("a cluster needs at least one node")
        self.count = nodes
        self.num_cpus = num_cpus
        self.system_config = dict(system_config)
        self._own_root = root is None
        self.root = Path(root) if root is not None else Path(tempfile.mkdtemp(prefix="router-cluster-"))
        self._ray_root: Path | None = None  # the nodes' temp dirs (made by start)
        self.token_path = self.root / "ray-auth-token"
        self.nodes: list[Node] = []
        self.routers: list[RouterProcess] = []
        self.address = ""

    # -- the nodes ------------------------------------------------------------------------------

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment of a process that talks to this cluster: its token, and no other Ray's."""
        env = {key: value for key, value in os.environ.items()
               if key not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")}
        env.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(self.token_path),
                    "RAY_USAGE_STATS_ENABLED": "0", **(extra or {})})
        return env

    def start(self, timeout_s: float = 120) -> "LocalCluster":
        """Start the head, then the other nodes; returns once all of them are alive."""
        self.root.mkdir(parents=True, exist_ok=True)
        # Ray's Unix sockets live under each node's temp dir, and a socket path is at most 107 bytes.
        self._ray_root = Path(tempfile.mkdtemp(prefix="rlc-"))
        with open(os.open(self.token_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as file:
            file.write(secrets.token_hex(32))
        # every interface, as Ray's own ports; every node's picked together, all different: the
        # nodes share this machine's ports, and a port picked for one node and released could be
        # picked again for the next before the first binds it (that node then fails to start)
        ports = free_ports(7 + 4 * (self.count - 1), '')
        port, client, dashboard, *agents = ports[:7]
        self.address = f"127.0.0.1:{port}"
        try:
            self._start_node(0, ["--head", f"--port={port}", f"--ray-client-server-port={client}",
                                 f"--dashboard-port={dashboard}", "--include-dashboard=false",
                                 f"--system-config={json.dumps(self.system_config)}"], agents)
            self._wait_for_gcs(port, timeout_s)
            for index in range(1, self.count):
                self._start_node(index, [f"--address={self.address}"], ports[3 + 4 * index:7 + 4 * index])
            alive = self._live_nodes(self.count, timeout_s)
            for node in self.nodes:
                if node.name not in alive:
                    raise ClusterError(f"{node.name} did not join the cluster within {timeout_s:g} s; see "
                                       f"{self.root / (node.name + '.log')}")
                node.node_id = alive[node.name]
        except BaseException:
            self.stop()
            raise
        return self

    def _start_node(self, index: int, role: list[str], ports: list[int]) -> None:
        name = f"node-{index}"
        listen, grpc, metrics, runtime_env = ports
        temp_dir = self._ray_root / str(index)
        command = [RAY, "start", "--block", *role, f"--node-name={name}", f"--temp-dir={temp_dir}",
                   f"--num-cpus={self.num_cpus}", f"--object-store-memory={OBJECT_STORE_BYTES}",
                   "--min-worker-port=0", "--max-worker-port=0", f"--dashboard-agent-listen-port={listen}",
                   f"--dashboard-agent-grpc-port={grpc}", f"--metrics-export-port={metrics}",
                   f"--runtime-env-agent-port={runtime_env}", "--include-log-monitor=false",
                   "--disable-usage-stats"]
        # worker_niceness=0 as the embedded router (router/runtime.py); no drain on SIGTERM: stop()
        # has stopped the routers already, and a drain waits for detached actors that never leave.
        env = self.env({"RAY_worker_niceness": "0", "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"})
        with open(self.root / f"{name}.log", "w") as log:
            process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       start_new_session=True)
        self.nodes.append(Node(index, name, process, temp_dir))

    def _wait_for_gcs(self, port: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return
            except OSError:
                if self.nodes[0].process.poll() is not None or time.monotonic() > deadline:
                    raise ClusterError(f"the head did not start; see {self.root / 'node-0.log'}") from None
                time.sleep(0.1)

    def _live_nodes(self, count: int, timeout_s: float) -> dict[str, str]:
        done = subprocess.run([sys.executable, "-c", _LIVE_NODES, self.address, str(count), str(timeout_s)],
                              env=self.env(), capture_output=True, text=True, timeout=timeout_s + 60)
        if done.returncode != 0:
            raise ClusterError(f"could not list the nodes:\n{done.stderr}")
        return json.loads(done.stdout)

    def remove_node(self, index: int) -> float:
        """Lose node ``index`` as a machine is lost: SIGKILL to all its processes and its router at
        once. Returns when it was killed (``time.monotonic()``)."""
        node = self.nodes[index]
        if index == 0:
            raise ValueError("the head holds the cluster's GCS: remove another node")
        routers = [router for router in self.routers if router.node == index and router.process.poll() is None]
        killed_at = time.monotonic()
        for router in routers:
            _kill_session(router.process.pid)
        _kill_session(node.process.pid)
        for process in [node.process, *(router.process for router in routers)]:
            process.wait(30)
        deadline = time.monotonic() + 30
        while session_processes(node.process.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        return killed_at

    # -- the routers ----------------------------------------------------------------------------

    def serve(self, node: int, args: Sequence[str] = (), env: Mapping[str, str] | None = None,
              timeout_s: float = 180, wait: bool = True) -> RouterProcess:
        """``router serve --address <gcs> [args]`` whose gateways run on node ``node``; ``env`` adds
        to the cluster's environment (``ROUTER_CONFIG``, ``ROUTER_DATA_DIR``, …)."""
        command = [sys.executable, "-m", "router.cli", "serve", "--address", self.address, *args]
        environment = self.env({**(env or {}), "ROUTER_RAY_NODE": self.nodes[node].name})
        process = subprocess.Popen(command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, text=True, start_new_session=True)
        router = RouterProcess(node, process, log=self.root / f"router-{node}-{len(self.routers)}.log")
        threading.Thread(target=router._read, name=f"router-{node}-output", daemon=True).start()
        self.routers.append(router)
        if wait:
            router.wait_ready(timeout_s)
        return router

    def serve_all(self, args: Sequence[str] = (), env: Mapping[str, str] | None = None,
                  node_env: Mapping[int, Mapping[str, str]] | None = None,
                  timeout_s: float = 180) -> list[RouterProcess]:
        """A router on every node: the head's first (it creates the shards, spread over all the
        nodes), then the others together. ``node_env`` adds per node (its ``ROUTER_DATA_DIR``)."""
        node_env = node_env or {}
        first = self.serve(0, args, {**(env or {}), **node_env.get(0, {})}, timeout_s)
        others = [self.serve(index, args, {**(env or {}), **node_env.get(index, {})}, wait=False)
                  for index in range(1, self.count)]
        for router in others:
            router.wait_ready(timeout_s)
        return [first, *others]

    # -- the end --------------------------------------------------------------------------------

    def processes(self) -> list[int]:
        """Every process this cluster started that is still there."""
        return [pid for session in self._sessions() for pid in session_processes(session)]

    def _sessions(self) -> list[int]:
        return [node.process.pid for node in self.nodes] + [router.process.pid for router in self.routers]

    def stop(self, timeout_s: float = 60) -> list[str]:
        """Stop the routers (SIGINT, the head's last: it removes the shards), then the nodes
        (SIGTERM, the head last). Returns the processes that were still there 10 s after that and
        had to be killed; raises if any outlives SIGKILL."""
        for router in sorted(self.routers, key=lambda r: -r.node):
            if router.process.poll() is None:
                os.killpg(router.process.pid, signal.SIGINT)
                try:
                    router.process.wait(timeout_s)
                except subprocess.TimeoutExpired:
                    _kill_session(router.process.pid)
                    router.process.wait(10)
        for node in reversed(self.nodes):
            if node.process.poll() is None:
                node.process.terminate()
                try:
                    node.process.wait(timeout_s)
                except subprocess.TimeoutExpired:
                    node.process.kill()
                    node.process.wait(10)
        forced = [_name(pid) for pid in self._wait_gone(10)]  # a node's processes end after its `ray start`
        for session in self._sessions():
            _kill_session(session)
        left = self._wait_gone(10)
        self.token_path.unlink(missing_ok=True)
        if self._ray_root is not None:
            shutil.rmtree(self._ray_root, ignore_errors=True)
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)
        if left:
            raise ClusterError(f"processes left after stop: {[_name(pid) for pid in left]}")
        return forced

    def _wait_gone(self, timeout_s: float) -> list[int]:
        deadline = time.monotonic() + timeout_s
        while (left := self.processes()) and time.monotonic() < deadline:
            time.sleep(0.05)
        return left

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
