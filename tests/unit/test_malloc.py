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
    import os, sys, threading
    sys.path.insert(0, {root!r})
    from router.proc import tune_malloc
    if {tuned}:
        assert tune_malloc()

    def rss():
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

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


# In a fresh interpreter: four 8 MiB buffers allocated, written and freed, as the event-log writer
# does with each flush; prints the resident set's growth in MiB after they are freed, then after
# ``trim_memory``. (Arrow's Python-level buffers come from the same glibc heaps once its pool is
# the system one: checked by name.)
KEEP_PROBE = textwrap.dedent("""
    import ctypes, os, sys
    sys.path.insert(0, {root!r})
    import pyarrow as pa
    from router.proc import keep_memory, trim_memory
    if {kept}:
        assert keep_memory()
        assert pa.default_memory_pool().backend_name == "system"
    PAGE = os.sysconf("SC_PAGE_SIZE")

    def rss():
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * PAGE

    MIB = 1 << 20
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # the heaps hold no free memory yet
    before = rss()
    made = [b"x" * (8 * MIB) for _ in range(4)]
    del made
    freed = (rss() - before) / MIB
    assert trim_memory()
    print(freed, (rss() - before) / MIB)
""")


def kept_growth(kept: bool) -> tuple[float, float]:
    root = str(Path(__file__).resolve().parents[2])
    environment = {name: value for name, value in os.environ.items()
                   if not name.startswith(("MALLOC_", "ARROW_", "GLIBC_TUNABLES", "LD_PRELOAD"))}
    done = subprocess.run([sys.executable, "-c", KEEP_PROBE.format(root=root, kept=kept)], capture_output=True,
                          text=True, timeout=60, check=True, env=environment)
    freed, trimmed = done.stdout.split()
    return float(freed), float(trimmed)


def test_the_writer_keeps_what_it_frees_until_it_trims():
    """``keep_memory`` (the event-log writer): freed buffers stay in the process for the next
    flush; ``trim_memory`` (after an unusually large flush) hands them back."""
    assert kept_growth(kept=False)[0] < 2  # by default glibc hands buffers this big back on free
    freed, trimmed = kept_growth(kept=True)
    assert freed >= 31  # kept: the 32 MiB stay resident
    assert trimmed < 2  # trimmed: back to the system
