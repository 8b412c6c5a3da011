"""`router bench --nodes N` as a user runs it: the router on a local Ray cluster of N nodes
(router/localcluster.py), a `router serve` per node, the clients spread over every node's gateway."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROUTER = str(Path(sys.executable).with_name("router"))


def test_router_bench_p2p_on_a_two_node_cluster(tmp_path):
    out = tmp_path / "bench-p2p.json"
    completed = subprocess.run(
        [ROUTER, "bench", "p2p", "--systems", "router", "--nodes", "2", "--pairs", "4", "--p2p-messages", "4000",
         "--procs", "1", "--timeout", "60", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    result = json.loads(out.read_text())
    [system] = result["systems"]
    assert system == {"system": "router 2 nodes", "nodes": 2, "eventlog": True, "shards": None}
    [row] = result["results"]
    assert (row["scenario"], row["case"], row["system"], row["metric"]) == ("p2p", "4 pairs", "router 2 nodes",
                                                                          "messages/s")
    assert row["received"] == row["expected"] == 4000, row
    assert row["value"] > 0 and row["server_cpu_pct"] > 0, row
