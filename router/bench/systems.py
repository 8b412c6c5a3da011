"""The systems a benchmark drives: the router (embedded, in this process), the ``raw`` websockets
server and Redis (subprocesses on loopback). Each knows its URLs, its server processes (for CPU
and memory) and how to stop without leaving a process behind."""

from __future__ import annotations

import copy
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from router.proc import free_port

ROOT = Path(__file__).resolve().parents[2]
RAW_SERVER = ROOT / "benchmarks" / "raw_server.py"


def pin_threads(process: psutil.Process, cpus: set[int]) -> None:
    """Every thread of ``process`` on ``cpus`` (``sched_setaffinity`` on a pid moves only its main
    thread; threads started later inherit their starter's). A process that has gone is skipped."""
    try:
        threads = process.threads()
    except psutil.Error:
        return
    for thread in threads:
        try:
            os.sched_setaffinity(thread.id, cpus)
        except OSError:  # the thread ended
            pass


def merged_settings(base: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
    """``load_settings`` overrides of two dialects' profiles as one: sections merged key by key; a
    key both set to different values is an error (the two cannot share one router)."""
    out = dict(base)
    for key, value in more.items():
        if key not in out:
            out[key] = value
        elif isinstance(out[key], dict) and isinstance(value, dict):
            out[key] = merged_settings(out[key], value)
        elif out[key] != value:
            raise ValueError(f"settings conflict on {key!r}: {out[key]!r} and {value!r}")
    return out


class Unavailable(Exception):
    """A baseline's server is not installed here: the harness skips it and says why."""


class System:
    name = ""
    dialect = ""  # the load generators' dialect (``router.bench.loadgen.dialect_class``)
    # Its fan-out S>1 cases carry ``Options.router_deliveries``: the embedded router's fan-out is
    # 25–80 times raw's, so at ``deliveries`` its case ended before its event-log writer ran.
    fast_fanout = False

    def accepts(self, case: Any) -> bool:
        """Whether ``case`` runs on this system: a baseline runs the shared scenarios (a case of no
        dialect), a router the cases of its own dialect."""
        return case.dialect is None

    def client_config(self) -> dict[str, Any]:
        """What the load generators need of this system (``spec["config"]``)."""
        return {}

    def for_case(self, case: Any) -> "System":
        """What ``case`` is measured through (itself; a router set up for several dialects: the
        case's, :meth:`RouterSystem.serving`)."""
        return self

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def urls(self) -> list[str]:
        """One URL per gateway / server."""
        raise NotImplementedError

    def server_processes(self) -> dict[str, list[psutil.Process]]:
        """Processes whose CPU and memory are reported, by role (``server``; the router adds ``shards``)."""
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        return {"system": self.name}

    def settle(self) -> None:
        """Let background work finish before a case is measured and counted (nothing by default)."""


class SubprocessSystem(System):
    def __init__(self, cpu: int | None) -> None:
        self.cpu = cpu
        self.process: subprocess.Popen | None = None

    def _pin(self) -> None:
        if self.cpu is not None and self.process is not None:
            pin_threads(psutil.Process(self.process.pid), {self.cpu})

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        self.process = None

    def server_processes(self) -> dict[str, list[psutil.Process]]:
        return {"server": [psutil.Process(self.process.pid)]}

    def describe(self) -> dict[str, Any]:
        return {"system": self.name, "pinned_cpu": self.cpu}


class RawSystem(SubprocessSystem):
    """``benchmarks/raw_server.py``: plain websockets with ``broadcast()``, one process."""

    name = "raw"
    dialect = "raw"

    def start(self) -> None:
        self.process = subprocess.Popen([sys.executable, str(RAW_SERVER), "--port", "0"],
                                        stdout=subprocess.PIPE, text=True, start_new_session=True)
        line = self.process.stdout.readline()
        if not line.startswith("listening "):
            self.stop()
            raise RuntimeError(f"raw server did not start: {line!r}")
        self.port = int(line.split()[1])
        self._pin()

    def urls(self) -> list[str]:
        return [f"ws://127.0.0.1:{self.port}/"]


class RedisSystem(SubprocessSystem):
    """Debian's ``redis-server`` on loopback, no persistence; driven over RESP."""

    name = "redis"
    dialect = "redis"

    def start(self) -> None:
        if importlib.util.find_spec("redis") is None:
            raise Unavailable("the redis baseline needs the redis client: pip install -e '.[bench]'")
        binary = shutil.which("redis-server")
        if binary is None:
            raise Unavailable("redis-server is not installed (Debian: apt-get install redis-server); "
                              "the redis baseline is skipped")
        self.port = free_port()
        self.directory = tempfile.mkdtemp(prefix="router-bench-redis-")
        self.process = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", self.directory, "--maxclients", "20000", "--loglevel", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self._wait_ready()
        self._pin()

    def _wait_ready(self) -> None:
        import redis

        client = redis.Redis(host="127.0.0.1", port=self.port)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                self.version = client.info("server")["redis_version"]
                client.close()
                return
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    self.stop()
                    raise RuntimeError("redis-server did not start")
                time.sleep(0.05)

    def stop(self) -> None:
        super().stop()
        shutil.rmtree(getattr(self, "directory", ""), ignore_errors=True)

    def urls(self) -> list[str]:
        return [f"redis://127.0.0.1:{self.port}"]

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "version": getattr(self, "version", None)}


