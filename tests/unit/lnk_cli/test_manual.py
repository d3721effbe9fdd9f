"""The man page and completions are made from the parser, so they name every command."""

from __future__ import annotations

import stat
from pathlib import Path

from lnk_cli.app import build_parser, leaves
from lnk_cli.manual import OUTPUTS, write_all


def test_the_man_page_and_completions_name_every_command_and_the_statuses(tmp_path: Path) -> None:
    written = write_all(tmp_path)
    assert sorted(written) == sorted(tmp_path / p for p in OUTPUTS.values())
    for path in written:
        assert stat.S_IMODE(path.stat().st_mode) == 0o644
    page = (tmp_path / OUTPUTS["man"]).read_text()
    bash = (tmp_path / OUTPUTS["bash"]).read_text()
    zsh = (tmp_path / OUTPUTS["zsh"]).read_text()
    assert page.startswith(".TH LNK ")
    commands = [path for path, _ in leaves(build_parser())]
    assert len(commands) >= 30
    for *group, name in commands:
        # argparse-manpage names each as `lnk GROUP` in bold and the command in italics.
        assert f"\\fBlnk {' '.join(group)}\\fR \\fI\\,{name}\\/\\fR" in page, (group, name)
        assert f"_lnk_{'_'.join([*group, name]).replace('-', '_')}" in bash, (group, name)
        assert name in zsh
    for status in ("125", "126", "127"):  # the exit statuses of the epilog
        assert status in page
    assert "--json" in bash and "--verbose" in bash
