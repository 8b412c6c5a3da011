"""Pure helpers of ``router bench``: rates from receiver results, percentiles from HDR
histograms, ratios to the ``raw`` baseline, the terminal table, the JSON document, the plot."""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path
from typing import Any, Iterable

def delivery_rate(results: Iterable[dict[str, Any]]) -> tuple[int, float]:
    """Frames received by all receivers and the rate over the receiving window: from the first
    frame any receiver saw to the last frame any receiver saw (one machine-wide monotonic clock)."""
    received = [r for r in results if r.get("received")]
    total = sum(r["received"] for r in received)
    if not received:
        return 0, 0.0
    window = max(r["last"] for r in received) - min(r["first"] for r in received)
    return total, (total / window if window > 0 else 0.0)


def span_rate(results: Iterable[dict[str, Any]], count_field: str) -> tuple[int, float]:
    """Work done by workers that report ``start``/``end`` and a count (churn cycles)."""
    rows = [r for r in results if count_field in r]
    total = sum(r[count_field] for r in rows)
    if not rows:
        return 0, 0.0
    window = max(r["end"] for r in rows) - min(r["start"] for r in rows)
    return total, (total / window if window > 0 else 0.0)


def merged_histogram(encoded: Iterable[bytes]):
    from hdrh.histogram import HdrHistogram

    merged = HdrHistogram(1, 60_000_000, 3)
    for blob in encoded:
        merged.decode_and_add(blob)
    return merged


def percentiles_ms(histogram, points: Iterable[float] = (50, 99, 99.9)) -> dict[str, float]:
    """Percentiles of a histogram of microseconds, in milliseconds: ``{"p50_ms": …, "p99.9_ms": …}``."""
    out = {f"p{point:g}_ms": round(histogram.get_value_at_percentile(point) / 1000, 3) for point in points}
    out["max_ms"] = round(histogram.get_max_value() / 1000, 3)
    out["samples"] = histogram.get_total_count()
    return out


def cpu_percent(cpu_seconds: float, wall_seconds: float) -> float:
    return round(100 * cpu_seconds / wall_seconds, 1) if wall_seconds > 0 else 0.0


def _over(value: Any, base: Any) -> float | None:
    """``value / base`` kept to 6 decimals, so that the tables round it to 2 once (kept to 3,
    23.0054 was rounded to 23.005 and shown as 23.00); ``None`` without both."""
    return round(value / base, 6) if base and value is not None else None


def add_ratios(rows: list[dict[str, Any]], baseline: str = "raw") -> list[dict[str, Any]]:
    """Each row's value over the baseline's in the same scenario and case (``None`` without one);
    and a router dialect's row over the same router's Signal Hub row of its ``compare`` case
    (``ratio_to_signal``: how far a dialect is behind the core)."""
    reference = {(r["scenario"], r["case"]): r["value"] for r in rows if r["system"] == baseline and r.get("value")}
    signal = {(r["scenario"], r["case"], r["system"]): r["value"] for r in rows
              if r.get("dialect") == "signal" and r.get("value")}
    for row in rows:
        base = reference.get((row["scenario"], row["case"]))
        row["ratio_to_raw"] = _over(row.get("value"), base)
        if row.get("dialect") not in (None, "-", "signal"):
            core = signal.get((row["scenario"], row.get("compare") or row["case"], row["system"]))
            row["ratio_to_signal"] = _over(row.get("value"), core)
    return rows


