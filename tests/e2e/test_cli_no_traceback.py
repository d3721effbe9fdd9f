"""Every `lnk` command, on hostile and missing arguments, as root and as a box user, with the box
up and down: a clear one-line error (or its answer) and a documented exit status, never a
traceback, and nothing of the hostile input echoed raw to the terminal.

The commands are the parser's own leaves (a command added later is tried too). The box is one
of the test's own, so `lnk box down` or `prune` among the tries harms no other test.
"""

from __future__ import annotations

import argparse
import os
import pwd
import subprocess
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import install_prefix
import pytest
from as_user import as_user

from lnk_cli.app import build_parser, leaves
from lnk_cli.exit_statuses import runs_a_program

pytestmark = [pytest.mark.e2e, pytest.mark.needs_root]

LNK = str(install_prefix.LNK)
TIMEOUT_S = 60.0
WORKERS = 4  # lnk's own start dominates; more than the cores' worth keeps them busy
# What `lnk` may exit with: 0 ok, 1 error, 2 usage, 3 refused (exit_statuses.EPILOG); a command
# that runs a program its own 125, 126, 127, or the program's (/bin/true's 0 here).
STATUSES = {0, 1, 2, 3}
RUN_STATUSES = {0, 125, 126, 127}
# Each a kind of input a careless parser trips on: terminal controls and bidi in a name, a
# path elsewhere, another user's /proc, an empty word, a flag-like word, a huge word, a format
# string, numbers out of range, a closed descriptor for --with-fd.
HOSTILE = (
    "\x1b]0;owned\x07\x1b[2J\u202e\u009b31m/../x?y#z",
    "../../../../proc/1/environ",
    "",
    "%s%n{0}" + "A" * 5000,
)
NUMBERS = ("0", "-99999999999999999999")
# Commands that change the box itself, tried only on a box that is down (as root they would
# take it down or start it mid-test).
BOX_CHANGING = {("box", "up"), ("box", "down"), ("box", "prune")}


def _tries(
    path: tuple[str, ...], parser: argparse.ArgumentParser, *, quick: bool = False
) -> list[list[str]]:
    """Argument vectors for one command: none, --help, each hostile word everywhere, numbers
    in every option that takes a value, and a closed descriptor for --with-fd (`quick`: only
    the first hostile word, for the box down)."""
    positionals = [a for a in parser._actions if not a.option_strings]
    valued = [
        a
        for a in parser._actions
        if a.option_strings and a.nargs != 0 and not isinstance(a, argparse._HelpAction)
    ]
    tries: list[list[str]] = [[], ["--help"]]
    for word in HOSTILE if not quick else HOSTILE[:1]:
        argv: list[str] = []
        for action in valued:
            argv += [action.option_strings[0], word]
        for action in positionals:
            argv.append(action.choices[0] if action.choices else word)  # type: ignore[index]
        tries.append(argv)
    for number in NUMBERS if valued and not quick else ():
        argv = []
        for action in valued:
            argv += [action.option_strings[0], number]
        argv += ["x"] * len([a for a in positionals if a.nargs != "..."])
        tries.append(argv)
    if any("--with-fd" in a.option_strings for a in valued):
        tries.append(["--with-fd", "9:read", "--yes", "--", "/bin/true"])
    return [[*path, *argv] for argv in tries]


def _run(argv: list[str], env: dict[str, str], user: Any | None) -> tuple[list[str], Any]:
    command = [LNK, *argv]
    if user is not None:
        command = as_user(user.pw_uid, user.pw_gid, *command)
    ran = subprocess.run(
        command,
        env={**env, "HOME": user.pw_dir if user else "/root"},
        cwd=user.pw_dir if user else "/",
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    return argv, ran


def _faults(results: list[tuple[list[str], Any]], who: str) -> list[str]:
    faults = []
    for argv, ran in results:
        out = ran.stdout + ran.stderr
        shown = " ".join(repr(w) if len(w) < 40 else repr(w[:20] + "…") for w in argv)
        tail = (out.decode(errors="replace").strip().splitlines() or [""])[-1][:200]
        if b"Traceback" in out:
            faults.append(f"{who}: lnk {shown}: traceback ({tail})")
        elif b"did not expect" in out:  # the CLI's last resort caught a bug of lnk's
            faults.append(f"{who}: lnk {shown}: an unexpected error ({tail})")
        elif ran.returncode not in (RUN_STATUSES if runs_a_program(argv) else STATUSES):
            faults.append(f"{who}: lnk {shown}: exit {ran.returncode}")
        elif b"\x1b" in out or "\u202e".encode() in out or "\u009b".encode() in out:
            faults.append(f"{who}: lnk {shown}: a terminal control came back raw")
    return faults


@pytest.fixture
def box_user(running_box: Any) -> Any:
    return pwd.getpwuid(running_box.owner.uid)


def test_no_command_prints_a_traceback_on_any_input_as_root_or_not_box_up_or_down(
    private_box: Any, box_user: Any
) -> None:
    commands = list(leaves(build_parser()))
    assert len(commands) >= 25, [p for p, _ in commands]  # every group was registered
    faults: list[str] = []
    with private_box() as box, ThreadPoolExecutor(WORKERS) as pool:
        os.chmod(box.run_dir, 0o755)
        for state in ("up", "down"):
            if state == "down":
                assert box.lnk("box", "down").returncode == 0
            for who, user in (("root", None), ("a box user", box_user)):
                jobs = [
                    pool.submit(_run, argv, box.env, user)
                    for path, parser in commands
                    if state == "down" or path not in BOX_CHANGING
                    for argv in _tries(path, parser, quick=state == "down")
                ]
                faults += _faults([job.result() for job in jobs], f"{who}, box {state}")
    assert not faults, "\n".join(faults)
