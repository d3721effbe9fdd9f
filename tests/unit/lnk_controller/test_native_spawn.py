"""lnk-spawn, the launcher the controller runs as root (native/lnk_spawn.c), on the real kernel:
its child is born in the sandbox's cgroup as pid 1 of a new pid namespace with memfd_noexec=2,
runs as the given uid and gid with no groups, no capabilities and no new privileges, and dies
with lnk-spawn; lnk-spawn exits as its child did. Bad input refuses (126) before anything runs.

Each test has a cgroup of its own under the cgroup v2 root (removed with whatever is in it, even
on failure) and runs as an unused uid: no user entry is needed for setresuid.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lnk_controller import cgroups

pytestmark = pytest.mark.needs_root

UID = 2_000_900_123  # far above every sandbox range the tests use; no passwd entry
GID = 2_000_900_124
PYTHON = sys.executable
TIMEOUT_S = 10.0

# What the child sees, as JSON on stdout; then it tries memfd_create + fexecve (must fail).
PROBE = r"""
import json, os, sys
status = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines() if ":" in l)
fds = {}
for fd in os.listdir("/proc/self/fd"):
    try:
        fds[fd] = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        pass
os.write(int(sys.argv[1]), b"inherited fd works")
memfd = os.memfd_create("probe")
with open("/bin/true", "rb") as f:
    os.write(memfd, f.read())
report = {
    "cgroup": open("/proc/self/cgroup").read(),
    "pid": os.getpid(),
    "pidns": os.readlink("/proc/self/ns/pid"),
    "memfd_noexec": open("/proc/sys/vm/memfd_noexec").read().strip(),
    "resuid": list(os.getresuid()),
    "resgid": list(os.getresgid()),
    "groups": os.getgroups(),
    "status": {k: v.strip() for k, v in status.items()},
    "fds": fds,
    "environ": open("/proc/self/environ").read(),  # as exec gave it (Python adds LC_CTYPE)
}
print(json.dumps(report), flush=True)
try:
    os.execv(f"/proc/self/fd/{memfd}", ["true"])
except OSError as exc:
    print(f"fexecve refused: {exc.errno}", flush=True)
"""


@pytest.fixture
def group() -> Iterator[Path]:
    sandbox_id = f"sbx-spawn-test-{secrets.token_hex(4)}"
    yield cgroups.create(sandbox_id)
    cgroups.remove(sandbox_id)  # kills whatever the test left in it


def _argv(spawner: Path, group: Path, *, ctty: bool = False) -> list[str]:
    extra = ["--ctty"] if ctty else []
    parent = ["--parent", str(os.getpid())]
    return [
        str(spawner),
        *parent,
        "--cgroup",
        str(group),
        "--uid",
        str(UID),
        "--gid",
        str(GID),
        *extra,
    ]


def _members(group: Path) -> list[int]:
    return [int(p) for p in (group / "cgroup.procs").read_text().split()]


def _wait_empty(group: Path) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while "populated 1" in (group / "cgroup.events").read_text():
        assert time.monotonic() < deadline, f"{group} still has {_members(group)}"
        time.sleep(0.01)


def _spawn(spawner: Path, group: Path, *program: str, **kwargs: Any) -> subprocess.Popen[str]:
    argv = [*_argv(spawner, group), "--", *program]
    return subprocess.Popen(argv, text=True, env={}, **kwargs)


def test_the_child_is_born_in_the_group_confined_and_dropped(lnk_spawn: Path, group: Path) -> None:
    read_end, write_end = os.pipe()
    passed = str(write_end)
    try:
        with _spawn(
            lnk_spawn,
            group,
            PYTHON,
            "-I",
            "-S",
            "-c",
            PROBE,
            str(write_end),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(write_end,),
        ) as process:
            os.close(write_end)
            write_end = -1
            out, err = process.communicate(timeout=TIMEOUT_S)
            assert process.returncode == 0, err
            assert os.read(read_end, 100) == b"inherited fd works"
    finally:
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)
    report_line, refused = out.splitlines()
    report = json.loads(report_line)
    relative = group.relative_to(cgroups.root())
    assert f"0::/{relative}\n" in report["cgroup"]  # the v2 line: in the group
    assert report["pid"] == 1  # init of its own pid namespace
    assert report["pidns"] != os.readlink("/proc/self/ns/pid")
    assert report["status"]["NSpid"].split()[-1] == "1"
    assert report["memfd_noexec"] == "2"
    assert refused == "fexecve refused: 13"  # EACCES: no memfd can be executed
    assert report["resuid"] == [UID] * 3
    assert report["resgid"] == [GID] * 3
    assert report["groups"] == []
    assert report["status"]["NoNewPrivs"] == "1"
    for caps in ("CapInh", "CapPrm", "CapEff", "CapAmb"):
        assert int(report["status"][caps], 16) == 0, caps
    assert report["environ"] == ""
    # Nothing but what it was given (stdio, the passed pipe): in particular not lnk-spawn's
    # descriptor of the cgroup (the probe's own listdir is closed by the time it reads links).
    assert set(report["fds"]) == {"0", "1", "2", passed}
    assert not any("lnk.sandboxes" in target for target in report["fds"].values())


CLOCKS = (
    "import os, time; "
    "print(time.clock_gettime(time.CLOCK_BOOTTIME), time.clock_gettime(time.CLOCK_MONOTONIC), "
    "os.readlink('/proc/self/ns/time'))"
)


@pytest.mark.parametrize("own_clock", [True, False])
def test_own_clock_gives_the_child_boot_and_monotonic_clocks_that_start_at_zero(
    lnk_spawn: Path, group: Path, own_clock: bool
) -> None:
    argv = _argv(lnk_spawn, group) + (["--own-clock"] if own_clock else [])
    host_boot = time.clock_gettime(time.CLOCK_BOOTTIME)
    ran = subprocess.run(
        [*argv, "--", PYTHON, "-I", "-S", "-c", CLOCKS],
        env={},
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    boot, monotonic, namespace = ran.stdout.split()
    assert host_boot > 2.0, "this machine booted too recently to tell the clocks apart"
    if own_clock:
        assert float(boot) < 2.0 and float(monotonic) < 2.0, ran.stdout
        assert namespace != os.readlink("/proc/self/ns/time")
    else:
        assert float(boot) >= host_boot
        assert namespace == os.readlink("/proc/self/ns/time")


LOWER_OOM_SCORE = r"""
import errno
with open("/proc/self/oom_score_adj") as f:
    print(f.read().strip())
