"""``router mx``: generate node frames, and replay them into the router like a node."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from router.settings import settings_from_args


def add_commands(sub: argparse._SubParsersAction) -> None:
    mx = sub.add_parser("mx", help="mx-notifier hub: generate blocks, replay them as a node")
    mx_sub = mx.add_subparsers(dest="mx_command", required=True)
    generate = mx_sub.add_parser("generate", help="write generated SaveBlock frames to a file")
    generate.add_argument("out", help="file to write (JSON lines)")
    generate.add_argument("--blocks", type=int, default=10)
    generate.add_argument("--transactions", type=int, default=20, help="per block")
    generate.add_argument("--seed", type=int, default=1)
    generate.add_argument("--marshaller", choices=("gogo", "json"), default="gogo")
    generate.set_defaults(func=cmd_generate)
    replay = mx_sub.add_parser("replay", help="send a file of node frames to the router's /save "
                                                "(with mx.node_token as the node credential when it is set)")
    replay.add_argument("file")
    replay.add_argument("--config", help="TOML config file (default: $ROUTER_CONFIG)")
    replay.add_argument("--url", help="default ws://<host>:<mx.ingest.port or port><mx.ingest.path>")
    replay.add_argument("--no-ack", action="store_true", help="do not ask for ACKs (no stop-and-wait)")
    replay.set_defaults(func=cmd_replay)


def cmd_generate(args: argparse.Namespace) -> int:
    """Write generated SaveBlock / FinalizedBlock frames to a file (for `router mx replay`)."""
    from gateways.mx.replay import generate_file

    counts = generate_file(Path(args.out), args.blocks, args.transactions, args.seed, args.marshaller)
    print(f"wrote {args.out}: {counts['SaveBlock']} blocks, {counts['events']} log events, "
          f"{counts['FinalizedBlock']} finalized ({args.marshaller})")
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    """Send a file of node frames to the router's /save like a node (stop-and-wait on ACKs)."""
    import asyncio

    from websockets.exceptions import InvalidStatus

    from gateways.mx.replay import replay

    settings = settings_from_args(args)
    ingest = settings.mx.ingest
    url = args.url or f"ws://{settings.client_host}:{ingest.port or settings.port}{ingest.path}"
    token = settings.mx.node_token.get_secret_value() if settings.mx.node_token is not None else None
    try:
        result = asyncio.run(replay(url, Path(args.file), not args.no_ack, token=token))
    except (OSError, TimeoutError, InvalidStatus) as error:
        print(f"router mx replay: {url}: {error}", file=sys.stderr)
        return 1
    print(json.dumps(result))
    return 0
