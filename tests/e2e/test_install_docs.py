"""What scripts/install made for people: `man lnk` and shell completion, generated from the
installed parser, and nothing of the tools that made them left in the prefix sandboxes read."""

from __future__ import annotations

import argparse
import os
import subprocess
from pathlib import Path

import pytest

from lnk_cli.app import build_parser

pytestmark = [pytest.mark.e2e, pytest.mark.needs_root]
PREFIX = Path(os.environ.get("LNK_PREFIX", "/opt/lnk"))
SHARE = PREFIX / "venv" / "share"


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[str]:
    found = []
    for sub in (a for a in parser._actions if isinstance(a, argparse._SubParsersAction)):
        for name, child in sub.choices.items():
            found += [" ".join((*path, name)), *_commands(child, (*path, name))]
    return found


def test_man_lnk_finds_the_installed_page_and_it_names_every_command() -> None:
    env = {"PATH": f"{PREFIX}/venv/bin:/usr/bin:/bin", "MANWIDTH": "200", "LANG": "C.UTF-8"}
    where = subprocess.run(
        ["man", "-w", "lnk"], env=env, capture_output=True, text=True, check=False, timeout=30
    )
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).resolve() == (SHARE / "man/man1/lnk.1").resolve()
    page = subprocess.run(
        ["man", "-P", "cat", "lnk"], env=env, capture_output=True, text=True, check=True, timeout=30
    ).stdout
    for command in _commands(build_parser()):
        assert f"lnk {command}" in page, command
    assert "125" in page and "127" in page


def test_bash_completion_completes_every_command_and_the_tools_are_gone() -> None:
    script = SHARE / "bash-completion" / "completions" / "lnk"
    assert script.is_file()
    words = subprocess.run(  # what the completion offers after `lnk sandbox `
        [
            "bash",
            "-c",
            f'source "{script}"; COMP_WORDS=(lnk sandbox ""); COMP_CWORD=2; '
            'COMP_LINE="lnk sandbox "; COMP_POINT=${#COMP_LINE}; _shtab_lnk; '
            'printf "%s\\n" "${COMPREPLY[@]}"',
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout.split()
    assert {"run", "list", "check", "enter", "stop"} <= set(words), words
    site = next((PREFIX / "venv" / "lib").glob("python3*/site-packages"))
    assert not list(site.glob("shtab*")) and not list(site.glob("argparse_manpage*"))
