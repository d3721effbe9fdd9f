"""The `lnk` command: parses arguments, dispatches, and is the one place errors become exits."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from lnk_shared.errors import EXIT_ERROR, EXIT_USAGE, LnkError, UsageError

__all__ = ["build_parser", "run"]

VERSION = "0.1.0"

EPILOG = """\
exit status:
  0  ok
  1  anything else (not approved, the box's state unusable, ...)
  2  usage error, or a spec that cannot be read (file, line and key named)
  3  refused by a rule (the rule and the entry named)
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message} (see {self.prog} --help)")


def build_parser() -> argparse.ArgumentParser:
    from lnk_cli import box_commands, sandbox_commands, spec_commands

    parser = _Parser(
        prog="lnk",
        description="lnk box: run programs in sandboxes that start closed.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"lnk {VERSION}")
    groups = parser.add_subparsers(dest="group", metavar="COMMAND", parser_class=_Parser)
    sandbox_commands.register(groups)
    spec_commands.register(groups)
    box_commands.register(groups)
    return parser


def run(argv: Sequence[str]) -> int:
    try:
        parser = build_parser()
        args = parser.parse_args(list(argv))
        handler = getattr(args, "handler", None)
        if handler is None:
            parser.print_help(sys.stderr)
            return EXIT_USAGE
        result: int = handler(args)
        return result
    except LnkError as exc:
        print(f"lnk: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("lnk: interrupted", file=sys.stderr)
        return EXIT_ERROR
    except BrokenPipeError:
        return EXIT_ERROR
