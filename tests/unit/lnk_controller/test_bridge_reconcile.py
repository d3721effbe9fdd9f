"""Which of the bridge's open sockets are stale: those no live sandbox's record names."""

from __future__ import annotations

import json

import pytest

from lnk_controller.bridge_reconcile import stale_agents
from lnk_controller.cleanup import BRIDGE_RECORD
from lnk_controller.models import SandboxRow


def _row(*targets: str) -> SandboxRow:
    return SandboxRow(id="sbx-1", mounts_json=json.dumps(list(targets)))


@pytest.mark.parametrize(
    ("open_now", "rows", "stale"),
    [
        ([], [], []),
        (["u1-a"], [], ["u1-a"]),  # stopped while the bridge was down: no record has it
        (["u1-a"], [_row(f"{BRIDGE_RECORD}u1-a")], []),  # running (or being started)
        (["u1-a", "u1-b"], [_row("/staged/x", f"{BRIDGE_RECORD}u1-b")], ["u1-a"]),
        (["u1-a"], [_row("/run/lnk/bridge-store/agents/u1-a/bridge.sock")], ["u1-a"]),
        (["u1-ab"], [_row(f"{BRIDGE_RECORD}u1-a")], ["u1-ab"]),  # a prefix is not a name
    ],
)
def test_stale_agents(open_now: list[str], rows: list[SandboxRow], stale: list[str]) -> None:
    assert stale_agents(open_now, rows) == stale
