"""``router`` command line: serve, status, config."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Sequence

from router import __version__
from gateways.cashu.config import CASHU_KINDS
from router.config import ConfigError
from router.settings import RouterSettings, load_settings

logger = logging.getLogger("router")


def _settings(args: argparse.Namespace, **extra: Any) -> RouterSettings:
    overrides = {
        "host": getattr(args, "host", None),
        "port": getattr(args, "port", None),
        "gateways": getattr(args, "gateways", None),
        "ray_address": getattr(args, "address", None),
        "namespace": getattr(args, "namespace", None),
        **extra,
    }
    return load_settings(getattr(args, "config", None), **overrides)


def _print_endpoints(settings: RouterSettings, endpoints: list[dict[str, Any]]) -> None:
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::") else settings.host
    for gateway in endpoints:
        for listener in gateway["listeners"]:
            port = listener["port"]
            for dialect, path in sorted(listener["websocket"].items()):
                print(f"  {dialect:<8} ws://{host}:{port}{path}   (gateway {gateway['gateway']})", flush=True)
            print(f"  {'health':<8} http://{host}:{port}/health", flush=True)


def cmd_serve(args: argparse.Namespace) -> int:
    settings = _settings(args)
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
        while not stop.is_set():
            router.supervise(timeout=0.5)
    finally:
        print("router: shutting down", flush=True)
        router.stop()
        print("router: stopped", flush=True)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    settings = _settings(args)
    import ray

    from router.runtime import cluster_status

    ray.init(address=settings.ray_address or "auto", namespace=settings.namespace, logging_level=logging.WARNING)
    try:
        status = cluster_status(settings.namespace)
    finally:
        ray.shutdown()
    if args.json:
        print(json.dumps(status, indent=2, default=str))
        return 0
    print(f"namespace {status['namespace']}: {len(status['gateways'])} gateway(s), {len(status['shards'])} shard(s)")
    for gateway in status["gateways"]:
        ports = ",".join(str(listener["port"]) for listener in gateway["listeners"])
        print(f"  gateway {gateway['gateway']:<22} ports {ports:<12} connections {gateway['connections']:>6}"
              f"  delivered {gateway['delivered']:>10}")
    for shard in sorted(status["shards"], key=lambda s: s["name"]):
        sizes = ", ".join(f"{k} {v}" for k, v in shard.items()
                          if k not in ("name", "kind", "epoch", "pid", "batches", "commands") and not isinstance(v, dict))
        print(f"  {shard['name']:<18} batches {shard['batches']:>8}  commands {shard['commands']:>10}  {sizes}")
    return 0


def cmd_analytics(args: argparse.Namespace) -> int:
    settings = _settings(args)
    from router.analytics import AnalyticsError, parse_duration, parse_instant, run_report, summary_text

    def progress(message: str) -> None:
        print(f"analytics: {message}", flush=True)

    try:
        now = time.time_ns()
        since = parse_instant(args.since, now)
        until = parse_instant(args.until, now)
        window = parse_duration(args.window)
        events_dir = Path(args.events) if args.events else settings.events_dir
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


def cmd_cashu_push(args: argparse.Namespace) -> int:
    """Push object states into the router's Cashu state feed (what a mint does on every change)."""
    from gateways.cashu.feed import FeedError, StateFeed

    settings = _settings(args)
    key = args.key or (settings.cashu.state_api_key.get_secret_value() if settings.cashu.state_api_key else None)
    if not key:
        print("router cashu push: no API key: pass --key or set cashu.state_api_key", file=sys.stderr)
        return 2
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::") else settings.host
    url = args.url or f"http://{host}:{settings.port}"
    try:
        payloads = [json.loads(text) for text in (args.payload or sys.stdin.read().splitlines()) if text.strip()]
    except json.JSONDecodeError as error:
        print(f"router cashu push: a payload is not JSON: {error}", file=sys.stderr)
        return 2
    try:
        results = StateFeed(url, key, settings.cashu.state_path).push_many((args.kind, p) for p in payloads)
    except FeedError as error:
        print(f"router cashu push: {error}", file=sys.stderr)
        return 1
    except OSError as error:
        print(f"router cashu push: cannot reach {url}: {error}", file=sys.stderr)
        return 1
    for result in results:
        print(json.dumps(result))
    return 0


