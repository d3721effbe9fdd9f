"""`lnk sandbox enter`: the forced command of a box user's SSH key (glue to lnk_ssh_gate)."""

from __future__ import annotations

import argparse
import os

from lnk_cli.exit_statuses import RUN_EPILOG
from lnk_shared.errors import EXIT_OK

# typing.TYPE_CHECKING without importing typing: this module is registered on every
# `lnk sandbox ...`, which must stay light (tests/unit/lnk_cli/test_app_startup.py).
TYPE_CHECKING = False

if TYPE_CHECKING:
    from typing import Any

__all__ = ["register"]


def register(commands: Any) -> None:
    enter = commands.add_parser(
        "enter",
        help="run an SSH session in a sandbox (a key's forced command; see lnk box authorize)",
        usage="lnk sandbox enter --spec S --folder F [--run-dir R] [--account A] [--check]",
        epilog=RUN_EPILOG,
    )
    enter.add_argument("--spec", required=True, metavar="S", help="the spec file, absolute")
    enter.add_argument(
        "--folder", required=True, metavar="F", help="the one folder the session writes"
    )
    enter.add_argument(
        "--run-dir", metavar="R", help="the box's run dir (default /run/lnk); never the env"
    )
    enter.add_argument(
        "--account",
        metavar="A",
        help="the account the key was let in for (lnk box authorize writes it): no other gets in",
    )
    enter.add_argument(
        "--check", action="store_true", help="run nothing: print what the sandbox would open"
    )
    enter.set_defaults(handler=cmd_enter)


def cmd_enter(args: argparse.Namespace) -> int:
    from lnk_ssh_gate.enter import check_text, plan_session

    plan = plan_session(
        spec=args.spec,
        folder=args.folder,
        run_dir=args.run_dir,
        untrusted_environ=os.environ,
        account=args.account,
    )
    if args.check:
        print("\n".join(check_text(plan)))
        return EXIT_OK
    from lnk_cli.launch_client import run_in_sandbox

    # The launch client reads its box, PATH and locale from the environment: only the plan's.
    os.environ.clear()
    os.environ.update(plan.env)
    os.chdir(plan.folder)
    if not (os.isatty(0) and os.isatty(1)):  # a pty hangs the session up by itself
        from lnk_ssh_gate.connection import end_with_connection

        end_with_connection()
    return run_in_sandbox(plan.args, list(plan.command.argv))
