"""The wall, end to end: a program runs in a sandbox as a fresh user, and its status comes back."""

from __future__ import annotations

from typing import Any

RunningBox = Any  # tests/e2e/conftest.py


def test_program_runs_as_fresh_user_and_exit_status_comes_back(running_box: RunningBox) -> None:
    result = running_box.sh("id -u; exit 7")
    assert result.returncode == 7, result.stderr
    uid = int(result.stdout.strip())
    assert uid != running_box.owner.uid and uid >= 100_000


def test_owner_files_in_a_read_grant_are_readable(running_box: RunningBox) -> None:
    project = running_box.owner.home / "project"
    result = running_box.sh(f"cat {project}/readme.txt", f"--read={project}")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "hello project\n"


def test_owner_home_outside_grants_is_not_there(running_box: RunningBox) -> None:
    secret = running_box.owner.home / "secret.txt"
    result = running_box.sh(f"cat {secret}")
    assert result.returncode != 0
    assert running_box.owner.secret not in result.stdout
