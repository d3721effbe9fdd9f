"""What a probe is (probe.py): the context the plan's sections add to gives each step its probe's
id, judges what the sandbox sees by the real path (a link out of a grant is not inside it, and
what the grants hide stays hidden), and a grant expects `allowed`, its absence `refused`."""

from __future__ import annotations

import os
from typing import Any

from lnk_cli.check.bait import PREFIX
from lnk_cli.check.probe import ALLOWED, REFUSED, PlanContext, Probe, expect

PlanKit = Any  # conftest.PlanKit: a temp home with bait, its grants and its plan


def test_a_step_carries_its_probes_id_and_a_probe_not_tried_has_none(plan: PlanKit) -> None:
    c = PlanContext(plan.grants(), plan.bait, "n0nce")
    c.add(Probe("one", "tried", REFUSED, {"kind": "list", "path": "/"}))
    c.add(Probe("two", "not tried", ALLOWED, None, not_tried="why"))
    assert [p.step for p in c.probes] == [{"id": "one", "kind": "list", "path": "/"}, None]
    assert c.probes[1].not_tried == "why"


def test_visible_is_judged_by_the_real_path_and_hidden_inside_a_grant_stays_hidden(
    plan: PlanKit,
) -> None:
    c = PlanContext(plan.grants(), plan.bait, "n0nce")
    c.readable = [str(plan.home)]
    c.hidden = [str(plan.home / ".ssh")]
    os.symlink("/etc", plan.home / "out-link")
    assert c.visible(str(plan.home / ".config"))
    assert not c.visible(str(plan.home / ".ssh" / "id_ed25519"))
    assert not c.visible(str(plan.home / "out-link" / "passwd"))  # the link leads out
    assert not c.visible("/etc/passwd")


def test_a_grant_expects_allowed_and_no_grant_refused() -> None:
    assert (expect(True), expect(False)) == (ALLOWED, REFUSED)


def test_the_names_it_makes_are_the_baits_prefix_the_nonce_and_fresh(plan: PlanKit) -> None:
    c = PlanContext(plan.grants(), plan.bait, "n0nce")
    first, second = c.name(), c.name()
    assert first.startswith(f"{PREFIX}n0nce-") and second.startswith(f"{PREFIX}n0nce-")
    assert first != second