try:
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write("499")  # one step down: any lowering at all
    print("lowered")
except OSError as exc:
    print(errno.errorcode[exc.errno])
"""


def test_the_oom_score_adjustment_is_the_childs_floor(lnk_spawn: Path, group: Path) -> None:
    """Set as root before the drop: where root holds CAP_SYS_RESOURCE the kernel makes it the
    child's floor, so the sandbox, as its own user, cannot make itself look smaller to the
    host's OOM killer. A root without it (a container's, as on this test machine) sets the
    value but no floor: then Landlock (no write under /proc) is what holds it, e2e
    test_limits."""
    argv = [*_argv(lnk_spawn, group), "--oom-score-adj", "500", "--"]
    result = subprocess.run(
        [*argv, PYTHON, "-I", "-S", "-c", LOWER_OOM_SCORE],
        capture_output=True,
        text=True,
        env={},
        timeout=TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    floor = _has_cap_sys_resource()
    assert result.stdout.split() == ["500", "EACCES" if floor else "lowered"]


def _has_cap_sys_resource() -> bool:
    with open("/proc/self/status", encoding="ascii") as f:
        effective = next(line for line in f if line.startswith("CapEff:")).split()[1]
    return bool(int(effective, 16) >> 24 & 1)  # CAP_SYS_RESOURCE


def test_the_exit_code_comes_back(lnk_spawn: Path, group: Path) -> None:
    result = subprocess.run(
        [*_argv(lnk_spawn, group), "--", "/bin/sh", "-c", "exit 7"],
        env={},
        timeout=TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 7


def test_a_child_killed_by_a_signal_kills_lnk_spawn_with_it(lnk_spawn: Path, group: Path) -> None:
    with _spawn(
        lnk_spawn, group, "/bin/sh", "-c", "echo up; exec sleep 60", stdout=subprocess.PIPE
    ) as process:
        try:
            assert process.stdout is not None
            assert process.stdout.readline() == "up\n"
            [child] = _members(group)
            os.kill(child, signal.SIGKILL)
            assert process.wait(timeout=TIMEOUT_S) == -signal.SIGKILL
        finally:
            process.kill()


def test_a_crashing_child_gives_its_signal_without_a_core(
    lnk_spawn: Path, group: Path, tmp_path: Path
) -> None:
    # pid 1 of a namespace ignores SIGTERM and the like even from outside; a fault is the
    # kernel's own signal, which no init ignores. lnk-spawn starts allowed to dump a core (in
    # its working folder, where core_pattern is "core"): it must turn that off before it dies.
    crash = "import ctypes; ctypes.string_at(0)"
    result = subprocess.run(
        [
            "/usr/bin/prlimit",
            "--core=unlimited:unlimited",
            "--",
            *_argv(lnk_spawn, group),
            "--",
            "/bin/sh",
            "-c",
            f'ulimit -c 0; exec {PYTHON} -I -S -c "{crash}"',
        ],
        env={},
        cwd=tmp_path,
        capture_output=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert result.returncode == -signal.SIGSEGV
    assert list(tmp_path.iterdir()) == []  # no core of lnk-spawn in its working folder


def test_sigterm_and_sigint_to_lnk_spawn_leave_it_waiting_for_its_child(
    lnk_spawn: Path, group: Path
) -> None:
    program = "echo up; read line; exit 3"
    with _spawn(
        lnk_spawn, group, "/bin/sh", "-c", program, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    ) as process:
        try:
            assert process.stdin is not None and process.stdout is not None
            assert process.stdout.readline() == "up\n"
            process.send_signal(signal.SIGTERM)
            process.send_signal(signal.SIGINT)
            time.sleep(0.1)
            assert process.poll() is None
            process.stdin.write("go\n")
            process.stdin.close()
            assert process.wait(timeout=TIMEOUT_S) == 3
        finally:
            process.kill()


def test_sigkill_to_lnk_spawn_kills_the_whole_namespace(lnk_spawn: Path, group: Path) -> None:
    program = "sleep 60 & sleep 60 & echo up; wait"
    with _spawn(lnk_spawn, group, "/bin/sh", "-c", program, stdout=subprocess.PIPE) as process:
        try:
            assert process.stdout is not None
            assert process.stdout.readline() == "up\n"
            assert len(_members(group)) == 3
            process.kill()
            process.wait(timeout=TIMEOUT_S)
            _wait_empty(group)
        finally:
            process.kill()


def test_lnk_spawn_dies_with_its_parent_and_takes_the_namespace(
    lnk_spawn: Path, group: Path
) -> None:
    # A shell forks lnk-spawn and waits; SIGKILL to the shell (the controller, in life) must
    # end lnk-spawn (PR_SET_PDEATHSIG) and so its namespace.
    words = _argv(lnk_spawn, group)
    words[words.index("--parent") + 1] = "$$"  # the shell is lnk-spawn's parent here
    argv = " ".join([*words, "--", "/bin/sleep", "60"])
    with subprocess.Popen(
        ["/bin/sh", "-c", f"{argv} & echo $!; wait"], stdout=subprocess.PIPE, text=True
    ) as parent:
        try:
            assert parent.stdout is not None
            spawner_pid = int(parent.stdout.readline())
            deadline = time.monotonic() + TIMEOUT_S
            while not _members(group):
                assert time.monotonic() < deadline, "the child never started"
                time.sleep(0.01)
            parent.kill()
            parent.wait(timeout=TIMEOUT_S)
            _wait_empty(group)
            deadline = time.monotonic() + TIMEOUT_S
            while Path(f"/proc/{spawner_pid}").exists():
                status = Path(f"/proc/{spawner_pid}/status").read_text()
                if "State:\tZ" in status:
                    break  # dead, only waiting for init to reap it
                assert time.monotonic() < deadline, "lnk-spawn outlived its parent"
                time.sleep(0.01)
        finally:
            parent.kill()


def test_ctty_gives_the_child_the_terminal_as_its_controlling_tty(
    lnk_spawn: Path, group: Path
) -> None:
    master, secondary = os.openpty()
    probe = "import os; os.close(os.open('/dev/tty', os.O_RDWR)); print('tty', os.getsid(0))"
    try:
        for ctty in (True, False):
            argv = [*_argv(lnk_spawn, group, ctty=ctty), "--", PYTHON, "-I", "-S", "-c", probe]
            result = subprocess.run(
                argv,
                stdin=secondary,
                stdout=secondary,
                stderr=subprocess.PIPE,
                env={},
                start_new_session=True,  # no controlling terminal of its own to inherit
                timeout=TIMEOUT_S,
                check=False,
            )
            if ctty:
                assert result.returncode == 0, result.stderr
                assert os.read(master, 100) == b"tty 1\r\n"  # session leader, pid 1
            else:  # without it, /dev/tty does not open: ENXIO, a Python traceback
                assert result.returncode == 1
                assert b"No such device or address" in result.stderr
    finally:
        os.close(master)
        os.close(secondary)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            ["--uid", str(UID), "--gid", str(GID)],
            "--parent, --cgroup, --uid and --gid are required",
        ),
        (["--cgroup", "G", "--gid", str(GID)], "--parent, --cgroup, --uid and --gid are required"),
        (["--cgroup", "G", "--uid", str(UID), "--gid", str(GID), "--parent"], "incomplete"),
        (["--cgroup", "G", "--uid", str(UID), "--gid", str(GID), "--parent", "x"], "not 'x'"),
        (["--cgroup", "G", "--uid", "0", "--gid", str(GID)], "--uid must be a number from 1"),
        (["--cgroup", "G", "--uid", str(UID), "--gid", "0"], "--gid must be a number from 1"),
        (["--cgroup", "G", "--uid", "root", "--gid", str(GID)], "not 'root'"),
        (["--cgroup", "G", "--uid", "-5", "--gid", str(GID)], "not '-5'"),
        (["--cgroup", "G", "--uid", "4294967295", "--gid", str(GID)], "not '4294967295'"),
        (["--cgroup", "G", "--uid", "00", "--gid", str(GID)], "not '00'"),
        (["--cgroup", "G", "--uid", "", "--gid", str(GID)], "not ''"),
        (["--cgroup", "G", "--uid", str(UID), "--gid", str(GID), "--pid"], "unknown"),
        (
            ["--cgroup", "G", "--uid", str(UID), "--gid", str(GID), "--oom-score-adj", "-500"],
            "0 to",
        ),
        (
            ["--cgroup", "G", "--uid", str(UID), "--gid", str(GID), "--oom-score-adj", "1001"],
            "0 to",
        ),
        (["--cgroup", "G", "--uid", str(UID), "--gid", str(GID), "--oom-score-adj", ""], "0 to"),
        (["--cgroup", "G", "--uid", str(UID), "--gid"], "unknown or incomplete"),
    ],
)
def test_bad_usage_refuses_and_runs_nothing(
    lnk_spawn: Path, group: Path, tmp_path: Path, options: list[str], message: str
) -> None:
    marker = tmp_path / "ran"
    options = [str(group) if o == "G" else o for o in options]
    if "--parent" not in options:
        options += ["--parent", str(os.getpid())]  # only the other options are wrong
    result = subprocess.run(
        [str(lnk_spawn), *options, "--", "/bin/touch", str(marker)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 126
    assert result.stderr.startswith("lnk-spawn: ")
    assert message in result.stderr
    assert not marker.exists()


def test_no_program_refuses(lnk_spawn: Path, group: Path) -> None:
    result = subprocess.run(
        [*_argv(lnk_spawn, group), "--"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 126
    assert "no program after --" in result.stderr


def test_a_missing_or_non_cgroup_folder_refuses_and_runs_nothing(
    lnk_spawn: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    for folder, message in (
        (tmp_path / "missing", "cannot open the cgroup: No such file or directory"),
        (tmp_path, "cannot start the sandbox's first process (clone3)"),
    ):
        result = subprocess.run(
            [*_argv(lnk_spawn, folder), "--", "/bin/touch", str(marker)],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            check=False,
        )
        assert result.returncode == 126
        assert message in result.stderr
        assert not marker.exists()


def test_a_program_that_cannot_run_refuses(lnk_spawn: Path, group: Path, tmp_path: Path) -> None:
    not_executable = tmp_path / "script"
    not_executable.write_text("#!/bin/sh\ntouch ran\n")
    not_executable.chmod(0o644)
    for program, message in (
        (str(not_executable), "Permission denied"),
        ("/nonexistent/program", "No such file or directory"),
    ):
        result = subprocess.run(
            [*_argv(lnk_spawn, group), "--", program],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            check=False,
        )
        assert result.returncode == 126
        assert f"lnk-spawn: cannot run {program}: {message}" in result.stderr


def test_a_parent_other_than_the_one_named_refuses_and_runs_nothing(
    lnk_spawn: Path, group: Path, tmp_path: Path
) -> None:
    """What a controller that died before lnk-spawn's first instruction looks like from inside:
    lnk-spawn's parent is another process (init, or whoever adopted it), not --parent."""
    marker = tmp_path / "ran"
    argv = _argv(lnk_spawn, group)
    argv[argv.index("--parent") + 1] = "1"
    result = subprocess.run(
        [*argv, "--", "/bin/touch", str(marker)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 126
    assert "the controller that started lnk-spawn is gone" in result.stderr
    assert not marker.exists()
    assert _members(group) == []
