"""Process-level set-up shared by gateways, shards, load generators and benchmark scripts."""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
from typing import Any

logger = logging.getLogger(__name__)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (the kernel's pick), for a server started next."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` different ports nothing listens on now, for one process that takes them all.

    Each probe stays bound until every port is picked: ``free_port`` called again may get back
    the port it just gave (its probe is closed), and Ray refuses to start a node given one port
    for two of its components.
    """
    probes = []
    try:
        for _ in range(count):
            probe = socket.socket()
            probes.append(probe)
            probe.bind((host, 0))
        return [probe.getsockname()[1] for probe in probes]
    finally:
        for probe in probes:
            probe.close()


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop where it is installed (every supported platform but Windows), else asyncio's own."""
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:  # pragma: no cover - uvloop is a dependency
        return asyncio.new_event_loop()


def raise_open_file_limit() -> int:
    """Each connection is a file descriptor: take the hard limit so 10,000s fit. Returns the limit."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        return hard
    except (ImportError, ValueError, OSError):
        logger.warning("could not raise the open-file limit")
        return -1


def tune_gc() -> None:
    """Collect less often than Python's default (every 700 net allocations of containers).

    A router process allocates a few short-lived tuples and closures per message; with the default
    thresholds the cyclic collector ran thousands of times a second and full collections walked
    every buffered record (py-spy: a third of a gateway's CPU at 20,000 messages/s). Almost nothing
    here forms reference cycles, so fewer, larger collections lose nothing. Objects loaded at start
    are frozen out of the scans (``gc.freeze``) by the caller once it is ready.

    The middle generation is collected once every 1,001 young collections, not every 21 (a
    generation is collected when its count exceeds its threshold): under a flood a gateway holds a
    request's callback and its request until the shard answers, which can be a second; such
    objects outlive a young collection, and each collection of the middle generation walked all of
    them again (about 120 ms, once a second at point-to-point: 10–15 % of a gateway, with nothing
    to collect). Full collections keep about their pace: every 2,002 young collections (2,121
    before), and only when the old generation has grown by a quarter since the last one. A cycle
    that dies young is still collected by the next young collection; one that dies in the middle
    generation waits for its next collection.
    """
    gc.set_threshold(50_000, 1_000, 1)


# glibc's mallopt parameters (malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
BIG_BUFFER_BYTES = 1 << 20  # served by mmap and given back to the system when freed
TRIM_BYTES = 2 * BIG_BUFFER_BYTES  # free memory kept at the top of a heap (glibc keeps 2x the mmap threshold)


def _glibc() -> Any:
    """glibc, for its allocator's calls (``mallopt``, ``malloc_trim``); None off glibc (musl, macOS)."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt, libc.malloc_trim  # noqa: B018 - both exist only in glibc
        return libc
    except (OSError, AttributeError):
        return None


def _thresholds(mmap_bytes: int, trim_bytes: int) -> bool:
    """glibc's mmap and trim thresholds; False off glibc (its allocator's defaults stand)."""
    libc = _glibc()
    return libc is not None and bool(libc.mallopt(M_MMAP_THRESHOLD, mmap_bytes)) and bool(
        libc.mallopt(M_TRIM_THRESHOLD, trim_bytes))


KEPT_BUFFER_BYTES = 32 << 20  # glibc's largest mmap threshold: buffers below it come from the heaps
KEPT_TOP_BYTES = 1 << 30  # free memory a heap keeps at its top before it trims


def keep_memory() -> bool:
    """Keep freed memory in this process instead of handing it back to the system (the event-log
    writer). False off glibc.

    The writer converts each flush with Arrow and numpy and frees it all again: megabytes a few
    times a second. Given back to the kernel, those pages may go further: a VM whose kernel reports
    free memory to its host (``page_reporting``, as on the machine of the README's runs) lets the host
    take them, and the next process to touch them may wait for the host to give them back. The
    Signal Hub latency case held a pause of 38-61 ms in nine runs of ten with the writer giving its
    memory back, and in one of ten with it kept (docs/performance.md §7): a lead to the cause, not
    a proof. Kept, the writer holds about its largest flush's working memory; after a flush far
    larger than usual it trims (:func:`trim_memory`). Arrow's Python-level allocations come from
    glibc too (its system pool); the Parquet writer's own buffers still come from Arrow's C++
    default pool, chosen when pyarrow was imported.
    """
    import pyarrow as pa

    if not _thresholds(KEPT_BUFFER_BYTES, KEPT_TOP_BYTES):
        return False
    pa.set_memory_pool(pa.system_memory_pool())
    return True


def trim_memory() -> bool:
    """Hand the free memory of glibc's heaps back to the system now (after :func:`keep_memory`,
    once an unusually large piece of work is done). False off glibc."""
    libc = _glibc()
    return libc is not None and bool(libc.malloc_trim(0))


def tune_malloc() -> bool:
    """Give a big buffer's memory back to the system as soon as it is freed. False off glibc.

    glibc starts by serving allocations of 128 KiB or more with mmap, and raises that threshold to
    the size of each such block freed, up to 32 MiB. After a client's 4 MiB frame, the next 4 MiB
    ones come from the heaps instead, and freed they stay in the process: in a worker thread's
    arena (the mx decode threads) up to three of them were kept, 12 MiB and more, depending on the
    order they were freed in (measured on /save). A fixed threshold serves every buffer of 1 MiB
    or more with mmap, whoever asks for it, and hands it back on free: a gateway's memory after
    big frames returns to where it was. Buffers that big are rare (a frame's bytes, a batch), and
    one more mmap is cheap next to filling 1 MiB.
    """
    return _thresholds(BIG_BUFFER_BYTES, TRIM_BYTES)
