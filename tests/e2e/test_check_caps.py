"""`lnk sandbox check --caps` tries the shared proxy's per-sandbox caps, on a private box whose
proxy reaches the test internet: tunnels to the listed `www` held open and unread until the
proxy refuses one (its buffer budget here: four small tunnels' worth, so `too-much-buffer`
refuses the fifth), and 500 refused requests whose lines the proxy's log must fold into a few.
Both are `refused`; on a box whose proxy has `unsafe_unbounded_tunnels` and
`unsafe_log_every_refusal` (test-only switches, each logged as a warning) both are `leaked`,
and the outside agrees: the sandbox's wire log holds a line per refusal.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from check_run import run_check
from internet_box import proxy_config
from net import WWW

RunningBox = Any  # tests/e2e/conftest.py
pytestmark = [pytest.mark.needs_root, pytest.mark.e2e]

CHECK_TIMEOUT_S = 60  # as test_check.py's

SMALL_TUNNEL_WORST_CASE = 512 * 1024  # lnk_proxy.tunnel_buffers.SMALL.worst_case()
BUDGET_TUNNELS = 4  # the box's budget: this many small tunnels
IDS = ("proxy:tunnel-caps", "proxy:refusal-flood")
FLOOD_TARGET = "127.0.0.1:9"  # lnk_cli.check.plan_caps.FLOOD_TARGET
FLOOD_REFUSALS = 500  # lnk_cli.check.plan_caps.FLOOD_REFUSALS
# The probe's 300 tunnels fit however the relay serves them: handed to the proxy (one descriptor
# each, the probe's own socket), or, where the kernel cannot name namespaces (Linux < 5.14),
# relayed (a thread and six descriptors each).
LIMITS = "[limits]\nopen_files = 4096\nprocesses = 1024\n"


def _caps_check(running_box: RunningBox, private_box: Any, internet: Any, extra: str) -> Any:
    budget = f"tunnel_buffer_budget_bytes = {BUDGET_TUNNELS * SMALL_TUNNEL_WORST_CASE}"
    with private_box(LIMITS, proxy_config=proxy_config(internet, budget, extra)) as box:
        flags = ("--caps", f"--internet-host={WWW}")
        code, doc, stderr = run_check(running_box, *flags, private=box, timeout=CHECK_TIMEOUT_S)
        wire = box.state_dir / "wire" / f"{doc.get('sandbox')}.log"
        lines = [json.loads(line) for line in wire.read_text().splitlines()]
    found = {p["id"]: p for p in doc["probes"] if p["id"] in IDS}
    assert set(found) == set(IDS), stderr
    flood_lines = [
        line for line in lines if line["decision"] == "refused" and line["target"] == FLOOD_TARGET
    ]
    return code, found, flood_lines, stderr


def test_check_caps_are_refused_and_leaked_when_the_unsafe_switches_reopen_them(
    running_box: RunningBox, private_box: Any, internet: Any
) -> None:
    code, found, flood_lines, stderr = _caps_check(running_box, private_box, internet, "")
    assert {i: p["verdict"] for i, p in found.items()} == dict.fromkeys(IDS, "refused"), stderr
    assert f"refused after {BUDGET_TUNNELS} tunnels" in found["proxy:tunnel-caps"]["observed"]
    assert "too-much-buffer" in found["proxy:tunnel-caps"]["observed"]
    # outside: the flood's 500 refusals are a window's first line and its count, a few times
    assert len(flood_lines) <= 16, len(flood_lines)
    firsts = sum(1 for line in flood_lines if not line.get("repeated"))
    assert firsts + sum(line.get("repeated", 0) for line in flood_lines) == FLOOD_REFUSALS
    unsafe = "unsafe_unbounded_tunnels = true\nunsafe_log_every_refusal = true\n"
    code, found, flood_lines, stderr = _caps_check(running_box, private_box, internet, unsafe)
    assert {i: p["verdict"] for i, p in found.items()} == dict.fromkeys(IDS, "leaked"), stderr
    assert code != 0
    assert len(flood_lines) == FLOOD_REFUSALS  # a line each: the log can be filled
