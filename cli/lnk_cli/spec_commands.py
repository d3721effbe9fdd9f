"""`lnk spec show|approve|list`: what a spec opens, and approving it ahead of a run."""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.parse
from typing import Any

from lnk_shared.display import shown
from lnk_shared.errors import EXIT_OK, UsageError
from lnk_shared.spec_flags import add_spec_arguments

__all__ = ["FLAGS_KEY", "grants_summary", "register"]

FLAGS_KEY = "<flags>"  # the controller's key for specs given by flags alone (remembered.py)


def register(groups: Any) -> None:
    spec = groups.add_parser("spec", help="what a spec opens; approve or list remembered specs")
    commands = spec.add_subparsers(dest="command", metavar="COMMAND", parser_class=type(spec))
    spec.set_defaults(handler=lambda _args: _usage(spec))

    show = commands.add_parser("show", help="print what a spec opens, and its hash")
    add_spec_arguments(show)
    show.add_argument("--json", action="store_true", help="a JSON document instead of a table")
    show.set_defaults(handler=cmd_show)

    approve = commands.add_parser("approve", help="print what a new or changed spec opens, ask")
    add_spec_arguments(approve)
    approve.add_argument("--yes", action="store_true", help="approve without asking")
    approve.set_defaults(handler=cmd_approve)

    listing = commands.add_parser("list", help="the specs you approved, with their hashes")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(handler=cmd_list)

    forget = commands.add_parser("forget", help="forget an approval: the spec asks again")
    forget.add_argument(
        "spec",
        nargs="?",
        help='the spec file; "<flags>:HASH" one flags-only approval (as `list` shows it), '
        '"<flags>" every one',
    )
    forget.add_argument("--all", action="store_true", help="forget every approval of yours")
    forget.set_defaults(handler=cmd_forget)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def cmd_show(args: argparse.Namespace) -> int:
    from lnk_cli.spec_show import show

    return show(args)


def cmd_approve(args: argparse.Namespace) -> int:
    from lnk_cli.launch_client import run_in_sandbox

    return run_in_sandbox(args, [], dry=True)


def _spec_named(row: dict[str, Any]) -> str:
    """A spec file's path, or a flag-only spec named by what it opens."""
    spec = str(row["spec"])
    if spec.startswith(f"{FLAGS_KEY}:"):
        spec = f"{spec[: len(FLAGS_KEY) + 1 + SHOWN_HASH]}  {grants_summary(row.get('grants'))}"
    return shown(spec)


def _api(method: str, url: str) -> Any:
    from lnk_shared.controller_api import call

    return call(method, url)


def cmd_list(args: argparse.Namespace) -> int:
    rows = _api("GET", "/v1/specs")
    if args.json:
        json.dump(rows, sys.stdout, indent=2)
        print()
        return EXIT_OK
    if not rows:
        print("no approved specs")
        return EXIT_OK
    from lnk_cli.tables import table

    body = [[shown(r["hash"][:16]), shown(r["approved_at"][:16]), _spec_named(r)] for r in rows]
    for line in table(["HASH", "APPROVED", "SPEC"], body):
        print(line)
    return EXIT_OK


def cmd_forget(args: argparse.Namespace) -> int:
    if args.all == (args.spec is not None):
        raise UsageError("lnk spec forget: give a spec (or <flags>, <flags>:HASH), or --all")
    if args.all:
        doc = _api("DELETE", "/v1/specs?all=true")
        print(f"forgotten: {int(doc.get('forgotten', 0))} approvals")
        return EXIT_OK
    flags = args.spec == FLAGS_KEY or args.spec.startswith(f"{FLAGS_KEY}:")
    key = args.spec if flags else os.path.realpath(args.spec)
    doc = _api("DELETE", "/v1/specs?" + urllib.parse.urlencode({"spec": key}))
    count = int(doc.get("forgotten", 0))
    said = f"forgotten ({count} approvals)" if count > 1 else "forgotten" if count else None
    print(f"{said or 'was not remembered'}: {shown(key)}")
    return EXIT_OK


SHOWN_HASH = 16  # hex digits of a flags-only approval's hash `list` shows (forget takes 8+)
SUMMARY_ITEMS = 4  # entries of each grant `list` names before "and N more"


def grants_summary(untrusted: object) -> str:
    """What an approved grants document opens, in one line (`read ~/a; commands make`)."""
    if not isinstance(untrusted, dict):
        return ""
    parts = []
    for key, value in untrusted.items():
        if key in ("version", "hidden", "read_only_inside") or value in (None, [], ""):
            continue
        items = [value] if not isinstance(value, list) else value
        named = ", ".join(str(i) for i in items[:SUMMARY_ITEMS])
        more = f" and {len(items) - SUMMARY_ITEMS} more" if len(items) > SUMMARY_ITEMS else ""
        parts.append(f"{key} {named}{more}")
    return "; ".join(parts) or "nothing but the program run"
