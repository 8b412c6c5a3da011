"""What matching writes against live queries costs the query shards as the queries grow, in this
process: no sockets, no hops, only ``QueryTable.apply`` (``actors/baqend/livequeries.py``).

The layout is the Baqend ``queries`` scenario's (``router/bench/dialects/baqend.py``): query *i* is
``{"g": i % groups}`` with ``groups`` = Q / ``matches``, the first of each group sorted by ``n``
descending with a limit of 10; write *w* inserts ``g`` = w % groups, ``n`` = w, so it matches
``matches`` queries. The queries are spread over ``shards`` tables, as over the router's query
shards, and every write goes to each. Each group gets ``per_group`` writes whatever Q is, so each
query's state (its matching documents, its sorted list) is the same size at every Q and only the
number of queries changes.

    router bench matching [--param baqend.queries=1000,2000,5000,10000,20000]
                          [--param baqend.per_group=200] [--param baqend.matches=10]

value: µs of one core per write over all the tables, the least of ``RUNS`` runs.
"""

from __future__ import annotations

import gc
import time
from typing import Any

from actors.baqend.contract import Write
from actors.baqend.livequeries import QuerySpec, QueryTable
from router.bench.dialects.baqend import SORTED_LIMIT, Layout

RUNS = 3
BATCH = 16  # writes per batch, about what a document shard forwards under a flood
SHARDS = 2


def _tables(layout: Layout, shards: int) -> list[QueryTable]:
    tables = [QueryTable() for _ in range(shards)]
    for query in range(layout.queries):
        group = layout.group(query)
        if layout.is_sorted(query):
            spec = QuerySpec("Bench", {"g": group}, sort={"n": -1}, limit=SORTED_LIMIT)
        else:
            spec = QuerySpec("Bench", {"g": group})
        table, key = tables[query % shards], f"q{query}"
        table.add(key, ("bench", query % 10), key, spec)
        table.load(key)
    return tables


def measure(queries: int, per_group: int, matches: int, shards: int = SHARDS) -> dict[str, Any]:
    """One run: the tables built, then every write applied; µs per write and events per write."""
    layout = Layout("Bench", queries, 10, matches)
    tables = _tables(layout, shards)
    count = per_group * layout.groups
    writes = [Write("Bench", None, {"id": f"/db/Bench/{w:09d}", "version": 1, "acl": None, "g": layout.group(w),
                                    "n": w}, "insert", w + 1, None)
              for w in range(count)]
    gc.collect()
    events = 0
    started = time.perf_counter()
    for start in range(0, count, BATCH):
        batch = writes[start:start + BATCH]
        for table in tables:
            table.apply(0, "bench", batch)
    elapsed = time.perf_counter() - started
    events = sum(table.events for table in tables)
    return {"queries": queries, "writes": count, "us_per_write": elapsed / count * 1e6,
            "events_per_write": events / count}


def run(queries: list[int], per_group: int, matches: int, runs: int = RUNS) -> list[dict[str, Any]]:
    rows = []
    for each in queries:
        results = [measure(each, per_group, matches) for _ in range(runs)]
        best = min(results, key=lambda result: result["us_per_write"])
        row = {**best, "us_per_write": round(best["us_per_write"], 2),
               "runs_us_per_write": [round(result["us_per_write"], 2) for result in results],
               "events_per_write": round(best["events_per_write"], 3)}
        print(f"{each:>7,} queries: {row['us_per_write']:6.1f} µs a write "
              f"(runs {', '.join(f'{value:.1f}' for value in row['runs_us_per_write'])}), "
              f"{row['writes']:,} writes, {row['events_per_write']:.2f} events a write", flush=True)
        rows.append(row)
    return rows
