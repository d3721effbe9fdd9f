"""The plan as a whole: what a spec with no grants makes of every probe, on real bait in a temp
home (conftest.py's `plan`), and that what the sandbox is given never holds a secret. Each
section's probes are tested beside their module (test_check_plan_files.py, _network, _processes)."""

from __future__ import annotations

import json
from typing import Any

from lnk_cli.check.plan import REFUSED

PlanKit = Any  # conftest.PlanKit: a temp home with bait, its grants and its plan


def test_with_no_grants_everything_is_expected_refused_the_loader_too(plan: PlanKit) -> None:
    probes = plan.probes(plan.grants())
    others = {i: e for i, e in plan.expected(probes).items() if e != REFUSED}
    assert others == {}
    assert "exec:loader" in plan.expected(probes)
    ids = set(plan.expected(probes))
    assert {"read.home", "read.settings", "read.var-tmp", "read.hidden:~/.ssh"} <= ids
    assert {"read.hidden:~/.config", "read.agents:Link/Agents", "list.ssh", "confiner"} <= ids
    assert not any(i.startswith("proxy:") for i in ids)  # no proxy in this sandbox


def test_no_secret_is_ever_in_what_the_sandbox_is_given(plan: PlanKit) -> None:
    probes = plan.probes(plan.grants(f"--read={plan.home}"))
    given = json.dumps([p.step for p in probes if p.step is not None])
    for secret in [f.secret for f in plan.bait.files] + [plan.bait.outside_secret]:
        assert secret not in given
    assert all(p.step is None or p.step["id"] == p.id for p in probes)