class RouterSystem(System):
    """The router, embedded in this process the way ``router serve`` starts it, measured through
    one dialect (its :class:`router.bench.dialects.Profile`); ``also``: more dialects it is set up
    for (their profiles' settings merged, their clients' keys made), each measured through
    :meth:`serving` (the target rounds: Signal Hub and NoLag on one router).

    ``cpu``: with one gateway, its process (every thread) gets that CPU, as a pinned baseline's
    server does, and every other process of the run (this one, Ray's, the shards, the event-log
    writer; the load generators are placed by the harness) the other CPUs. With more gateways
    nothing is pinned."""

    fast_fanout = True

    def __init__(self, gateways: int = 1, shards: int | None = None, eventlog: bool = True,
                 name: str = "router", dialect: str = "signal", cpu: int | None = None,
                 also: tuple[str, ...] = ()) -> None:
        self.gateways, self.shards, self.eventlog, self.name = gateways, shards, eventlog, name
        self.dialect = dialect
        self.dialects = (dialect, *(name for name in dict.fromkeys(also) if name != dialect))
        self._serving: dict[str, tuple[list[str], dict[str, Any]]] = {}  # dialect -> (URLs, client config)
        self.router = None
        self.config: dict[str, Any] = {}
        self.cpu = cpu if gateways == 1 else None
        self._affinity: list[int] | None = None
        self.gateway_pids: list[int] = []  # once started
        self.shard_pids: list[int] = []

    def accepts(self, case: Any) -> bool:
        return case.dialect in self.dialects

    def client_config(self) -> dict[str, Any]:
        return self.config

    def for_case(self, case: Any) -> "RouterSystem":
        return self if case.dialect == self.dialect else self.serving(case.dialect)

    def start(self) -> None:
        import ray

        from router.bench.dialects import profile
        from router.runtime import Router
        from router.settings import load_settings

        profiles = [profile(name) for name in self.dialects]
        self.data_dir = tempfile.mkdtemp(prefix="router-bench-")
        overrides: dict[str, Any] = {}
        for each in profiles:
            overrides = merged_settings(overrides, each.settings())
        if self.shards:
            overrides["shards"] = {"session": self.shards, "topic": self.shards, "registry": self.shards}
        settings = load_settings(
            port=0, gateways=self.gateways, namespace=f"bench-{os.getpid()}", ray_dashboard=False,
            data_dir=self.data_dir, analytics={"enabled": self.eventlog}, **overrides)
        self.settings = settings
        configs = {each.name: each.prepare(settings) for each in profiles}
        self.router = Router(settings)
        endpoints = self.router.start()
        for name in self.dialects:
            urls = [f"ws://127.0.0.1:{listener['port']}{listener['websocket'][name]}"
                    for gateway in endpoints for listener in gateway["listeners"] if name in listener["websocket"]]
            http = [f"http://127.0.0.1:{listener['port']}" for gateway in endpoints
                    for listener in gateway["listeners"] if name in listener["websocket"]]
            self._serving[name] = (urls, {**configs[name], "http": http, "endpoints": endpoints})
        self._urls, self.config = self._serving[self.dialect]
        self.gateway_pids = [stats["pid"] for stats in self._gateway_stats()]
        self.shard_pids = [info["pid"] for info in ray.get(
            [shard.info.remote() for shards in self.router.shards.values() for shard in shards])]
        self._pin()

    def serving(self, dialect: str) -> "RouterSystem":
        """This started router measured through another dialect it was set up for (``also``): the
        same router, processes and event log, that dialect's URLs and client config. Only the
        router itself is stopped."""
        if dialect not in self._serving:
            raise ValueError(f"the router was not set up for {dialect!r}")
        view = copy.copy(self)
        view.dialect = dialect
        view._urls, view.config = self._serving[dialect]
        return view

    def _pin(self) -> None:
        if self.cpu is None:
            return
        me = psutil.Process()
        processes = [me, *me.children(recursive=True)]  # Ray's processes, when this run started Ray
        if not set(self.gateway_pids) <= {process.pid for process in processes}:
            self.cpu = None  # a Ray this run did not start: its processes are not the run's to move
            return
        self._affinity = me.cpu_affinity()
        rest = set(range(psutil.cpu_count())) - {self.cpu} or {self.cpu}
        for process in processes:
            pin_threads(process, {self.cpu} if process.pid in self.gateway_pids else rest)

    def settle(self) -> None:
        """Write what the event log holds and wait for its writes (the case's records, or set-up's),
        so that their conversion (seconds of CPU after millions of deliveries) does not run during
        a case and its rows can be counted."""
        import ray

        ray.get([record.actor.flush_events.remote() for record in self.router.gateways], timeout=600)

    def _gateway_stats(self) -> list[dict[str, Any]]:
        import ray

        return ray.get([record.actor.stats.remote() for record in self.router.gateways], timeout=30)

    def event_log(self) -> tuple[int, int]:
        """The gateways' event logs: events written (a fan-out group's row counts each delivery)
        and records dropped (a writer that fell behind) so far."""
        logs = [stats["event_log"] for stats in self._gateway_stats()]
        return (sum(log["events_written"] for log in logs if log), sum(log["records_dropped"] for log in logs if log))

    def delivered(self) -> int:
        """Frames the gateways have written (their own count: a cross-check of the receivers')."""
        return sum(stats["delivered"] for stats in self._gateway_stats())

    def stop(self) -> None:
        """Stop the router and wait (up to 30 s) until its gateways', shards' and Ray's processes
        have exited: a baseline measured next never shares the machine with them."""
        if self.router is not None:
            workers = []
            for pid in [*self.gateway_pids, *self.shard_pids]:
                try:
                    workers.append(psutil.Process(pid))
                except psutil.Error:
                    pass
            self.router.stop(wait=True)
            self.router = None
            psutil.wait_procs(workers, timeout=30)
        if self._affinity is not None:
            pin_threads(psutil.Process(), set(self._affinity))
            self._affinity = None
        shutil.rmtree(getattr(self, "data_dir", ""), ignore_errors=True)

    def urls(self) -> list[str]:
        return self._urls

    def server_processes(self) -> dict[str, list[psutil.Process]]:
        return {"server": [psutil.Process(pid) for pid in self.gateway_pids],
                "shards": [psutil.Process(pid) for pid in self.shard_pids]}

    def describe(self) -> dict[str, Any]:
        shards = self.settings.shards
        return {"system": self.name, "dialect": self.dialect, "gateways": self.gateways, "eventlog": self.eventlog,
                "pinned_cpu": self.cpu, **({"dialects": list(self.dialects)} if len(self.dialects) > 1 else {}),
                "shards": {"session": shards.session, "topic": shards.topic, "registry": shards.registry}}


