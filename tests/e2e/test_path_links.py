"""A tool installed the usual way, as a non-root box user: `~/.local/bin/tool ->
~/.local/share/tool/1.2/tool` (the user's own link, as pipx, Claude Code's installer, nvm and
cargo make), granted as `--command tool`. The seed: a name is resolved to its real program at
discovery, through the user's own links, and granted by that real path; an explicit path keeps
the refusal of links not owned by root.

Attacks: the link moved to another version, or swapped for another program, after the approval
(each asks again, and nothing runs without it); the same program behind another spelling of the
link (no question); a link of another user in the chain (refused); the link named explicitly
(refused, with the hint to name the program without a path)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from as_user import as_user

pytestmark = [pytest.mark.e2e, pytest.mark.needs_root]

LNK = Path(os.environ.get("LNK_PREFIX", "/opt/lnk")) / "venv" / "bin" / "lnk"
OTHER_UID = 54321  # no user of this machine: a link of "someone else"


@dataclass
class Tool:
    box: Any
    home: Path
    spec: Path

    @property
    def link(self) -> Path:
        return self.home / ".local/bin/tool"

    def version(self, name: str) -> Path:
        return self.home / ".local/share/tool" / name / "tool"

    def point(self, target: str, *, owner: int | None = None) -> None:
        """Replace the link (as a package manager's update does: a new link renamed over)."""
        fresh = self.link.with_name(".tool.new")
        fresh.symlink_to(target)
        uid = self.box.owner.uid if owner is None else owner
        os.lchown(fresh, uid, self.box.owner.gid)
        fresh.rename(self.link)

    def lnk(self, *args: str) -> subprocess.CompletedProcess[str]:
        """`lnk ARGS` as the owner, whose PATH has ~/.local/bin first, as a login shell's."""
        owner = self.box.owner
        env = {**self.box.owner_env(), "PATH": f"{self.link.parent}:/usr/local/bin:/usr/bin:/bin"}
        return subprocess.run(
            as_user(owner.uid, owner.gid, str(LNK), *args),
            env=env,
            cwd=str(self.home),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def run(self, *flags: str) -> subprocess.CompletedProcess[str]:
        return self.lnk("sandbox", "run", *flags, "--spec", str(self.spec), "--", "tool")


@pytest.fixture(scope="module")
def tool(running_box: Any) -> Iterator[Tool]:
    owner = running_box.owner
    home = owner.home
    made = [home / ".local", home / "path-links"]
    for version, says in (("1.2", "tool 1.2"), ("1.3", "tool 1.3"), ("other", "another program")):
        program = home / ".local/share/tool" / version / "tool"
        program.parent.mkdir(parents=True)
        program.write_text(f"#!/bin/sh\necho '{says}'\n")
        program.chmod(0o755)
    (home / ".local/bin").mkdir()
    spec = home / "path-links" / "tool.toml"
    spec.parent.mkdir()
    spec.write_text('[commands]\nallow = ["tool"]\n')
    subprocess.run(["chown", "-R", f"{owner.uid}:{owner.gid}", *map(str, made)], check=True)
    found = Tool(running_box, home, spec)
    found.point("../share/tool/1.2/tool")
    try:
        yield found
    finally:
        running_box.as_owner("spec", "forget", str(spec))
        subprocess.run(["rm", "-rf", *map(str, made)], check=False)


def test_spec_show_grants_the_real_program_and_shows_the_link_chain(tool: Tool) -> None:
    shown = tool.lnk("spec", "show", "--spec", str(tool.spec))
    assert shown.returncode == 0, shown.stderr
    assert f"tool  ->  {tool.version('1.2')}" in shown.stdout
    assert f"found on PATH as {tool.link}" in shown.stdout
    assert f"(link {tool.link} -> ../share/tool/1.2/tool, owner uid {tool.box.owner.uid})" in (
        shown.stdout
    )


def test_a_name_found_through_the_users_own_link_runs_and_updates_ask_again(tool: Tool) -> None:
    first = tool.run("--yes")
    assert first.returncode == 0, first.stderr
    assert first.stdout == "tool 1.2\n"
    again = tool.run()  # approved: no question, no --yes needed
    assert (again.returncode, again.stdout) == (0, "tool 1.2\n"), again.stderr

    # The same program behind another spelling of the link: the real program did not change.
    tool.point(str(tool.version("1.2")))
    same = tool.run()
    assert (same.returncode, same.stdout) == (0, "tool 1.2\n"), same.stderr

    # An update moves the link to 1.3: another real program, so it asks (no terminal: refused).
    tool.point("../share/tool/1.3/tool")
    moved = tool.run()
    assert moved.returncode != 0 and moved.stdout == "", moved.stdout
    assert "opens something else" in moved.stderr, moved.stderr
    assert f"+ run {' ' * 12}{tool.version('1.3')}" in moved.stderr, moved.stderr
    updated = tool.run("--yes")
    assert (updated.returncode, updated.stdout) == (0, "tool 1.3\n"), updated.stderr

    # Swapped for another program: asks again, and nothing of it runs meanwhile.
    tool.point("../share/tool/other/tool")
    swapped = tool.run()
    assert swapped.returncode != 0 and swapped.stdout == "", swapped.stdout
    assert str(tool.version("other")) in swapped.stderr, swapped.stderr
    tool.point("../share/tool/1.2/tool")


def test_a_link_of_another_user_in_the_chain_is_refused(tool: Tool) -> None:
    tool.point("../share/tool/1.2/tool", owner=OTHER_UID)
    try:
        refused = tool.run("--yes")
    finally:
        tool.point("../share/tool/1.2/tool")
    assert refused.returncode == 126, refused.stderr  # a run refused (README)
    assert "[link-owner]" in refused.stderr
    assert f"owned by uid {OTHER_UID}, neither root nor you" in refused.stderr
    assert refused.stdout == ""


def test_the_link_named_explicitly_stays_refused_with_the_hint(tool: Tool) -> None:
    refused = tool.lnk("sandbox", "run", "--yes", "--command", str(tool.link), "--", str(tool.link))
    assert refused.returncode == 126, refused.stderr  # a run refused (README)
    assert "[link-owner]" in refused.stderr and "not root" in refused.stderr
    assert "name the program without a path ('tool')" in refused.stderr, refused.stderr
    assert refused.stdout == ""
