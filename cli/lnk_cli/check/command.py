"""`lnk sandbox check [--spec F] [flags] [--json]`: the command's arguments. The work is in
`runner` (its docstring says what the check chose and why), imported only when it runs, so
registering the command costs `lnk sandbox run` nothing."""

from __future__ import annotations

import argparse

from lnk_shared.spec_flags import add_spec_arguments

# typing.TYPE_CHECKING without importing typing, which `lnk sandbox run` never needs.
TYPE_CHECKING = False

if TYPE_CHECKING:
    from typing import Any

__all__ = ["cmd_check", "register"]


def register(commands: Any) -> None:
    check = commands.add_parser(
        "check",
        help="probe a sandbox made by this spec from inside, against bait; fail if it leaks",
        usage="lnk sandbox check [--spec F] [flags] [--json | --verbose] [--caps]",
    )
    add_spec_arguments(check)
    check.add_argument("--json", action="store_true", help="a JSON document for CI")
    check.add_argument(
        "--verbose", action="store_true", help="a line for every probe, refused ones too"
    )
    check.add_argument(
        "--caps",
        action="store_true",
        help="also try the shared proxy's per-sandbox caps: hold unread tunnels to the first "
        "listed host until refused (up to 300 connections to it) and flood refusals",
    )
    check.set_defaults(handler=cmd_check)


def cmd_check(args: argparse.Namespace) -> int:
    from lnk_cli.check.runner import check

    return check(args)