def _number(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and value < 100:
        return f"{value:,.2f}"
    return f"{value:,.0f}"


def format_table(rows: list[dict[str, Any]]) -> str:
    """The terminal table: one line per scenario, case and system."""
    header = ("scenario", "case", "dialect", "system", "metric", "value", "x raw", "x signal", "server CPU",
              "shards CPU", "loadgen CPU", "notes")
    lines = [header]
    for row in rows:
        lines.append((
            row["scenario"], row["case"], row.get("dialect", "-"), row["system"], row["metric"],
            _number(row.get("value")), ratio_cell(row.get("ratio_to_raw")), ratio_cell(row.get("ratio_to_signal")),
            _percent(row.get("server_cpu_pct")), _percent(row.get("shards_cpu_pct")), _percent(row.get("loadgen_cpu_pct")),
            row.get("notes", ""),
        ))
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(header))]
    out = []
    for index, line in enumerate(lines):
        cells = [str(cell).ljust(width) if i < 5 or i == len(header) - 1 else str(cell).rjust(width)
                 for i, (cell, width) in enumerate(zip(line, widths))]
        out.append("  ".join(cells).rstrip())
        if index == 0:
            out.append("  ".join("-" * width for width in widths))
    return "\n".join(out)


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}%"


def ratio_cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """The same rows as a Markdown table (for the README)."""
    out = ["| scenario | case | dialect | system | metric | value | × raw | × signal | server CPU | shards CPU "
           "| loadgen CPU | notes |",
           "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for row in rows:
        out.append(f"| {row['scenario']} | {row['case']} | {row.get('dialect', '-')} | {row['system']} "
                   f"| {row['metric']} | {_number(row.get('value'))} "
                   f"| {ratio_cell(row.get('ratio_to_raw'))} | {ratio_cell(row.get('ratio_to_signal'))} "
                   f"| {_percent(row.get('server_cpu_pct'))} "
                   f"| {_percent(row.get('shards_cpu_pct'))} | {_percent(row.get('loadgen_cpu_pct'))} "
                   f"| {row.get('notes', '')} |")
    return "\n".join(out)


def _verdict(summary: dict[str, Any]) -> str:
    return "met" if summary["met"] else "not met"


def format_summaries(summaries: list[dict[str, Any]]) -> str:
    """The dialects' targets decided over several rows (``Profile.summaries``), one line each."""
    return "\n".join(f"{each['name']}: {each['figure']}: {_verdict(each)}" for each in summaries)


def markdown_summaries(summaries: list[dict[str, Any]]) -> str:
    out = ["| target | measured | |", "|---|---|---|"]
    out += [f"| {each['name']} | {each['figure']} | {_verdict(each)} |" for each in summaries]
    return "\n".join(out)


def machine() -> dict[str, Any]:
    cpu_model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "cpu_model": cpu_model, "python": sys.version.split()[0],
            "platform": platform.platform()}


def document(scenario: str, options: dict[str, Any], systems: list[dict[str, Any]], rows: list[dict[str, Any]],
             skipped: dict[str, str]) -> dict[str, Any]:
    return {"scenario": scenario, "machine": machine(), "options": options, "systems": systems,
            "skipped": skipped, "results": rows}


def write_json(path: Path, content: Any) -> None:
    """A result file (its folder made if needed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(content, indent=2, default=str))


def _label(row: dict[str, Any]) -> str:
    dialect = row.get("dialect", "-")
    return row["system"] if dialect in ("-", "signal") else f"{row['system']} ({dialect})"


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """One bar group per scenario/case, a bar per system (and dialect); the value over raw's (raw = 1)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = list(dict.fromkeys((r["scenario"], r["case"]) for r in rows))
    systems = list(dict.fromkeys(_label(r) for r in rows))
    values = {(r["scenario"], r["case"], _label(r)): r.get("ratio_to_raw") for r in rows}
    width = 0.8 / max(1, len(systems))
    figure, axes = plt.subplots(figsize=(max(6, 1.4 * len(cases)), 4))
    for index, system in enumerate(systems):
        heights = [values.get((s, c, system)) or 0 for s, c in cases]
        axes.bar([i + index * width for i in range(len(cases))], heights, width, label=system)
    axes.set_xticks([i + width * (len(systems) - 1) / 2 for i in range(len(cases))])
    axes.set_xticklabels([f"{s}\n{c}" for s, c in cases], fontsize=8)
    axes.axhline(1.0, color="grey", linewidth=0.8)
    axes.set_yscale("log")
    axes.set_ylabel("value / raw, same run (log)\nlatency, memory: lower is better")
    axes.legend()
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