def cmd_mx_generate(args: argparse.Namespace) -> int:
    """Write generated SaveBlock / FinalizedBlock frames to a file (for `router mx replay`)."""
    from gateways.mx.replay import generate_file

    counts = generate_file(Path(args.out), args.blocks, args.transactions, args.seed, args.marshaller)
    print(f"wrote {args.out}: {counts['SaveBlock']} blocks, {counts['events']} log events, "
          f"{counts['FinalizedBlock']} finalized ({args.marshaller})")
    return 0


def cmd_mx_replay(args: argparse.Namespace) -> int:
    """Send a file of node frames to the router's /save like a node (stop-and-wait on ACKs)."""
    import asyncio

    from gateways.mx.replay import replay

    settings = _settings(args)
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::") else settings.host
    url = args.url or f"ws://{host}:{settings.mx.ingest.port or settings.port}{settings.mx.ingest.path}"
    try:
        result = asyncio.run(replay(url, Path(args.file), not args.no_ack))
    except (OSError, TimeoutError) as error:
        print(f"router mx replay: {url}: {error}", file=sys.stderr)
        return 1
    print(json.dumps(result))
    return 0


def _key_store(args: argparse.Namespace):
    from actors.nolag.keys import KeyStore

    return KeyStore(_settings(args).data_dir / "keys.sqlite3")


def cmd_keys_create(args: argparse.Namespace) -> int:
    from actors.nolag.keys import AclError

    store = _key_store(args)
    try:
        token, record = store.create(args.project, "sandbox" if args.sandbox else "live",
                                     publish=args.publish or ["#"], subscribe=args.subscribe or ["#"],
                                     rate_limit_per_s=args.rate_limit, monthly_quota=args.monthly_quota)
    except (AclError, ValueError) as error:
        print(f"router keys create: {error}", file=sys.stderr)
        return 2
    finally:
        store.close()
    print(f"key id: {record.key_id}")
    print(f"token:  {token}")
    print("the token is shown only once; the router keeps only a hash of its secret", file=sys.stderr)
    return 0


def cmd_keys_list(args: argparse.Namespace) -> int:
    store = _key_store(args)
    try:
        records = store.list()
    finally:
        store.close()
    if args.json:
        print(json.dumps([record.to_dict() for record in records], indent=2))
        return 0
    print(f"{'key id':<16}  {'env':<7}  {'project':<16}  {'rate/s':>6}  {'quota':>10}  {'created (UTC)':<19}  "
          "revoked  publish | subscribe")
    for record in records:
        created = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(record.created_at))
        quota = "-" if record.monthly_quota is None else str(record.monthly_quota)
        revoked = "yes" if record.revoked_at is not None else "no"
        print(f"{record.key_id:<16}  {record.environment:<7}  {record.project_id:<16}  {record.rate_limit_per_s:>6}  "
              f"{quota:>10}  {created:<19}  {revoked:<7}  {' '.join(record.publish)} | {' '.join(record.subscribe)}")
    return 0


