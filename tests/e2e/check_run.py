"""`lnk sandbox check --json` as the test box's owner, for the e2e check tests (test_check*.py):
run from the owner's home with the owner's environment (as_owner.py's), pointed at a private
box's folders when the check is of that box; the report read back, or the test failed with
what the check said when there is none.

    code, doc, stderr = run_check(running_box, "--caps", private=box, timeout=CHECK_TIMEOUT_S)
    assert verdicts_of(doc)["proxy:unlisted"] == "refused"
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

import pytest
from as_owner import lnk_argv, owner_env

RunningBox = Any  # tests/e2e/conftest.py
PrivateBox = Any  # the same


def run_check(
    box: RunningBox,
    *flags: str,
    private: PrivateBox | None = None,
    timeout: float,
    env: dict[str, str] | None = None,
    on_terminal: bool = False,
) -> tuple[int, dict[str, Any], str]:
    """`lnk sandbox check --json FLAGS`: its status, its report and its stderr. `env` replaces
    `as_owner.owner_env`'s; `on_terminal` gives it a new terminal as stdin (closed at its end)."""
    master = secondary = -1
    if on_terminal:
        master, secondary = os.openpty()
    try:
        result = subprocess.run(
            lnk_argv(box, "sandbox", "check", "--json", *flags),
            env=owner_env(box, private) if env is None else env,
            cwd=str(box.owner.home),
            stdin=secondary if on_terminal else None,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    finally:
        if on_terminal:
            os.close(secondary)
            os.close(master)
    try:
        doc = json.loads(result.stdout)
    except ValueError:
        pytest.fail(f"no JSON report (exit {result.returncode}): {result.stderr}")
    return result.returncode, doc, result.stderr


def verdicts_of(doc: dict[str, Any]) -> dict[str, str]:
    """Each probe's verdict, by its id."""
    return {p["id"]: p["verdict"] for p in doc["probes"]}
