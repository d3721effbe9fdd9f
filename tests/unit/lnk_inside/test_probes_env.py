"""probes_env.py: the caller-env probe's step, inside, reads the probe's own environment (the
bait and the verdict are lnk_cli's: tests/unit/lnk_cli/test_check_caller_env.py)."""

from __future__ import annotations

import pytest

from lnk_inside import probes


def test_the_step_reads_the_probes_own_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LNK_UNIT_BAIT", "bait-value-1")
    result = probes.run_step({"id": "caller-env", "kind": "own_environ"})
    assert result["outcome"] == "through"
    assert "LNK_UNIT_BAIT=bait-value-1" in result["data"]
