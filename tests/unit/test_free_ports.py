"""Ports picked for one process are all different: Ray refuses a node given one port twice
("runtime_env_agent is trying to use a port number 45857 that is used by other components")."""

from __future__ import annotations

import shutil
import socket
import subprocess

from router import localcluster, proc
from router.proc import free_ports


def test_ports_picked_together_are_all_different_and_free():
    # 2,000 picks one at a time repeat about 150 ports on this kernel; held together, none
    ports = free_ports(2000, "")
    assert len(set(ports)) == 2000
    for port in ports[:50]:  # and each is free once the picks are released
        with socket.socket() as probe:
            probe.bind(("", port))


class LowestPortFirst:
    """A socket whose kernel gives the lowest port not bound now: a pick closed at once comes back."""

    bound: set[int] = set()

    def __init__(self) -> None:
        self.port = 0

    def bind(self, address) -> None:
        self.port = min(set(range(40000, 40100)) - self.bound)
        self.bound.add(self.port)

    def getsockname(self):
        return ("0.0.0.0", self.port)

    def close(self) -> None:
        self.bound.discard(self.port)

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self.close()


def test_a_local_cluster_gives_each_ray_component_of_a_node_its_own_port(tmp_path, monkeypatch):
    commands = []

    class Started:
        def __init__(self, command, **_):
            commands.append(command)

        def poll(self):
            return None

    monkeypatch.setattr(proc.socket, "socket", LowestPortFirst)
    monkeypatch.setattr(subprocess, "Popen", Started)
    cluster = localcluster.LocalCluster(3, tmp_path)
    monkeypatch.setattr(cluster, "_wait_for_gcs", lambda port, timeout_s: None)
    monkeypatch.setattr(cluster, "_live_nodes", lambda count, timeout_s: {f"node-{n}": str(n) for n in range(count)})
    try:
        cluster.start()
    finally:
        shutil.rmtree(cluster._ray_root, ignore_errors=True)
    assert len(commands) == 3
    for command in commands:
        ports = [int(argument.split("=")[1]) for argument in command
                 if argument.startswith("--") and argument.split("=")[0].endswith("-port")
                 and argument.split("=")[0] not in ("--min-worker-port", "--max-worker-port")]
        assert len(ports) == len(set(ports)) == (7 if "--head" in command else 4)
    # and no two nodes share one: they bind on the same machine (before, each node's were picked
    # on their own and released, so the next node's picks could be the same ports)
    every = [argument for command in commands for argument in command
             if argument.startswith("--") and argument.split("=")[0].endswith("-port")
             and argument.split("=")[0] not in ("--min-worker-port", "--max-worker-port")]
    assert len({int(argument.split("=")[1]) for argument in every}) == len(every) == 7 + 4 + 4