def cmd_keys_revoke(args: argparse.Namespace) -> int:
    store = _key_store(args)
    try:
        revoked = store.revoke(args.key_id)
    finally:
        store.close()
    if not revoked:
        print(f"router keys revoke: no active key {args.key_id!r}", file=sys.stderr)
        return 1
    print(f"revoked {args.key_id}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    """Benchmarks: the router against the raw websockets ceiling and Redis, one run (router/bench)."""
    from router.bench import run

    return run(args)


def cmd_config(args: argparse.Namespace) -> int:
    settings = _settings(args)
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

    analytics = sub.add_parser("analytics", help="throughput report from the event log (Spark on Ray via RayDP)")
    common(analytics)
    analytics.add_argument("--since", default="1h", help="start: a duration ago (1h, 30m) or an ISO time (default 1h)")
    analytics.add_argument("--until", default=None, help="end: 'now' (default), a duration ago, or an ISO time")
    analytics.add_argument("--out", help="output folder (default ./router-report-<time>)")
    analytics.add_argument("--window", default="10s", help="time window of the throughput tables (default 10s)")
    analytics.add_argument("--top", type=int, default=10, help="rows in the top-topics/connections tables")
    analytics.add_argument("--events", help="event log folder (default <data_dir>/events)")
    analytics.set_defaults(func=cmd_analytics)

    cashu = sub.add_parser("cashu", help="Cashu NUT-17: push mint object states into the router")
    cashu_sub = cashu.add_subparsers(dest="cashu_command", required=True)
    push = cashu_sub.add_parser("push", help="store states and notify subscribed wallets")
    push.add_argument("--config", help="TOML config file (default: $ROUTER_CONFIG)")
    push.add_argument("--url", help="router base URL (default http://<host>:<port> from the config)")
    push.add_argument("--key", help="the state feed's API key (default: cashu.state_api_key)")
    push.add_argument("kind", choices=CASHU_KINDS, help="subscription kind of the objects")
    push.add_argument("payload", nargs="*", help="JSON payloads (NUT-04/05 quote or NUT-07 proof state); "
                      "none: one per line on stdin")
    push.set_defaults(func=cmd_cashu_push)

    mx = sub.add_parser("mx", help="mx-notifier hub: generate blocks, replay them as a node")
    mx_sub = mx.add_subparsers(dest="mx_command", required=True)
    generate = mx_sub.add_parser("generate", help="write generated SaveBlock frames to a file")
    generate.add_argument("out", help="file to write (JSON lines)")
    generate.add_argument("--blocks", type=int, default=10)
    generate.add_argument("--transactions", type=int, default=20, help="per block")
    generate.add_argument("--seed", type=int, default=1)
    generate.add_argument("--marshaller", choices=("gogo", "json"), default="gogo")
    generate.set_defaults(func=cmd_mx_generate)
    replay = mx_sub.add_parser("replay", help="send a file of node frames to the router's /save")
    replay.add_argument("file")
    replay.add_argument("--config", help="TOML config file (default: $ROUTER_CONFIG)")
    replay.add_argument("--url", help="default ws://<host>:<mx.ingest.port or port><mx.ingest.path>")
    replay.add_argument("--no-ack", action="store_true", help="do not ask for ACKs (no stop-and-wait)")
    replay.set_defaults(func=cmd_mx_replay)

    keys = sub.add_parser("keys", help="NoLag API keys: create, list, revoke")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    create = keys_sub.add_parser("create", help="create a key and print its token (once)")
    create.add_argument("--config", help="TOML config file (default: $ROUTER_CONFIG)")
    create.add_argument("--project", required=True, help="project id the key belongs to")
    create.add_argument("--sandbox", action="store_true", help="an at_sandbox_ key (default: at_live_)")
    create.add_argument("--publish", nargs="+", metavar="PATTERN",
                        help="topics it may publish to: app/room/topic with *, + (one segment), # (the rest); "
                        "default #")
    create.add_argument("--subscribe", nargs="+", metavar="PATTERN", help="topics it may subscribe to; default #")
    create.add_argument("--rate-limit", type=int, default=50, help="messages per second per connection (default 50)")
    create.add_argument("--monthly-quota", type=int, default=None, help="messages per calendar month, UTC "
                        "(default unlimited)")
    create.set_defaults(func=cmd_keys_create)
    keys_list = keys_sub.add_parser("list", help="list keys (never their secrets)")
    keys_list.add_argument("--config", help="TOML config file (default: $ROUTER_CONFIG)")
    keys_list.add_argument("--json", action="store_true")
    keys_list.set_defaults(func=cmd_keys_list)
    revoke = keys_sub.add_parser("revoke", help="revoke a key: new connections are refused, live ones closed")
    revoke.add_argument("--config", help="TOML config file (default: $ROUTER_CONFIG)")
    revoke.add_argument("key_id")
    revoke.set_defaults(func=cmd_keys_revoke)

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
