"""The event-log writer of one gateway, in a process of its own.

Turning a gateway's buffered records into Arrow columns and Parquet files costs a few microseconds
of CPU per message; done in the gateway's process it competes with the event loop for the GIL
and the core. The gateway pickles its buffers (in slices) to this actor every flush instead (well under a
microsecond per record) and this actor does the rest. It is pinned to the gateway's node (the
files go to that node's data directory) and owned by the gateway, so it goes when the gateway goes.
"""

from __future__ import annotations

import logging
import os

import ray

from router.eventlog import EventLog, unpickle_slices
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

    def write_slices(self, payload: list[list[bytes]]) -> tuple[int, int]:
        """The gateway's buffers as pickled slices of records: ``[row slices, group slices]``."""
        rows, groups = unpickle_slices(payload[0]), unpickle_slices(payload[1])
        written = self.log.write(rows, groups)
        if len(rows) + len(groups) > TRIM_AFTER_RECORDS:
            del rows, groups
            trim_memory()
        return written


EventLogWriterActor = ray.remote(num_cpus=0, max_restarts=0)(EventLogWriter)
