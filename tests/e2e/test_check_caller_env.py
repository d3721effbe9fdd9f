"""`lnk sandbox check` tries the caller's environment: a variable of the check's own, named by no
`--env` and also sent among the request's terminal variables as a careless client would, must
not reach the sandbox (refused on the closed wall, with `--env` given too); with controller.toml's
`unsafe_caller_env_unfiltered` on, check fails naming exactly that probe as leaked."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import install_prefix
import pytest
from as_user import as_user

RunningBox = Any  # tests/e2e/conftest.py
pytestmark = [pytest.mark.needs_root, pytest.mark.e2e]

CHECK_TIMEOUT_S = 90


def _check(box: RunningBox, private: Any | None = None) -> tuple[int, dict[str, str], str]:
    env = {**box.owner_env(), "E2E_NAMED": "named-by-env"}
    if private is not None:
        env.update({k: v for k, v in private.env.items() if k.startswith("LNK_")})
    argv = [str(install_prefix.LNK), "sandbox", "check", "--json", "--env", "E2E_NAMED"]
    result = subprocess.run(
        as_user(box.owner.uid, box.owner.gid, *argv),
        env=env,
        cwd=str(box.owner.home),
        capture_output=True,
        text=True,
        timeout=CHECK_TIMEOUT_S,
        check=False,
    )
    try:
        doc = json.loads(result.stdout)
    except ValueError:
        pytest.fail(f"no JSON report (exit {result.returncode}): {result.stderr}")
    return result.returncode, {p["id"]: p["verdict"] for p in doc["probes"]}, result.stderr


def test_the_callers_environment_is_refused_then_leaked_with_the_switch(
    running_box: RunningBox, private_box: Any
) -> None:
    status, closed, stderr = _check(running_box)
    assert status == 0, (closed, stderr)
    assert closed["caller-env"] == "refused"
    with private_box("unsafe_caller_env_unfiltered = true") as box:
        status, verdicts, _ = _check(running_box, private=box)
        log = (box.state_dir / "logs" / "controller.log").read_text()
    leaked = {i for i, v in verdicts.items() if v == "leaked"}
    assert status == 1
    assert leaked == {i for i, v in closed.items() if v == "leaked"} | {"caller-env"}
    assert log.count("unsafe_caller_env_unfiltered is on") >= 2  # at start and at the launch
