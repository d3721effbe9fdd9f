"""`lnk sandbox run|list|stop|pause|resume`: run a program in a sandbox; manage your sandboxes."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from lnk_cli.exit_statuses import RUN_EPILOG
from lnk_shared.display import shown
from lnk_shared.errors import EXIT_OK, UsageError
from lnk_shared.spec_flags import add_spec_arguments

# typing.TYPE_CHECKING without importing typing, which `lnk sandbox run` never needs.
TYPE_CHECKING = False

if TYPE_CHECKING:
    from typing import Any

__all__ = ["register"]


def register(groups: Any) -> None:
    sandbox = groups.add_parser("sandbox", help="run a program in a sandbox; list or stop them")
    commands = sandbox.add_subparsers(dest="command", metavar="COMMAND", parser_class=type(sandbox))
    sandbox.set_defaults(handler=lambda _a: (sandbox.print_help(sys.stderr), 2)[1])

    run = commands.add_parser(
        "run",
        help="run PROGRAM in a sandbox that opens only what the spec grants",
        usage="lnk sandbox run [--spec F] [flags] [--yes] -- PROGRAM [ARGS...]",
        epilog="Lease: the sandbox is stopped and cleaned away when its lease ends, 12 hours "
        "after its start by default (the box's lease_seconds in controller.toml); its "
        "processes are killed and this command exits 137. Extend it from now with "
        "`lnk sandbox lease ID --seconds N` (ID from `lnk sandbox list`; at most the box's "
        "max_lease_seconds, 7 days by default). " + RUN_EPILOG[0].upper() + RUN_EPILOG[1:],
    )
    add_spec_arguments(run)
    run.add_argument("--yes", action="store_true", help="approve a new or changed spec")
    run.add_argument("program", nargs=argparse.REMAINDER, help="-- PROGRAM [ARGS...]")
    run.set_defaults(handler=cmd_run)

    listing = commands.add_parser("list", help="your running sandboxes")
    listing.add_argument("--json", action="store_true")
    listing.add_argument("--all", action="store_true", help="ended ones too")
    listing.set_defaults(handler=cmd_list)

    show = commands.add_parser("show", help="one sandbox: its state, limits and exit")
    show.add_argument("id")
    show.add_argument("--json", action="store_true")
    show.set_defaults(handler=cmd_show)

    for name, what in (
        ("stop", "stop a sandbox and clean it away"),
        ("pause", "freeze every process of a sandbox"),
        ("resume", "let a paused sandbox go on"),
    ):
        sub = commands.add_parser(name, help=what)
        sub.add_argument("id")
        sub.set_defaults(handler=cmd_action, action=name)

    wire = commands.add_parser("wire", help="the proxy's decisions for a sandbox, one a line")
    wire.add_argument("id")
    wire.add_argument("--follow", action="store_true", help="keep printing until it ends")
    wire.add_argument("--json", action="store_true", help="the log's own JSON lines")
    wire.set_defaults(handler=cmd_wire)

    lease = commands.add_parser("lease", help="extend a sandbox's lease from now")
    lease.add_argument("id")
    lease.add_argument("--seconds", type=int, required=True)
    lease.set_defaults(handler=cmd_lease)

    from lnk_cli.check.command import register as register_check

    register_check(commands)

    from lnk_cli import enter_command  # the SSH gate's forced command

    enter_command.register(commands)


FOLLOW_INTERVAL_S = 0.5  # how often --follow asks for new lines
COMMAND_SHOWN = 60  # characters of a command `list` shows (`show ID` shows it whole)


def _wire_line(raw: str) -> str:
    """One decision for a person; the text came from a sandbox's requests, so no control
    character reaches the terminal whatever the log holds."""
    try:
        doc = json.loads(raw)
        text = (
            f"{doc['time']}  {doc['decision']:<8} {doc['rule']:<22} {doc['method']} "
            f"{doc['target']} {('-> ' + doc['address']) if doc.get('address') else ''} "
            f"up {doc['up']} down {doc['down']}"
            + (f" x{doc['repeated']} (repeats, counted)" if doc.get("repeated") else "")
        )
    except (ValueError, KeyError, TypeError):
        text = raw
    return shown(text)


def cmd_wire(args: argparse.Namespace) -> int:
    offset = 0
    while True:
        doc = _call("GET", f"/v1/sandboxes/{_sandbox_id(args)}/wire?offset={offset}")
        for raw in doc["lines"]:
            print(shown(raw) if args.json else _wire_line(raw), flush=True)
        offset = doc["offset"]
        if not args.follow or (doc["ended"] and not doc["lines"]):
            return EXIT_OK
        if not doc["lines"]:
            time.sleep(FOLLOW_INTERVAL_S)


def cmd_lease(args: argparse.Namespace) -> int:
    row = _call("POST", f"/v1/sandboxes/{_sandbox_id(args)}/lease", {"seconds": args.seconds})
    print(f"{row['id']}: lease until {row['lease_expires_at']}")
    return EXIT_OK


def _sandbox_id(args: argparse.Namespace) -> str:
    from lnk_shared.api_client import path_segment

    return path_segment(str(args.id), "sandbox (its id, from `lnk sandbox list`)")


def _call(method: str, url: str, body: dict[str, Any] | None = None) -> Any:
    from lnk_shared.controller_api import call

    return call(method, url, body, not_found="no such sandbox (or not yours)")


def cmd_run(args: argparse.Namespace) -> int:
    from lnk_cli.launch_client import run_in_sandbox

    command = list(args.program)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UsageError("name the program to run: lnk sandbox run [flags] -- PROGRAM [ARGS...]")
    return run_in_sandbox(args, command)


def cmd_list(args: argparse.Namespace) -> int:
    rows = _call("GET", "/v1/sandboxes" + ("?all=true" if args.all else ""))
    if args.json:
        json.dump(rows, sys.stdout, indent=2)
        print()
        return EXIT_OK
    if not rows:
        print("no sandboxes" if args.all else "no running sandboxes (--all: ended ones too)")
        return EXIT_OK
    for line in list_lines(rows, owners=os.geteuid() == 0):
        print(line)
    return EXIT_OK


def list_lines(rows: list[dict[str, Any]], *, owners: bool) -> list[str]:
    """`lnk sandbox list` as a table; `owners` (root sees everyone's): an OWNER column."""
    from lnk_cli.tables import table

    header = ["ID", "STATE", "UID", *(["OWNER"] if owners else []), "STARTED", "COMMAND"]
    body = []
    for r in rows:
        state = _state(r) + (" (paused)" if r["paused"] else "")
        command = r.get("command")
        text = shown(" ".join(command)) if command is not None else "(not yours to see)"
        if len(text) > COMMAND_SHOWN:
            text = text[: COMMAND_SHOWN - 1] + "…"
        if r.get("limit_met"):  # after the command, whole: the last column is never cut
            text += f"  ({shown(r['limit_met'])})"
        owner = [_owner_name(r.get("owner_uid"))] if owners else []
        started = str(r.get("created_at") or "")[:19].replace("T", " ")
        cells = [str(r["id"]), state, str(r["host_uid"]), *owner, started]
        body.append([*(shown(c) for c in cells), text])
    return table(header, body)


def _owner_name(uid: object) -> str:
    import pwd

    if type(uid) is not int:
        return "?"
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)  # an account gone since: its number is all there is


