"""``router keys``: create, list and revoke NoLag API keys."""

from __future__ import annotations

import argparse
import json
import sys
import time

from router.settings import settings_from_args


def add_commands(sub: argparse._SubParsersAction) -> None:
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
    create.set_defaults(func=cmd_create)
    keys_list = keys_sub.add_parser("list", help="list keys (never their secrets)")
    keys_list.add_argument("--config", help="TOML config file (default: $ROUTER_CONFIG)")
    keys_list.add_argument("--json", action="store_true")
    keys_list.set_defaults(func=cmd_list)
    revoke = keys_sub.add_parser("revoke", help="revoke a key: new connections are refused, live ones closed")
    revoke.add_argument("--config", help="TOML config file (default: $ROUTER_CONFIG)")
    revoke.add_argument("key_id")
    revoke.set_defaults(func=cmd_revoke)


def _key_store(args: argparse.Namespace):
    """The store the gateways read: PostgreSQL with ``store.url``, else ``nolag.keys_path``."""
    from actors.nolag.keys import open_key_store

    return open_key_store(settings_from_args(args))


def cmd_create(args: argparse.Namespace) -> int:
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


def cmd_list(args: argparse.Namespace) -> int:
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


def cmd_revoke(args: argparse.Namespace) -> int:
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