class ClusterRouterSystem(System):
    """The router on a Ray cluster of ``nodes`` nodes on this machine (``router/localcluster.py``):
    one ``router serve`` per node, the clients dealt round every node's gateway. On one machine the
    nodes share its cores, so the figures show what the cluster's extra hops cost (TCP lanes
    between nodes instead of Unix ones), not what a node's own CPUs add (README, "Scale-out"). Its
    fan-out is slower than the embedded router's (about 1 M deliveries/s): its cases carry
    ``--deliveries``."""

    dialect = "signal"

    def __init__(self, nodes: int, shards: int | None = None, eventlog: bool = True, name: str = "") -> None:
        self.nodes, self.shards, self.eventlog = nodes, shards, eventlog
        self.name = name or f"router {nodes} node{'s' if nodes > 1 else ''}"
        self.cluster = None

    def accepts(self, case: Any) -> bool:
        return case.dialect == "signal"

    def start(self) -> None:
        from router.localcluster import LocalCluster, session_processes

        self.cluster = LocalCluster(self.nodes).start()
        root = self.cluster.root
        env = {"ROUTER_PORT": "0", "ROUTER_NAMESPACE": "bench", "ROUTER_SIGNAL__RATE_LIMIT_PER_MINUTE": "1e12",
               "ROUTER_ANALYTICS__ENABLED": str(self.eventlog).lower(), "ROUTER_LOG_LEVEL": "WARNING"}
        if self.shards:
            env.update({f"ROUTER_SHARDS__{kind.upper()}": str(self.shards) for kind in ("session", "topic", "registry")})
        try:
            routers = self.cluster.serve_all(env=env, node_env={
                index: {"ROUTER_DATA_DIR": str(root / f"data-{index}")} for index in range(self.nodes)})
        except BaseException:
            self.stop()
            raise
        self._urls = [router.endpoints["signal"] for router in routers]
        self._pids = [pid for node in self.cluster.nodes for pid in session_processes(node.process.pid)]

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()
            self.cluster = None

    def urls(self) -> list[str]:
        return self._urls

    def server_processes(self) -> dict[str, list[psutil.Process]]:
        """Every process of every node (raylets, GCS, gateways, shards, event-log writers): on one
        machine they share its cores, so their sum is the cluster's cost."""
        processes = []
        for pid in self._pids:
            try:
                processes.append(psutil.Process(pid))
            except psutil.NoSuchProcess:
                pass
        return {"server": processes}

    def describe(self) -> dict[str, Any]:
        return {"system": self.name, "nodes": self.nodes, "eventlog": self.eventlog, "shards": self.shards}


def cpu_seconds(processes: list[psutil.Process]) -> float:
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


def rss_bytes(processes: list[psutil.Process]) -> int:
    total = 0
    for process in processes:
        try:
            total += process.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total
