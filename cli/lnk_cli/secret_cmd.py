"""`lnk secret set|list|remove`: the owner's secrets, kept by the controller outside every
sandbox, added upstream by the proxy for a rule that names them (`[[services]]`).

A value is read from standard input (one trailing newline dropped) or, on a terminal, from a
prompt that does not echo: never from the command line, where every user of the machine can
read it (`/proc/PID/cmdline`) and the shell keeps it in its history. It is never printed back.

Security limitations: this does NOT keep a value out of wherever standard input came from (a
file the owner left, a pipe's producer); the owner chooses that.
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys
import urllib.parse
from typing import Any

from lnk_shared.display import shown
from lnk_shared.errors import EXIT_OK, UsageError
from lnk_shared.secret_names import MAX_SECRET_BYTES, check_secret_name, check_secret_value

__all__ = ["read_value", "register"]

NEVER_ARGV = (
    "a secret's value is never given on the command line (every user here can read it there): "
    "`lnk secret set NAME` reads it from standard input, or prompts for it on a terminal"
)


def register(groups: Any) -> None:
    secret = groups.add_parser("secret", help="your secrets, added outside by the proxy")
    commands = secret.add_subparsers(dest="command", metavar="COMMAND", parser_class=type(secret))
    secret.set_defaults(handler=lambda _args: _usage(secret))

    put = commands.add_parser(
        "set", help="keep a secret: its value from standard input, or a prompt without echo"
    )
    put.add_argument("name", help="the secret's name, as a spec's [[services]] secret names it")
    put.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    put.set_defaults(handler=cmd_set)

    listing = commands.add_parser("list", help="your secrets' names (never their values)")
    listing.add_argument("--json", action="store_true", help="a JSON document instead of lines")
    listing.set_defaults(handler=cmd_list)

    remove = commands.add_parser("remove", help="remove a secret: the next request using it fails")
    remove.add_argument("name")
    remove.set_defaults(handler=cmd_remove)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _api(method: str, url: str, body: dict[str, Any] | None = None) -> Any:
    from lnk_shared.controller_api import call

    return call(method, url, body)


def read_value(name: str, stdin: Any, *, prompt: Any = getpass.getpass) -> bytes:
    """The value: from a prompt (twice, without echo) when `stdin` is a terminal, else all of
    `stdin`, one trailing newline dropped. UsageError, never quoting it, when it cannot be kept.
    """
    if stdin.isatty():
        first = prompt(f"value of the secret {name} (not shown): ")
        again = prompt("the same again: ")
        if first != again:
            raise UsageError("the two values typed differ: nothing was kept, try again")
        try:
            return check_secret_value(first.encode("ascii"))
        except UnicodeEncodeError:
            raise UsageError(
                "the secret's value holds a non-ASCII character: a token or key is visible "
                "ASCII only"
            ) from None
    data: bytes = stdin.buffer.read(MAX_SECRET_BYTES + 3)
    if data.endswith(b"\r\n"):
        data = data[:-2]
    elif data.endswith(b"\n"):
        data = data[:-1]
    return check_secret_value(data)


def cmd_set(args: argparse.Namespace) -> int:
    if args.rest:
        raise UsageError(NEVER_ARGV)
    name = check_secret_name(args.name)
    value = read_value(name, sys.stdin)
    doc = _api("PUT", f"/v1/secrets/{urllib.parse.quote(name)}", {"value": value.decode("ascii")})
    print(f"{'kept' if doc.get('new') else 'replaced'}: the secret {name}")
    return EXIT_OK


def cmd_list(args: argparse.Namespace) -> int:
    rows = _api("GET", "/v1/secrets")
    if args.json:
        json.dump(rows, sys.stdout, indent=2)
        print()
        return EXIT_OK
    if not rows:
        print("no secrets")
        return EXIT_OK
    from lnk_cli.tables import table

    for line in table(
        ["NAME", "SET"], [[shown(r["name"]), shown(r["updated_at"][:16])] for r in rows]
    ):
        print(line)
    return EXIT_OK


def cmd_remove(args: argparse.Namespace) -> int:
    name = check_secret_name(args.name)
    _api("DELETE", f"/v1/secrets/{urllib.parse.quote(name)}")
    print(f"removed: the secret {name}")
    return EXIT_OK
