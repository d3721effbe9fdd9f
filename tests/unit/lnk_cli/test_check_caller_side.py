"""The check's caller-side probes: the plan for them (pure), the append-only bait, and the
steps they run inside, tried here outside any sandbox on real descriptors."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import termios
from collections.abc import Iterator
from pathlib import Path

import pytest

from lnk_cli.check.caller_side import (
    GENERIC_NAMES,
    AppendBait,
    CallerSide,
    caller_probes,
    gather,
    hosts_names,
)
from lnk_cli.check.plan import LEAKED, REFUSED
from lnk_cli.check.verdicts import Outside, judge_probe
from lnk_inside.probes import boot_time, run_step

HOST = CallerSide(
    ("box1", "box1.example.net"), "b" * 36, "m" * 32, terminal_fd=2, boot_time=1_700_000_000
)


def _ids(caller: CallerSide, folders: list[str]) -> dict[str, bool]:
    """Each probe's id and whether it is tried."""
    probes = caller_probes(caller, folders, "/home/o", "n1")
    assert all(p.expected == REFUSED for p in probes)
    assert all(p.step is None or p.step["id"] == p.id for p in probes)
    return {p.id: p.step is not None for p in probes}


def test_every_class_is_probed_and_refusal_expected() -> None:
    assert _ids(HOST, ["/home/o/out"]) == {
        "terminal": True,
        "stdout:append-only": True,
        "link.write:/home/o/out": True,
        "host:hosts": True,
        "host:boot-id": True,
        "host:boot-time": True,
        "host:machine-id:0": True,
        "host:machine-id:1": True,
    }


def test_without_a_terminal_or_ids_those_are_not_tried_or_left_out() -> None:
    bare = CallerSide((), "", "", terminal_fd=None)
    assert _ids(bare, []) == {"terminal": False, "stdout:append-only": True}


def test_the_link_probe_points_at_authorized_keys_and_is_removed_after() -> None:
    (link,) = [p for p in caller_probes(HOST, ["/w"], "/home/o", "n1") if p.id.startswith("link")]
    assert link.step is not None
    assert link.step["target"] == "/home/o/.ssh/authorized_keys"
    assert link.leftovers == (link.step["path"],)
    assert link.evidence[0].kind == "created"
    assert link.evidence[0].path == link.step["path"]


def test_the_boot_time_step_reads_this_machines_btime_outside_any_sandbox() -> None:
    result = run_step({"id": "b", "kind": "boot_time"})
    assert result["outcome"] == "through"
    assert result["data"] == {"btime": gather().boot_time}
    assert isinstance(result["data"]["btime"], int)


def test_boot_time_is_none_for_a_stat_file_without_btime(tmp_path: Path) -> None:
    (tmp_path / "stat").write_text("cpu  1 2 3\nbtime soon\nctxt 5\n")
    assert boot_time(str(tmp_path / "stat")) is None
    (tmp_path / "stat").write_text("cpu  1 2 3\nbtime 1700000000\n")
    assert boot_time(str(tmp_path / "stat")) == 1_700_000_000


@pytest.mark.parametrize(
    ("seen", "leaked"),
    [
        ({"btime": 1_700_000_000}, True),
        ({"btime": 1_700_000_002}, True),  # a clock step of a second or two is still it
        ({"btime": 1_699_999_998}, True),
        ({"btime": 1_700_000_003}, False),
        ({"btime": 1_700_086_400}, False),  # the sandbox's own clock: born a day later
        ({"btime": None}, False),
        ({"btime": "1700000000"}, False),
        ("1700000000", False),
    ],
)
def test_the_boot_time_is_judged_outside_by_its_value(seen: object, leaked: bool) -> None:
    (probe,) = [p for p in caller_probes(HOST, [], "/h", "n") if p.id == "host:boot-time"]
    untrusted = {"outcome": "through", "detail": "read /proc/stat", "data": seen}
    finding = judge_probe(probe, untrusted, Outside())
    assert finding.verdict == (LEAKED if leaked else REFUSED)


def test_the_hosts_probe_compares_names_not_text() -> None:
    (hosts,) = [p for p in caller_probes(HOST, [], "/h", "n") if p.id == "host:hosts"]
    assert hosts.evidence[0].kind == "names"
    assert set(hosts.evidence[0].names) == {"box1", "box1.example.net"}


@pytest.fixture
def append_bait() -> Iterator[AppendBait]:
    bait = AppendBait()
    try:
        yield bait
    finally:
        bait.remove()
    assert not os.path.exists(bait.path)


def test_truncating_the_append_only_bait_is_seen(append_bait: AppendBait) -> None:
    fd = os.dup(append_bait.fd)
    try:
        assert append_bait.kept()
        os.write(fd, b"stderr line\n")
        assert append_bait.written(100) == b"stderr line\n"
        result = run_step({"id": "a", "kind": "append_only", "fd": fd})
    finally:
        os.close(fd)
    assert result["outcome"] == "through"
    assert not append_bait.kept()


def test_a_pipe_refuses_the_append_only_step() -> None:
    read_end, write_end = os.pipe()
    try:
        result = run_step({"id": "a", "kind": "append_only", "fd": write_end})
    finally:
        os.close(read_end)
        os.close(write_end)
    assert (result["outcome"], result["detail"]) == ("stopped", "EINVAL")


def test_the_symlink_step_makes_the_link_it_is_given(tmp_path: Path) -> None:
    link = tmp_path / "report.txt"
    made = run_step({"id": "s", "kind": "symlink", "target": "/nowhere", "path": str(link)})
    assert made["outcome"] == "through"
    assert os.readlink(link) == "/nowhere"
    again = run_step({"id": "s", "kind": "symlink", "target": "/nowhere", "path": str(link)})
    assert (again["outcome"], again["detail"]) == ("stopped", "EEXIST")


TERMINAL_STEP = (
    "import json; from lnk_inside.probes import run_step; "
    "print(json.dumps(run_step({'id': 't', 'kind': 'terminal'})))"
)


@pytest.mark.parametrize("on_a_terminal", [True, False])
def test_the_terminal_step_finds_a_terminal_only_where_there_is_one(on_a_terminal: bool) -> None:
    master, secondary = os.openpty()
    try:
        before = termios.tcgetattr(secondary)
        ran = subprocess.run(
            [sys.executable, "-c", TERMINAL_STEP],
            stdin=secondary if on_a_terminal else subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        after = termios.tcgetattr(secondary)
    finally:
        os.close(secondary)
        os.close(master)
    outcome = json.loads(ran.stdout)["outcome"]
    assert outcome == ("through" if on_a_terminal else "stopped")
    assert after == before  # it showed it could set them, and changed nothing


def test_the_hosts_step_reports_the_names_of_etc_hosts() -> None:
    result = run_step({"id": "h", "kind": "hosts"})
    assert result["outcome"] == "through"
    assert "localhost" in result["data"]


def test_thehosts_names_read_are_the_files_own_without_comments(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost\n10.0.0.5 box1 box1.lan # a comment names-this\n#x y\n")
    assert hosts_names(str(hosts)) == {"localhost", "box1", "box1.lan"}
    assert hosts_names(str(tmp_path / "none")) == set()


def test_gather_names_this_machine_and_never_a_generic_name() -> None:
    caller = gather()
    assert socket.gethostname() in caller.host_names or socket.gethostname() in GENERIC_NAMES
    assert not set(caller.host_names) & GENERIC_NAMES
