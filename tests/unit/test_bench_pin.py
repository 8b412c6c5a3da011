"""The harness's CPU pinning moves every thread of a process, not only its main one: a Ray worker
(a gateway) runs its event loop beside a dozen threads of its own."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil

from router.bench.systems import pin_threads

THREADS = """
import sys, threading
stop = threading.Event()
for _ in range(3):
    threading.Thread(target=stop.wait, daemon=True).start()
print("ready", flush=True)
sys.stdin.readline()
"""


def _affinities(pid: int) -> dict[int, set[int]]:
    return {thread.id: frozenset(os.sched_getaffinity(thread.id)) for thread in psutil.Process(pid).threads()}


def test_pin_threads_moves_every_thread_of_a_process():
    child = subprocess.Popen([sys.executable, "-c", THREADS], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "ready\n"
        everything = set(range(psutil.cpu_count()))
        assert len(_affinities(child.pid)) == 4
        pin_threads(psutil.Process(child.pid), {0})
        assert set(_affinities(child.pid).values()) == {frozenset({0})}
        pin_threads(psutil.Process(child.pid), everything)
        assert set(_affinities(child.pid).values()) == {frozenset(everything)}
    finally:
        child.stdin.close()
        child.wait(10)


def test_pin_threads_skips_a_process_that_has_gone():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    process = psutil.Process(child.pid)
    child.wait(10)  # gone and reaped
    pin_threads(process, {0})  # no error: the run goes on without it
