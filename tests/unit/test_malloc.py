"""router.proc.tune_malloc: big buffers freed in any thread go back to the system (glibc only)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

# In a fresh interpreter: a 4 MiB buffer freed first (glibc then raises its mmap threshold to
# 4 MiB, as after a client's first big frame), then, in a worker thread as the mx decode thread
# does, three 4 MiB buffers and a small object allocated after them, the three freed. Prints the
# growth of the resident set in MiB while the small object still stands above them in the heap.
PROBE = textwrap.dedent("""
    import sys, threading
    sys.path.insert(0, {root!r})
    from router.proc import tune_malloc
    if {tuned}:
        assert tune_malloc()

    def rss():
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * 4096

    MIB = 1 << 20
    first = bytes(4 * MIB)
    del first
    grown = []

    def worker():
        before = rss()
        big = [bytearray(4 * MIB) for _ in range(3)]
        pinned = bytearray(64 * 1024)
        del big
        grown.append((rss() - before) / MIB)
        del pinned

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    print(grown[0])
""")


def growth(tuned: bool) -> float:
    root = str(Path(__file__).resolve().parents[2])
    environment = {name: value for name, value in os.environ.items() if not name.startswith("MALLOC_")}
    done = subprocess.run([sys.executable, "-c", PROBE.format(root=root, tuned=tuned)], capture_output=True,
                          text=True, timeout=60, check=True, env=environment)  # glibc's own defaults
    return float(done.stdout)


def test_big_buffers_freed_in_a_thread_leave_the_process():
    assert growth(tuned=False) >= 12  # the allocator's own behaviour: what the tuning is for
    assert growth(tuned=True) < 1