def cmd_show(args: argparse.Namespace) -> int:
    row = _call("GET", f"/v1/sandboxes/{_sandbox_id(args)}")
    if args.json:
        json.dump(row, sys.stdout, indent=2)
        print()
        return EXIT_OK
    paused = " (paused)" if row["paused"] else ""
    ended = "" if row["exit_status"] is None else f", exit status {row['exit_status']}"
    print(f"{shown(row['id'])}: {shown(_state(row))}{paused}{ended}")
    if row.get("command") is not None:  # the owner's to see only
        print(f"  command: {shown(' '.join(row['command']))}")
    print(f"  limits: {shown(row.get('limits') or 'not recorded')}")
    if row.get("limit_met"):
        print(f"  limit met: {shown(row['limit_met'])}")
    denials = row.get("denials")
    if isinstance(denials, dict) and denials.get("count"):
        print(f"  denied by the kernel ({denials['count']} time(s)), for example:")
        for line in denials.get("examples") or []:
            print(f"    {shown(str(line))}")
    print(f"  lease until {row['lease_expires_at']}")
    return EXIT_OK


def _state(row: dict[str, Any]) -> str:
    """A row's state as a person reads it: a clean-up that failed says why it is retried."""
    why = row.get("retrying")
    return f"cleaning (retrying: {why})" if why else str(row["state"])


def cmd_action(args: argparse.Namespace) -> int:
    row = _call("POST", f"/v1/sandboxes/{_sandbox_id(args)}/{args.action}")
    print(f"{row['id']}: {row['state']}{' (paused)' if row['paused'] else ''}")
    return EXIT_OK
