"""`lnk sandbox check` is honest about issue 14's classes 3, 4 and 5: on a closed box it reports
each of them refused; with the test-only controller switch that reopens one, it reports that
one `leaked`, naming it, and exits 1.

Each switch (of lnk_controller.config.UNSAFE_SWITCHES) is set on a private box of its own;
the owner is the session's, with a write folder and an existing ~/bin (Debian's ~/.profile puts
it first on PATH at the next login; the caller's PATH here lacks it).
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from check_run import run_check, verdicts_of

RunningBox = Any  # tests/e2e/conftest.py
pytestmark = [pytest.mark.needs_root, pytest.mark.e2e]

CHECK_TIMEOUT_S = 120  # one check plus the login-PATH launches, on a loaded 2-core machine


def _ids(folder: Path, bin_dir: Path) -> dict[str, str]:
    """Each switch and the probe id (or id prefix) check must then report leaked."""
    return {
        "unsafe_staging_open_to_all": "staging.other-users",
        "unsafe_command_line_visible": "cmdline.other-users",
        "unsafe_placeholders_visible": f"placeholder.git:{folder}",
        "unsafe_protected_names_unguarded": f"write.dot:{folder}/",
        "unsafe_login_path_unjudged": f"login-path:{bin_dir}",
        "unsafe_path_links_unjudged": "path-link:shared-folder",
    }


@pytest.fixture
def setup(running_box: RunningBox) -> Iterator[tuple[Path, Path]]:
    owner = running_box.owner
    folder = owner.home / f"unsafe-{secrets.token_hex(4)}"
    folder.mkdir()
    bin_dir = owner.home / "bin"
    made_bin = not bin_dir.exists()
    bin_dir.mkdir(exist_ok=True)
    for path in (folder, bin_dir):
        subprocess.run(["chown", f"{owner.uid}:{owner.gid}", str(path)], check=True)
    try:
        yield folder, bin_dir
    finally:
        subprocess.run(["chattr", "-R", "-i", str(folder)], capture_output=True, check=False)
        shutil.rmtree(folder, ignore_errors=True)
        if made_bin:
            shutil.rmtree(bin_dir, ignore_errors=True)


def _check(box: RunningBox, private: Any, folder: Path) -> tuple[int, dict[str, str], str]:
    code, doc, stderr = run_check(
        box, f"--write={folder}", private=private, timeout=CHECK_TIMEOUT_S
    )
    return code, verdicts_of(doc), stderr


def _leaked(verdicts: dict[str, str]) -> list[str]:
    return sorted(i for i, v in verdicts.items() if v == "leaked")


def test_check_on_a_closed_box_reports_each_class_refused(
    running_box: RunningBox, private_box: Any, setup: tuple[Path, Path]
) -> None:
    folder, bin_dir = setup
    with private_box() as box:
        code, verdicts, stderr = _check(running_box, box, folder)
    assert code == 0, (stderr, _leaked(verdicts))
    for wanted in _ids(folder, bin_dir).values():
        tried = [i for i in verdicts if i.startswith(wanted)]
        assert tried, f"{wanted} was not tried"
        assert {verdicts[i] for i in tried} == {"refused"}, tried
    assert sorted(p.name for p in folder.iterdir()) == []


@pytest.mark.parametrize(
    "switch",
    [
        "unsafe_staging_open_to_all",
        "unsafe_command_line_visible",
        "unsafe_placeholders_visible",
        "unsafe_protected_names_unguarded",
        "unsafe_login_path_unjudged",
        "unsafe_path_links_unjudged",
    ],
)
def test_check_reports_the_class_a_switch_reopens(
    running_box: RunningBox, private_box: Any, setup: tuple[Path, Path], switch: str
) -> None:
    folder, bin_dir = setup
    with private_box(f"{switch} = true") as box:
        code, verdicts, stderr = _check(running_box, box, folder)
        log = (box.state_dir / "logs" / "controller.log").read_text()
    wanted = _ids(folder, bin_dir)[switch]
    leaked = _leaked(verdicts)
    assert code == 1, stderr
    assert any(i.startswith(wanted) for i in leaked), (wanted, leaked)
    others = {i for s, i in _ids(folder, bin_dir).items() if s != switch}
    assert not [i for i in leaked if any(i.startswith(o) for o in others)], leaked
    assert f"{switch} is on" in log
