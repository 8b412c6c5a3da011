"""Stopping a process by SIGSTOP in the tests, until every thread of it is stopped: ``kill``
returns once the signal is queued, and a thread of the process can still run meanwhile."""

from __future__ import annotations

import os
import signal
import time


def thread_states(pid: int) -> list[str]:
    """The state letter of each thread of ``pid`` (T: stopped)."""
    states = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/stat") as stat:
                states.append(stat.read().split(")")[-1].split()[0])
        except OSError:
            continue  # a thread that ended meanwhile
    return states


def threads_stopped(pid: int) -> bool:
    """Whether every thread of ``pid`` is stopped: SIGSTOP wakes one thread, which stops the others
    only when it runs, so on a busy machine another one (a shard's lane) can still answer meanwhile."""
    return all(state == "T" for state in thread_states(pid))


def stop(pid: int, timeout: float = 10) -> None:
    """SIGSTOP ``pid`` and return once every one of its threads is stopped."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while not threads_stopped(pid):
        assert time.monotonic() < deadline, f"{pid} did not stop: {thread_states(pid)}"
        time.sleep(0.005)
