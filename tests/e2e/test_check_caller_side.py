"""`lnk sandbox check` tries what a sandbox could do on its caller's side and learn of the host
(its terminal, an append-only stdout, a link left in a write folder, /etc/hosts, the boot id,
the machine-id): on a closed spec each is refused; with each `unsafe_…` switch that reopens one,
the check fails naming exactly that class, and the controller's log warns of the switch.

The check runs as the real owner on a real box, its stdin a pty (so the terminal is tried).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from check_run import run_check, verdicts_of

pytestmark = [pytest.mark.needs_root, pytest.mark.e2e]
RunningBox = Any  # tests/e2e/conftest.py
CHECK_TIMEOUT_S = 90
CALLER_SIDE = ("terminal", "stdout:append-only", "host:hosts", "host:boot-id", "host:boot-time")


def _check(box: RunningBox, private: Any | None, *flags: str) -> tuple[int, dict[str, str]]:
    code, doc, _ = run_check(
        box, *flags, private=private, timeout=CHECK_TIMEOUT_S, on_terminal=True
    )
    return code, verdicts_of(doc)


def _out(box: RunningBox) -> Path:
    return Path(box.owner.home) / "project" / "out"


def _links(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if p.is_symlink()]


def test_check_of_a_closed_spec_refuses_every_caller_side_class(running_box: RunningBox) -> None:
    out = _out(running_box)
    code, verdicts = _check(running_box, None, f"--write={out}")
    assert code == 0, verdicts
    for ident in (*CALLER_SIDE, f"link.write:{out}"):
        assert verdicts[ident] == "refused", ident
    ids = [i for i in verdicts if i.startswith("host:machine-id:")]
    assert all(verdicts[i] == "refused" for i in ids)
    assert not _links(out)


SWITCHES = {
    "unsafe_host_identity": lambda out: {"host:hosts", "host:boot-id"},
    "unsafe_host_clock": lambda out: {"host:boot-time"},
    "unsafe_caller_terminal": lambda out: {"terminal"},
    "unsafe_append_stdout": lambda out: {"stdout:append-only"},
    "unsafe_write_symlinks": lambda out: {f"link.write:{out}"},
}


@pytest.mark.parametrize("switch", sorted(SWITCHES))
def test_each_unsafe_switch_makes_check_report_its_class_leaked(
    running_box: RunningBox, private_box: Any, switch: str
) -> None:
    out = _out(running_box)
    with private_box(f"{switch} = true") as box:
        code, verdicts = _check(running_box, box, f"--write={out}")
        log = (box.state_dir / "logs" / "controller.log").read_text()
    leaked = {i for i, v in verdicts.items() if v == "leaked"}
    assert code == 1
    assert leaked == SWITCHES[switch](out)
    assert f"{switch} is on: " in log and "a test setting; never on a real box" in log
    assert not _links(out), "the check left its link behind"
