"""The event-log writer of one gateway, in a process of its own.

Turning a gateway's buffered records into Arrow columns and Parquet files costs a few microseconds
of CPU per message; done in the gateway's process it competes with the event loop for the GIL
and the core. The gateway hands each flush to this actor instead (its records packed in chunks,
the rare rejections and drops pickled in slices) and this actor does the rest. It is pinned to the gateway's node (the
files go to that node's data directory) and owned by the gateway, so it goes when the gateway goes.
"""

from __future__ import annotations

import logging
import os

import ray

from router.eventlog import EventLog, Flush, unpickle_slices
from router.proc import keep_memory, trim_memory

logger = logging.getLogger(__name__)

# A flush of more records than this (a backlog after a flood) is followed by a trim: the memory
# kept for the next flush is about an ordinary flush's, not the largest one's.
TRIM_AFTER_RECORDS = 500_000


class EventLogWriter:
    def __init__(self, directory: str, gateway_id: str, retention_hours: float) -> None:
        # Background work: converting a flush is a burst of CPU that would otherwise take a core
        # from the gateways and shards for a moment, seen as a latency tail. Lower priority lets it
        # run in the gaps.
        try:
            os.nice(10)
        except OSError:
            pass
        # What a flush's conversion frees stays here for the next one, not handed back to the
        # system: on a VM that reports free memory to its host, handing it back paused the other
        # processes (router.proc.keep_memory).
        if not keep_memory():
            logger.warning("event-log writer: not glibc; freed memory goes back to the system")
        self.log = EventLog(directory, gateway_id, retention_hours=retention_hours)  # a folder or a URL
        self.log.warm_up().result()

    def ready(self) -> bool:
        return True

    def write_flush(self, packed: Flush, row_slices: list[bytes]) -> tuple[int, int, int]:
        """A gateway's flush: its packed records, and its rejections and drops as pickled slices."""
        rows = unpickle_slices(row_slices)
        written = self.log.write(rows, packed)
        if len(rows) + packed.records > TRIM_AFTER_RECORDS:
            del rows, packed
            trim_memory()
        return written


EventLogWriterActor = ray.remote(num_cpus=0, max_restarts=0)(EventLogWriter)
