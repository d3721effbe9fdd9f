"""The plan's probes of processes (plan_processes.py): programs the spec does not grant, and the
other-user probes last, holding the sandbox open."""

from __future__ import annotations

import os
from typing import Any

from lnk_cli.check.plan import ALLOWED, REFUSED

PlanKit = Any  # conftest.PlanKit: a temp home with bait, its grants and its plan


def test_command_star_expects_every_exec_to_run(plan: PlanKit) -> None:
    wanted = plan.expected(plan.probes(plan.grants("--command=*")))
    execs = {i: e for i, e in wanted.items() if i.startswith("exec:")}
    assert execs == dict.fromkeys(
        ("exec:ungranted", "exec:loader", "exec:tmp-copy", "exec:memfd"), ALLOWED
    )


def test_the_ungranted_program_is_one_the_spec_does_not_grant(plan: PlanKit) -> None:
    probes = plan.probes(plan.grants("--command=basename"))
    step = next(p.step for p in probes if p.id == "exec:ungranted")
    assert step is not None
    assert os.path.realpath(step["argv"][0]) != os.path.realpath("/usr/bin/basename")


def test_the_other_user_probes_run_last_and_hold_the_sandbox(plan: PlanKit) -> None:
    probes = plan.probes(plan.grants())
    assert [p.id for p in probes[-2:]] == ["staging.other-users", "cmdline.other-users"]
    assert all(p.step is not None and p.step["kind"] == "hold" for p in probes[-2:])
    assert all(p.expected == REFUSED for p in probes[-2:])
