"""Which kernel features a box goes without, said at `lnk box up`: time namespaces by the
presence of their /proc link."""

from __future__ import annotations

from pathlib import Path

from lnk_shared.kernel_features import TIME_NS_PROBE, missing_features, time_namespaces


def test_this_kernel_has_time_namespaces_and_nothing_is_said() -> None:
    assert Path(TIME_NS_PROBE).exists()  # 6.x here, built with CONFIG_TIME_NS
    assert time_namespaces()
    assert missing_features() == []


def test_a_kernel_without_them_names_the_option_and_the_feature_off(tmp_path: Path) -> None:
    probe = str(tmp_path / "time")  # missing, as on a kernel built without CONFIG_TIME_NS
    assert not time_namespaces(probe)
    [line] = missing_features(probe)
    assert "CONFIG_TIME_NS" in line and probe in line
    assert "--own-clock" in line and "off" in line


def test_a_link_is_present_whatever_it_points_at(tmp_path: Path) -> None:
    probe = tmp_path / "time"
    probe.symlink_to("time:[4026531834]")  # what /proc/self/ns/time reads as: a dangling name
    assert time_namespaces(str(probe))
