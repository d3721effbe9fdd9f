"""lnk_controller.limits: a launch may ask for less than the box allows, never more; an owner's
count and sum of memory are refused at their limit, naming it; what the client is told."""

from __future__ import annotations

import pytest

from lnk_controller.config import ControllerConfig
from lnk_controller.limits import (
    MIB,
    BoxLimits,
    Limits,
    admit,
    mib,
    outcome_message,
    parse_size,
    requested,
    tmpfs_size,
)
from lnk_shared.errors import EXIT_REFUSED, ConfigError, LaunchRefused

BOX = BoxLimits(
    processes=100, memory_mb=512, cpu_percent=50, open_files=256, owner_sandboxes=2,
    owner_memory_mb=1024,
)  # fmt: skip


def test_defaults_are_the_box_limits() -> None:
    assert requested(BOX) == Limits(100, 512 * MIB, 50, 256)


@pytest.mark.parametrize(
    ("asked", "expected"),
    [
        ({"processes": 64}, Limits(64, 512 * MIB, 50, 256)),
        ({"memory_bytes": 256 * MIB}, Limits(100, 256 * MIB, 50, 256)),
        ({"cpu_percent": 10}, Limits(100, 512 * MIB, 10, 256)),
        ({"open_files": 64}, Limits(100, 512 * MIB, 50, 64)),
        ({"processes": 100, "memory_bytes": 512 * MIB}, requested(BOX)),  # exactly the box's
    ],
)
def test_less_is_granted(asked: dict[str, int], expected: Limits) -> None:
    assert requested(BOX, **asked) == expected


@pytest.mark.parametrize(
    ("asked", "named"),
    [
        ({"processes": 101}, "the process limit"),
        ({"memory_bytes": 512 * MIB + 1}, "the memory limit"),
        ({"cpu_percent": 51}, "the CPU limit"),
        ({"open_files": 257}, "the open-file limit"),
        ({"processes": 2}, "the process limit"),  # too few to start
        ({"memory_bytes": MIB}, "the memory limit"),
    ],
)
def test_more_is_refused_naming_the_limit(asked: dict[str, int], named: str) -> None:
    with pytest.raises(LaunchRefused) as caught:
        requested(BOX, **asked)
    assert named in str(caught.value)
    assert caught.value.exit_code == EXIT_REFUSED


def test_owner_count_refused_at_its_limit() -> None:
    wanted = Limits(10, 100 * MIB, 50, 64)
    admit(BOX, [100 * MIB], wanted)  # one running: a second fits
    with pytest.raises(LaunchRefused) as caught:
        admit(BOX, [100 * MIB, 100 * MIB], wanted)
    assert "the owner's sandbox limit" in str(caught.value)
    assert "(2)" in str(caught.value)


def test_owner_memory_refused_over_its_sum() -> None:
    box = BOX.model_copy(update={"owner_sandboxes": 10})
    admit(box, [512 * MIB], Limits(10, 512 * MIB, 50, 64))  # exactly 1 GiB: fits
    with pytest.raises(LaunchRefused) as caught:
        admit(box, [512 * MIB, 256 * MIB], Limits(10, 512 * MIB, 50, 64))
    assert "the owner's memory limit" in str(caught.value)
    assert "1 GiB" in str(caught.value)


@pytest.mark.parametrize(
    ("text", "size"),
    [("512M", 512 * MIB), ("2G", 2048 * MIB), ("512MiB", 512 * MIB), ("64", 64 * MIB),
     ("1024k", MIB), ("4096B", 4096)],
)  # fmt: skip
def test_sizes(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "-1M", "1.5G", "12T", "M", "1 2M"])
def test_bad_sizes_name_the_form(text: str) -> None:
    with pytest.raises(ValueError, match="512M"):
        parse_size(text)


def test_tmpfs_never_larger_than_the_memory() -> None:
    assert tmpfs_size(256 * MIB, Limits(10, 128 * MIB, 1, 64)) == 128 * MIB
    assert tmpfs_size(256 * MIB, Limits(10, 1024 * MIB, 1, 64)) == 256 * MIB


def test_outcome_messages() -> None:
    limits = Limits(64, 512 * MIB, 100, 256)
    assert outcome_message(limits, oom_kills=0, fork_refusals=0) is None
    assert (
        outcome_message(limits, oom_kills=1, fork_refusals=3)
        == "the sandbox reached its memory limit (512 MiB) and was stopped"
    )
    said = outcome_message(limits, oom_kills=0, fork_refusals=3)
    assert said is not None and "process limit (64)" in said
    assert mib(1536 * MIB) == "1.5 GiB"


def test_config_limits_table_and_bad_values(tmp_path: object) -> None:
    cfg = ControllerConfig(limits={"processes": 64, "memory_mb": 256})  # type: ignore[arg-type]
    assert cfg.limits.processes == 64 and cfg.limits.memory_mb == 256
    from lnk_controller.config import load_config

    config_dir = tmp_path / "etc"  # type: ignore[operator]
    config_dir.mkdir()
    (config_dir / "controller.toml").write_text("[limits]\nprocesses = 2\nmemory = 5\n")
    with pytest.raises(ConfigError) as caught:
        load_config({"LNK_CONFIG_DIR": str(config_dir)})
    assert "limits.processes" in str(caught.value)
    assert "limits.memory" in str(caught.value)  # an unknown key is named too
