"""Exercise the node path without a node: write generated blocks to a file, replay a file as a node.

The file holds one JSON object per line, ``{"topic", "payload"}`` with the payload in base64,
marshalled as the file's ``marshaller`` line says (the first line: ``{"marshaller": "gogo"}``).
``router mx generate`` writes one; ``router mx replay`` connects to ``/save`` like a node's
outport driver (counters from 1, stop-and-wait on each ACK) and sends it.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from pathlib import Path
from typing import Any, Iterator

from websockets.asyncio.client import connect

from gateways.mx import generator, node


def generate_file(path: Path, blocks: int, transactions: int, seed: int, marshaller: str = node.GOGO,
                  finalize: bool = True) -> dict[str, int]:
    """SaveBlock (and FinalizedBlock) frames of ``blocks`` generated blocks; returns what was written."""
    counts = {"SaveBlock": 0, "FinalizedBlock": 0, "events": 0}
    with path.open("w") as out:
        out.write(json.dumps({"marshaller": marshaller}) + "\n")
        for index in range(blocks):
            block = generator.generate_save_block(seed + index, transactions=transactions)
            counts["events"] += len(node.normalize_save_block(block).events)
            frames = [(node.SAVE_BLOCK, generator.save_block_payload(block, marshaller))]
            if finalize:
                frames.append((node.FINALIZED_BLOCK, generator.finalized_payload(block, marshaller)))
            for topic, payload in frames:
                out.write(json.dumps({"topic": topic, "payload": base64.b64encode(payload).decode()}) + "\n")
                counts[topic] += 1
    return counts


def read_file(path: Path) -> tuple[str, Iterator[tuple[str, bytes]]]:
    lines = path.open()
    header = json.loads(next(lines))
    marshaller = header.get("marshaller", node.GOGO)

    def frames() -> Iterator[tuple[str, bytes]]:
        with lines:
            for line in lines:
                if line.strip():
                    record = json.loads(line)
                    yield record["topic"], base64.b64decode(record["payload"])

    return marshaller, frames()


async def replay(url: str, path: Path, with_acknowledge: bool = True, timeout_s: float = 60,
                 token: str | None = None) -> dict[str, Any]:
    """Send the file's frames to ``url`` as a node does; returns counts and the time taken.

    ``token``: the router's ``mx.node_token``, sent as ``Authorization: Bearer`` (never in the URL).
    """
    marshaller, frames = read_file(path)
    sent = acked = 0
    started = time.perf_counter()
    headers = {"Authorization": f"Bearer {token}"} if token is not None else None
    async with connect(url, max_size=None, open_timeout=10, ping_interval=None, additional_headers=headers) as ws:
        for counter, (topic, payload) in enumerate(frames, start=1):
            await ws.send(node.encode_node_frame(topic, payload, counter, marshaller, with_acknowledge))
            sent += 1
            if with_acknowledge:
                while True:
                    reply = await asyncio.wait_for(ws.recv(), timeout_s)
                    frame = node.decode_node_frame(reply.encode() if isinstance(reply, str) else reply)
                    if frame.type == node.ACK and frame.counter == counter:
                        acked += 1
                        break
    return {"frames": sent, "acknowledged": acked, "seconds": round(time.perf_counter() - started, 3),
            "marshaller": marshaller}
