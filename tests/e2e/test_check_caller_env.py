"""`lnk sandbox check` tries the caller's environment: a variable of the check's own, named by no
`--env` and also sent among the request's terminal variables as a careless client would, must
not reach the sandbox; and `--env LD_PRELOAD=…` and `--env BASH_ENV=…`, sent past the client's
own judgement, must be refused by the controller. All refused on the closed wall (with `--env`
given too); on a box with controller.toml's `unsafe_caller_env_unfiltered` and
`unsafe_env_names_unjudged` on (one box for both: each is a box start, and the suite's time is
short), check fails naming exactly those probes as leaked. Which switch opens which probe is
tested apart in tests/unit (launch_request, spec, sandbox_env)."""

from __future__ import annotations

from typing import Any

import pytest
from as_owner import owner_env
from check_run import run_check, verdicts_of

RunningBox = Any  # tests/e2e/conftest.py
pytestmark = [pytest.mark.needs_root, pytest.mark.e2e]

CHECK_TIMEOUT_S = 90


def _check(box: RunningBox, private: Any | None = None) -> tuple[int, dict[str, str], str]:
    env = {**owner_env(box, private), "E2E_NAMED": "named-by-env"}
    flags = ("--env", "E2E_NAMED")
    code, doc, stderr = run_check(box, *flags, env=env, timeout=CHECK_TIMEOUT_S)
    return code, verdicts_of(doc), stderr


ENV_PROBES = {"caller-env", "env-name:LD_PRELOAD", "env-name:BASH_ENV"}
SWITCHES = ("unsafe_caller_env_unfiltered", "unsafe_env_names_unjudged")


def test_the_environment_classes_are_refused_then_leaked_with_their_switches(
    running_box: RunningBox, private_box: Any
) -> None:
    status, closed, stderr = _check(running_box)
    assert status == 0, (closed, stderr)
    assert {closed[p] for p in ENV_PROBES} == {"refused"}
    with private_box("\n".join(f"{s} = true" for s in SWITCHES)) as box:
        status, verdicts, _ = _check(running_box, private=box)
        log = (box.state_dir / "logs" / "controller.log").read_text()
    leaked = {i for i, v in verdicts.items() if v == "leaked"}
    assert status == 1
    assert leaked == {i for i, v in closed.items() if v == "leaked"} | ENV_PROBES
    for switch in SWITCHES:
        assert log.count(f"{switch} is on") >= 2  # at start and at a launch
