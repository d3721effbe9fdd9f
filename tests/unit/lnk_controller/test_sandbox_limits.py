"""lnk_controller.sandbox_limits: a host with no cgroup controller for the limits refuses to
launch unless the admin allowed it (then rlimits alone, and a warning each launch); the owner's
ledger refuses the place past the count, even for launches racing each other."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from lnk_controller import cgroup_limits, sandbox_limits
from lnk_controller.limits import MIB, BoxLimits, Limits
from lnk_shared.errors import LaunchRefused

LIMITS = Limits(processes=64, memory_bytes=256 * MIB, cpu_percent=50, open_files=128)


@pytest.fixture
def no_controllers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A v2 group whose parent offers nothing, and no v1 hierarchy: a host with no limits."""
    monkeypatch.setattr(cgroup_limits, "v1_hierarchies", dict)
    group = tmp_path / "lnk.sandboxes" / "sbx1"
    group.mkdir(parents=True)
    (group.parent / "cgroup.controllers").write_text("\n")
    return group


def test_a_host_with_no_controller_refuses(no_controllers: Path) -> None:
    with pytest.raises(LaunchRefused) as caught:
        sandbox_limits.apply(BoxLimits(), "sbx1", no_controllers, LIMITS)
    assert "no cgroup controller" in str(caught.value)
    assert "Delegate=" in str(caught.value)


def test_unsafe_allow_unlimited_runs_on_rlimits_with_a_warning(
    no_controllers: Path, caplog: pytest.LogCaptureFixture
) -> None:
    box = BoxLimits(unsafe_allow_unlimited=True)
    with caplog.at_level(logging.WARNING):
        applied = sandbox_limits.apply(box, "sbx1", no_controllers, LIMITS)
    assert applied.missing == ("pids", "memory", "cpu")
    assert applied.launcher_args() == [
        *("--rlimit", "nproc=64", "--rlimit", "nofile=128"),
        *("--oom-score-adj", "500"),  # lnk_shared.oom_scores: before the services
    ]
    assert "rlimits only" in caplog.text


def test_no_limits_at_all_only_with_the_test_switch(
    no_controllers: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        applied = sandbox_limits.apply(BoxLimits(), "sbx1", no_controllers, None)
    assert applied.launcher_args() == []
    assert "NO limits" in caplog.text


def test_the_ledger_gives_the_last_place_to_one_of_racing_launches() -> None:
    box = BoxLimits(owner_sandboxes=3)
    ledger = sandbox_limits.Ledger()
    start = threading.Barrier(10)
    outcomes: list[str] = []

    def launch() -> None:
        start.wait()
        try:
            ledger.admit(box, 1000, LIMITS)
            outcomes.append("admitted")
        except LaunchRefused:
            outcomes.append("refused")

    threads = [threading.Thread(target=launch) for _ in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["admitted"] * 3 + ["refused"] * 7
    assert ledger.count(1000) == 3
    ledger.admit(box, 1001, LIMITS)  # another owner is not counted with them


def test_a_released_place_is_free_again() -> None:
    box = BoxLimits(owner_sandboxes=1)
    ledger = sandbox_limits.Ledger()
    place = ledger.admit(box, 1000, LIMITS)
    with pytest.raises(LaunchRefused):
        ledger.admit(box, 1000, LIMITS)
    ledger.release(place)
    ledger.admit(box, 1000, LIMITS)


def test_leftover_groups_are_removed_with_the_hierarchies_read_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A crashed controller's v1 groups: each clean-up removes them, and mountinfo is read at
    # the first one only (its read was 0.3-0.5 ms of every clean-up).
    parents = {c: tmp_path / c / "lnk.sandboxes" for c in ("pids", "memory")}
    reads = []

    def hierarchies() -> dict[str, Path]:
        reads.append(1)
        return dict(parents)

    monkeypatch.setattr(cgroup_limits, "v1_hierarchies", hierarchies)
    sandbox_limits._leftover_parents.cache_clear()
    try:
        for sandbox_id in ("sbx-a", "sbx-b"):
            for parent in parents.values():
                (parent / sandbox_id).mkdir(parents=True)
            sandbox_limits.remove_leftovers(sandbox_id)
            assert not any((p / sandbox_id).exists() for p in parents.values())
        sandbox_limits.remove_leftovers("sbx-none")  # none left: fine
        assert len(reads) == 1
    finally:
        sandbox_limits._leftover_parents.cache_clear()
