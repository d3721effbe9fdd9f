"""The launcher's side of the services' logs: the settings read (and refused) from
controller.toml, a keeper started on a pipe and ended with it (or by SIGTERM when a writer
stays), one left from before ended first, and the failed start's last line read across a
rotation."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from lnk_admin import service_logs
from lnk_admin.service_logs import LogSettings, Since
from lnk_shared.errors import ConfigError
from lnk_shared.paths import BoxPaths


@pytest.fixture
def box(tmp_path: Path) -> BoxPaths:
    for name in ("etc", "state", "run"):
        (tmp_path / name).mkdir()
    (tmp_path / "state" / "logs").mkdir()
    return BoxPaths(tmp_path / "etc", tmp_path / "state", tmp_path / "run")


def _env(box: BoxPaths) -> dict[str, str]:
    return {"LNK_CONFIG_DIR": str(box.config_dir)}


def test_the_defaults_bound_each_log(box: BoxPaths) -> None:
    assert service_logs.log_settings(_env(box)) == LogSettings(16 << 20, 4)


def test_the_settings_are_read_from_controller_toml(box: BoxPaths) -> None:
    (box.config_dir / "controller.toml").write_text("log_max_bytes = 1048576\nlog_keep_count = 9\n")
    assert service_logs.log_settings(_env(box)) == LogSettings(1 << 20, 9)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("log_max_bytes = 100\n", "log_max_bytes"),  # below one pipe's read: every line a file
        ("log_keep_count = 0\n", "log_keep_count"),  # a rotation would throw the newest away
        ('log_keep_count = "4"\n', "log_keep_count"),
        ("log_keep = 4\n", "log_keep"),
    ],
)
def test_a_bad_setting_is_refused_and_named(box: BoxPaths, text: str, named: str) -> None:
    (box.config_dir / "controller.toml").write_text(text)
    with pytest.raises(ConfigError, match=named):
        service_logs.log_settings(_env(box))


def test_the_controllers_warnings_are_not_said_by_box_up(
    box: BoxPaths, capfd: pytest.CaptureFixture[str]
) -> None:
    (box.config_dir / "controller.toml").write_text("unsafe_writable_dev = true\n")
    service_logs.log_settings(_env(box))
    assert "unsafe_writable_dev" not in capfd.readouterr().err


def _gone(pid: int) -> bool:
    """Ended (a zombie's command line is empty)."""
    try:
        return not Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return True


def test_a_keeper_writes_the_pipe_and_ends_with_it(box: BoxPaths) -> None:
    log = box.state_dir / "logs" / "proxy.log"
    out = service_logs.start_keeper(box, "proxy", log, LogSettings(1 << 20, 2))
    pid = service_logs.keeper_pid(box, "proxy", log)
    assert pid is not None
    os.write(out, b"lnk_proxy ready\n")
    os.close(out)
    service_logs.end_keeper(box, "proxy", log)
    assert log.read_bytes() == b"lnk_proxy ready\n"
    assert service_logs.keeper_pid(box, "proxy", log) is None
    assert not (box.run_dir / "proxy.log.pid").exists()
    assert _gone(pid)


def test_a_keeper_whose_pipe_a_writer_still_holds_is_ended_by_sigterm(box: BoxPaths) -> None:
    log = box.state_dir / "logs" / "controller.log"
    out = service_logs.start_keeper(box, "controller", log, LogSettings(1 << 20, 2))
    try:
        os.write(out, b"still held\n")
        t0 = time.monotonic()
        service_logs.end_keeper(box, "controller", log, wait_s=0.2)
        took = time.monotonic() - t0
    finally:
        os.close(out)
    assert took < service_logs.KEEPER_DRAIN_S + 1
    assert log.read_bytes() == b"still held\n"
    assert service_logs.keeper_pid(box, "controller", log) is None


def test_a_keeper_left_from_before_is_ended_before_another_starts(box: BoxPaths) -> None:
    """One file, one writer: two keepers would each rotate it under the other."""
    log = box.state_dir / "logs" / "proxy.log"
    first = service_logs.start_keeper(box, "proxy", log, LogSettings(1 << 20, 2))
    old = service_logs.keeper_pid(box, "proxy", log)
    second = service_logs.start_keeper(box, "proxy", log, LogSettings(1 << 20, 2))
    try:
        assert old is not None
        assert _gone(old)
        assert service_logs.keeper_pid(box, "proxy", log) not in (None, old)
    finally:
        os.close(first)
        os.close(second)
        service_logs.end_keeper(box, "proxy", log)


def test_the_tail_reads_from_where_the_start_found_the_log(tmp_path: Path) -> None:
    log = tmp_path / "controller.log"
    log.write_text("an old run's last word\n")
    start = service_logs.since(log)
    with open(log, "a") as f:
        f.write("migrating\ncontroller.db is damaged: restore it\n")
    assert service_logs.tail(log, start, 1) == "controller.db is damaged: restore it"
    assert "old run" not in service_logs.tail(log, start, 5)


def test_the_tail_after_a_rotation_reads_the_new_file(tmp_path: Path) -> None:
    log = tmp_path / "controller.log"
    log.write_text("x" * 500 + "\n")
    start = service_logs.since(log)
    log.rename(tmp_path / "controller.log.1")
    log.write_text("why it failed\n")
    assert service_logs.tail(log, start, 1) == "why it failed"
    assert service_logs.tail(log, Since(start.inode if start else 0, 0), 1) == "why it failed"


def test_no_log_yet_reads_from_its_start(tmp_path: Path) -> None:
    log = tmp_path / "bridge-store.log"
    assert service_logs.since(log) is None
    log.write_text("one\ntwo\n")
    assert service_logs.tail(log, None, 1) == "two"
