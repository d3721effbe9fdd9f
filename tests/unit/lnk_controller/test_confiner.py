"""The confiner checks again inside: if a ruleset cannot be built or applied it exits 126 and
the target never runs; with a policy it can apply, the target runs confined."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lnk_controller.spawn import encode_policy

pytestmark = pytest.mark.needs_root

SRC = Path(__file__).resolve().parents[3]
PYTHONPATH = os.pathsep.join(str(SRC / d) for d in ("shared", "services/controller"))


def _run(
    tmp_path: Path, policy: dict[str, object], *target: str
) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "policy"
    path.write_text(policy["raw"] if "raw" in policy else encode_policy(policy))  # type: ignore[arg-type]
    return subprocess.run(
        [sys.executable, "-m", "lnk_controller.confiner", "--policy", str(path), "--", *target],
        env={"PYTHONPATH": PYTHONPATH, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def _policy(tmp_path: Path, **changes: object) -> dict[str, object]:
    marker_dir = str(tmp_path)
    policy: dict[str, object] = {
        "read": ["/usr", "/etc", "/proc", "/dev"],
        "write": [marker_dir],
        "execute": ["/usr/bin/touch", os.path.realpath("/lib64/ld-linux-x86-64.so.2")],
        "tcp_connect": None,
        "tcp_bind": None,
        "scope_abstract_unix": True,
        "scope_signal": True,
        "block_unix_sockets": True,
        "min_abi": 6,
        "unsafe_pretend_abi": None,
    }
    policy.update(changes)
    return policy


def test_an_older_landlock_abi_stops_the_target_before_it_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    result = _run(tmp_path, _policy(tmp_path, unsafe_pretend_abi=5), "/usr/bin/touch", str(marker))
    assert result.returncode == 126
    assert "Landlock" in result.stderr and "not running /usr/bin/touch" in result.stderr
    assert not marker.exists()


def test_a_ruleset_that_cannot_be_built_stops_the_target(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    policy = _policy(tmp_path, read=["/usr", "/nonexistent-lnk-grant"])
    result = _run(tmp_path, policy, "/usr/bin/touch", str(marker))
    assert result.returncode == 126
    assert "/nonexistent-lnk-grant" in result.stderr
    assert not marker.exists()


def test_a_malformed_policy_stops_the_target(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    raw = "lnk-confiner-policy 1\nread\t/usr\nexecute /usr/bin/touch\n"
    result = _run(tmp_path, {"raw": raw}, "/usr/bin/touch", str(marker))
    assert result.returncode == 126
    assert not marker.exists()


def test_an_applicable_policy_runs_the_target_confined(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    result = _run(tmp_path, _policy(tmp_path), "/usr/bin/touch", str(marker))
    assert result.returncode == 0, result.stderr
    assert marker.exists()


def test_a_program_outside_execute_is_refused_after_confinement(tmp_path: Path) -> None:
    result = _run(tmp_path, _policy(tmp_path), "/usr/bin/id")
    assert result.returncode == 126
    assert "cannot run /usr/bin/id" in result.stderr
