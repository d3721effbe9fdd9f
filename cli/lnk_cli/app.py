"""The `lnk` command: parses arguments, dispatches, and is the one place errors become exits."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Sequence

from lnk_cli.exit_statuses import EPILOG, runs_a_program
from lnk_cli.launch_dialogue import reported
from lnk_shared.errors import EXIT_USAGE, UsageError

__all__ = ["build_parser", "leaves", "run"]

VERSION = "0.1.0"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message} (see {self.prog} --help)")


# Each command group and the module that registers it. Only the group a command names is
# imported: `lnk sandbox run` starts a sandbox, and every module it does not need is time
# spent before the sandbox exists.
GROUPS = {
    "sandbox": "lnk_cli.sandbox_commands",
    "spec": "lnk_cli.spec_commands",
    "box": "lnk_admin.box_commands",  # root's admin room, not the client's
    "agent": "lnk_cli.agent_commands",
    "bridge": "lnk_cli.bridge_commands",
    "secret": "lnk_cli.secret_cmd",
}
# Groups whose stray words are never repeated in an error: what a person typed there by
# mistake may be a secret's value (`lnk secret set NAME VALUE`).
UNREPEATED = {"secret": "lnk_cli.secret_cmd"}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole parser, or with `only` a known group name, a parser holding just that group."""
    import importlib

    parser = _Parser(
        prog="lnk",
        description="lnk box: run programs in sandboxes that start closed.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"lnk {VERSION}")
    groups = parser.add_subparsers(dest="group", metavar="COMMAND", parser_class=_Parser)
    for name, module in GROUPS.items():
        if only is None or only == name:
            importlib.import_module(module).register(groups)
    return parser


def leaves(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every command the parser takes, as (its words after `lnk`, its own parser): what the
    man page, the completions and the tests that walk every command see."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
    for sub in subs:
        for name, child in sub.choices.items():
            yield from leaves(child, (*path, name))


def run(argv: Sequence[str]) -> int:
    words = list(argv)
    return reported(lambda: _run(words), runs=runs_a_program(words))


def _run(words: list[str]) -> int:
    parser = build_parser(words[0] if words and words[0] in GROUPS else None)
    args, extra = parser.parse_known_args(words)
    if extra:
        if args.group in UNREPEATED:
            import importlib

            never = importlib.import_module(UNREPEATED[args.group]).NEVER_ARGV
            raise UsageError(f"{parser.prog} {args.group}: words it does not take ({never})")
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    result: int = handler(args)
    return result
