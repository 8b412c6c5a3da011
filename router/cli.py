"""``router`` command line: serve, status, analytics, bench, config, and each dialect's commands."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Sequence

from gateways.dialects import DIALECTS
from router import __version__
from router.config import ConfigError
from router.settings import RouterSettings, settings_from_args

logger = logging.getLogger("router")


def _print_endpoints(settings: RouterSettings, endpoints: list[dict[str, Any]]) -> None:
    host = settings.client_host
    for gateway in endpoints:
        for listener in gateway["listeners"]:
            port = listener["port"]
            for dialect, path in sorted(listener["websocket"].items()):
                print(f"  {dialect:<8} ws://{host}:{port}{path}   (gateway {gateway['gateway']})", flush=True)
            print(f"  {'health':<8} http://{host}:{port}/health", flush=True)


def cmd_serve(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from router.runtime import Router  # imports Ray: keep `router --help` fast

    stop = threading.Event()

    def request_stop(signum: int, frame: Any) -> None:
        stop.set()

    router = Router(settings)
    mode = f"joining Ray at {settings.ray_address}" if settings.ray_address else "embedded Ray"
    print(f"router {__version__}: starting ({mode}, namespace {settings.namespace!r})", flush=True)
    try:
        endpoints = router.start()
    except Exception as error:
        print(f"router: failed to start: {error}", file=sys.stderr, flush=True)
        router.stop()
        return 1
    print("router: ready", flush=True)
    _print_endpoints(settings, endpoints)
    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    try:
        restarts = router.restarts
        while not stop.is_set() and router.supervise(timeout=0.5):
            if router.restarts != restarts:  # a replacement keeps the ports; say where, all the same
                restarts = router.restarts
                print("router: a gateway was replaced; listening:", flush=True)
                _print_endpoints(settings, router.endpoints())
    finally:
        print("router: shutting down", flush=True)
        router.stop()
        print("router: stopped", flush=True)
    return 0


def _on_cluster(settings: RouterSettings, action: Any) -> Any:
    """``action(namespace)`` connected to the router's Ray cluster (``--address``, else ``auto``).

    While connected, standard output goes to standard error: a Ray driver prints on its stdout what
    the cluster publishes to every driver (``(raylet) …`` warnings: too many workers starting, a
    node marked dead), which would break ``--json``; the command prints its own output after."""
    import ray

    with contextlib.redirect_stdout(sys.stderr):
        ray.init(address=settings.ray_address or "auto", namespace=settings.namespace, logging_level=logging.WARNING)
        try:
            return action(settings.namespace)
        finally:
            ray.shutdown()


def cmd_status(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    from router.runtime import cluster_status, store_status

    status = {**_on_cluster(settings, cluster_status), "store": store_status(settings)}
    if args.json:
        print(json.dumps(status, indent=2, default=str))
        return 0
    nodes, lanes, store = status["nodes"], status["lanes"], status["store"]
    print(f"namespace {status['namespace']}: {sum(n['alive'] for n in nodes)} of {len(nodes)} node(s) alive, "
          f"{len(status['gateways'])} gateway(s), {len(status['shards'])} shard(s); "
          f"lanes {lanes['unix']} unix, {lanes['tcp']} tcp")
    where = store.get("url") or store.get("data_dir")
    health = "ok" if store["ok"] else f"NOT OK: {store.get('error') or 'missing'}"
    print(f"store: {store['backend']} {where} {health}")
    shards = sorted(status["shards"], key=lambda s: s["name"])
    for node in nodes:
        if not node["alive"] and not node["gateways"] and not node["shards"]:
            continue  # a node lost earlier that holds nothing of this router
        role = " head" if node["head"] else ""
        print(f"node {node['name']} {node['id'][:12]} {node['address']} {'alive' if node['alive'] else 'DEAD'}{role}")
        for gateway in status["gateways"]:
            if gateway["node"] == node["id"]:
                _print_gateway(gateway)
        for shard in shards:
            if shard["node"] == node["id"]:
                _print_shard(shard)
    known = {node["id"] for node in nodes}
    unplaced = [g for g in status["gateways"] if g["node"] not in known] + [s for s in shards if s["node"] not in known]
    if unplaced:
        print("on no node (being placed or restarted):")
        for entry in unplaced:
            (_print_shard if "kind" in entry else _print_gateway)(entry)
    return 0


def _print_gateway(gateway: dict[str, Any]) -> None:
    if "error" in gateway:
        print(f"  {gateway['name']:<30} {gateway['state']} (no answer: {gateway['error']})")
        return
    ports = ",".join(str(listener["port"]) for listener in gateway["listeners"])
    print(f"  gateway {gateway['gateway']:<22} ports {ports:<12} connections {gateway['connections']:>6}"
          f"  delivered {gateway['delivered']:>10}")


def _print_shard(shard: dict[str, Any]) -> None:
    if "error" in shard:
        print(f"  {shard['name']:<18} {shard['state']} (no answer: {shard['error']})")
        return
    kinds = list((shard.get("lane_kinds") or {}).values())
    shown = ("name", "kind", "epoch", "pid", "node", "state", "batches", "commands", "lanes", "lane_kinds", "healing",
             "healed_in")
    sizes = ", ".join(f"{k} {v}" for k, v in shard.items() if k not in shown and not isinstance(v, (dict, list)))
    print(f"  {shard['name']:<18} batches {shard['batches']:>8}  commands {shard['commands']:>10}  "
          f"lanes {kinds.count('unix')} unix {kinds.count('tcp')} tcp  {sizes}")


def cmd_stop(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    from router.runtime import stop_everything

    stopped = _on_cluster(settings, stop_everything)
    print(f"namespace {settings.namespace}: stopped {stopped['gateways']} gateway(s) and {stopped['shards']} shard(s)")
    return 0


def cmd_analytics(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    from router.analytics import AnalyticsError, parse_duration, parse_instant, run_report, summary_text

    def progress(message: str) -> None:
        print(f"analytics: {message}", flush=True)

    try:
        now = time.time_ns()
        since = parse_instant(args.since, now)
        until = parse_instant(args.until, now)
        window = parse_duration(args.window)
        events_dir = args.events or settings.events_dir  # a folder or a URL (docs/analytics.md)
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        out = Path(args.out) if args.out else Path(f"router-report-{stamp}")
        report = run_report(events_dir, out, since, until, window, args.top, settings.ray_address, progress)
    except AnalyticsError as error:
        print(f"router analytics: {error}", file=sys.stderr, flush=True)
        return 1
    print()
    print(summary_text(report.frames))
    print(f"\nreport written to {report.out_dir.resolve()}:")
    for path in report.files:
        print(f"  {path.name}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    """Benchmarks: the router against the raw websockets ceiling and Redis, one run (router/bench)."""
    from router.bench import run

    return run(args)


def cmd_config(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    print(settings.model_dump_json(indent=2, exclude={"signal": {"auth": {"secret"}}}))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="router", description="Actor-based WebSocket message router on Ray.")
    parser.add_argument("--version", action="version", version=f"router {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--config", help="TOML config file (default: $ROUTER_CONFIG)")
        p.add_argument("--address", help="Ray cluster to join: 'auto' or host:port (default: embedded Ray)")
        p.add_argument("--namespace", help="Ray namespace of this router's actors (default: router)")

    serve = sub.add_parser("serve", help="run the router")
    common(serve)
    serve.add_argument("--host", help="interface to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="main port (default 8080); gateway i listens on port + i")
    serve.add_argument("--gateways", type=int, help="gateways to start on consecutive ports (default 1)")
    serve.set_defaults(func=cmd_serve)

    status = sub.add_parser("status", help="gateways and shards of a running router")
    common(status)
    status.add_argument("--json", action="store_true", help="print the full status as JSON")
    status.set_defaults(func=cmd_status)

    stop = sub.add_parser("stop", help="stop every gateway and shard of a router on a Ray cluster")
    common(stop)
    stop.set_defaults(func=cmd_stop)

    analytics = sub.add_parser("analytics", help="throughput report from the event log (Spark on Ray via RayDP)")
    common(analytics)
    analytics.add_argument("--since", default="1h", help="start: a duration ago (1h, 30m) or an ISO time (default 1h)")
    analytics.add_argument("--until", default=None, help="end: 'now' (default), a duration ago, or an ISO time")
    analytics.add_argument("--out", help="output folder (default ./router-report-<time>)")
    analytics.add_argument("--window", default="10s", help="time window of the throughput tables (default 10s)")
    analytics.add_argument("--top", type=int, default=10, help="rows in the top-topics/connections tables")
    analytics.add_argument("--events", help="event log folder or URL (default analytics.directory, else <data_dir>/events)")
    analytics.set_defaults(func=cmd_analytics)

    for spec in DIALECTS:  # each dialect's own commands (`router keys`, `router cashu`, `router mx`)
        spec.add_commands(sub)

    bench = sub.add_parser("bench", help="benchmark the router against raw websockets and Redis on this machine")
    from router.bench import add_arguments as add_bench_arguments  # no Ray: `router --help` stays fast

    add_bench_arguments(bench)
    bench.set_defaults(func=cmd_bench)

    config = sub.add_parser("config", help="print the effective configuration (secrets hidden)")
    common(config)
    config.add_argument("--host")
    config.add_argument("--port", type=int)
    config.add_argument("--gateways", type=int)
    config.set_defaults(func=cmd_config)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as error:
        print(f"router: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
