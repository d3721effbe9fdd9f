"""`lnk sandbox run` starts a sandbox: every module it imports is time spent before the sandbox
exists, so the modules it must not need are checked here (without timing anything)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from lnk_cli import app

# Heavy modules a launch does not need: each costs milliseconds at every `lnk sandbox run`.
NOT_FOR_A_LAUNCH = (
    "typing",
    "dataclasses",
    "pathlib",
    "subprocess",
    "lnk_admin.box_commands",
    "lnk_cli.spec_commands",
    "lnk_shared.spec",
    "http.client",
)

_IMPORTS_OF_A_LAUNCH = """
import sys
from lnk_cli import app
parser = app.build_parser("sandbox")
args = parser.parse_args(["sandbox", "run", "--read", "/tmp", "--", "/bin/true"])
import lnk_cli.launch_client
print(" ".join(sorted(sys.modules)))
"""


def test_a_launch_imports_none_of_the_heavy_modules() -> None:
    out = subprocess.run(
        [sys.executable, "-S", "-c", _IMPORTS_OF_A_LAUNCH],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": ":".join(sys.path)},
    ).stdout.split()
    assert "lnk_cli.launch_client" in out  # the probe ran what a launch runs
    assert [m for m in NOT_FOR_A_LAUNCH if m in out] == []


@pytest.mark.parametrize("group", sorted(app.GROUPS))
def test_each_group_alone_parses_its_commands(group: str) -> None:
    parser = app.build_parser(group)
    with pytest.raises(SystemExit) as ended:
        parser.parse_args([group, "--help"])
    assert ended.value.code == 0


def test_the_full_parser_knows_every_group_for_help_and_errors(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert app.run(["nosuch"]) == 2
    err = capsys.readouterr().err
    assert all(f"'{group}'" in err for group in app.GROUPS)
