"""`lnk sandbox check` tries the local-route class: this machine's `lo` gets a test prefix (every
address in it is then delivered here), the spec's `[lan]` lists that prefix, and the check asks
the proxy for an address in it. A box's proxy refuses it (the kernel routes it here); a box
whose proxy has `unsafe_skip_route_check` lets it through, and the check says `leaked`.

The prefix is a /24 of 10.78.0.0/16 that no route of any table covers, on `lo` only while the
test runs (removed in a finally): it is reached by nothing but this machine itself.
"""

from __future__ import annotations

import ipaddress
import json
import os
import secrets
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from check_run import run_check, verdicts_of

RunningBox = Any  # tests/e2e/conftest.py
pytestmark = [pytest.mark.needs_root, pytest.mark.e2e]

CHECK_TIMEOUT_S = 60  # as test_check.py's

WITHIN = ipaddress.IPv4Network("10.78.0.0/16")
TRIES = 64  # random /24s tried until one is free


def _routes(*args: str) -> list[dict[str, Any]]:
    out = subprocess.run(
        ["ip", "-j", "route", "show", "table", "all", *args],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    found: list[dict[str, Any]] = json.loads(out or "[]")
    return found


@pytest.fixture
def lo_prefix() -> Iterator[ipaddress.IPv4Network]:
    for _ in range(TRIES):
        subnet = secrets.choice(list(WITHIN.subnets(new_prefix=24)))
        covering = [r for r in _routes("match", str(subnet)) if r.get("dst") != "default"]
        if not covering and not _routes("root", str(subnet)):
            break
    else:
        pytest.fail(f"no free /24 in {WITHIN}")
    address = f"{subnet[1]}/24"
    subprocess.run(["ip", "addr", "add", address, "dev", "lo"], check=True)
    try:
        yield subnet
    finally:
        subprocess.run(["ip", "addr", "del", address, "dev", "lo"], check=False)


def _local_route_verdicts(box: RunningBox, subnet: Any, private: Any) -> dict[str, str]:
    spec = box.owner.home / "check-local-route.toml"
    spec.write_text(f'[lan]\nhosts = ["{subnet}"]\n')
    os.chown(spec, box.owner.uid, box.owner.gid)
    try:
        _, doc, stderr = run_check(box, f"--spec={spec}", private=private, timeout=CHECK_TIMEOUT_S)
    finally:
        spec.unlink(missing_ok=True)
    found = {k: v for k, v in verdicts_of(doc).items() if k.startswith("proxy:local-route:")}
    assert any(k.startswith(f"proxy:local-route:{subnet[2]}:") for k in found), (found, stderr)
    return found


def test_check_reports_the_local_route_class_refused_and_leaked_when_reopened(
    running_box: RunningBox, private_box: Any, lo_prefix: ipaddress.IPv4Network
) -> None:
    with private_box() as box:
        verdicts = _local_route_verdicts(running_box, lo_prefix, box)
    assert set(verdicts.values()) == {"refused"}, verdicts
    with private_box(proxy_config="unsafe_skip_route_check = true") as box:
        verdicts = _local_route_verdicts(running_box, lo_prefix, box)
    mine = {k: v for k, v in verdicts.items() if k.startswith(f"proxy:local-route:{lo_prefix[2]}:")}
    assert set(mine.values()) == {"leaked"}, verdicts
