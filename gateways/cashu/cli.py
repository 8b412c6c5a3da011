"""``router cashu``: push mint object states into the router's state feed."""

from __future__ import annotations

import argparse
import json
import sys

from gateways.cashu.config import CASHU_KINDS
from router.settings import settings_from_args


def add_commands(sub: argparse._SubParsersAction) -> None:
    cashu = sub.add_parser("cashu", help="Cashu NUT-17: push mint object states into the router")
    cashu_sub = cashu.add_subparsers(dest="cashu_command", required=True)
    push = cashu_sub.add_parser("push", help="store states and notify subscribed wallets")
    push.add_argument("--config", help="TOML config file (default: $ROUTER_CONFIG)")
    push.add_argument("--url", help="router base URL (default http://<host>:<port> from the config)")
    push.add_argument("--key", help="the state feed's API key (default: cashu.state_api_key)")
    push.add_argument("kind", choices=CASHU_KINDS, help="subscription kind of the objects")
    push.add_argument("payload", nargs="*", help="JSON payloads (NUT-04/05 quote or NUT-07 proof state); "
                      "none: one per line on stdin")
    push.set_defaults(func=cmd_push)


def cmd_push(args: argparse.Namespace) -> int:
    """Push object states into the router's Cashu state feed (what a mint does on every change)."""
    from gateways.cashu.feed import FeedError, StateFeed

    settings = settings_from_args(args)
    key = args.key or (settings.cashu.state_api_key.get_secret_value() if settings.cashu.state_api_key else None)
    if not key:
        print("router cashu push: no API key: pass --key or set cashu.state_api_key", file=sys.stderr)
        return 2
    url = args.url or f"http://{settings.client_host}:{settings.port}"
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
