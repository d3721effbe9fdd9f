"""Limits, attacked on this machine's hybrid cgroups (v1 pids, memory and cpu; a v2 tree with no
controller): a fork storm meets its process limit while another owner's sandbox still starts
within 2 s; a memory hog and a program filling /tmp, /dev/shm and its home are stopped or
refused at the memory limit and the client is told which; an owner at their sandbox count is
refused the next launch (exit 3, the limit named) while another owner is not; and after each,
nothing of the sandbox is left (no process of its uid, no cgroup of its id)."""

from __future__ import annotations

import json
import os
import pwd
import secrets
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import install_prefix
import pytest
from as_user import as_user

from lnk_controller.cgroup_limits import v1_hierarchies
from lnk_controller.cgroups import group_of

RunningBox = Any  # tests/e2e/conftest.py
pytestmark = pytest.mark.needs_root

LNK = str(install_prefix.LNK)
PROCESSES = 64  # the private box's process limit: small, so the storm meets it at once
MEMORY_MB = 128  # the private box's memory limit
PROCESSES_DEFAULT = 512  # lnk_controller.limits.BoxLimits' default
STORM_CAP = 400  # the storm's own bound: without a limit it stops here, not at the host's
HOG_CAP_MB = 1024  # the hog's and the filler's own bound: far above MEMORY_MB
START_S = 2.0  # another owner's sandbox starts within this, whatever the storm does
RUN_TIMEOUT_S = 60

# Forks children that spin until the deadline (30 s: it stops itself), until a fork is refused
# or STORM_CAP; says where it stopped, holds the limit until told on stdin, kills its children.
STORM = f"""
import os, sys, time
print(os.environ["LNK_SANDBOX_ID"], flush=True)
deadline = time.monotonic() + 30
kids, refused = [], 0
while len(kids) < {STORM_CAP} and time.monotonic() < deadline:
    try:
        pid = os.fork()
    except BlockingIOError:
        refused += 1
        break
    if pid == 0:
        while time.monotonic() < deadline:
            pass
        os._exit(0)
    kids.append(pid)
print(("at-limit" if refused else "no-limit"), len(kids), flush=True)
sys.stdin.readline()
try:
    os.fork()
    print("forked again", flush=True)
except BlockingIOError:
    print("still refused", flush=True)
for pid in kids:
    os.kill(pid, 9)
for pid in kids:
    os.waitpid(pid, 0)
"""

HOG = f"""
import os
print(os.environ["LNK_SANDBOX_ID"], flush=True)
held = []
for mb in range(0, {HOG_CAP_MB}, 16):
    held.append(bytearray(16 * 1024 * 1024))  # touched: bytearray fills it with zeros
print("allocated", {HOG_CAP_MB}, flush=True)
"""

FILLER = f"""
import os
print(os.environ["LNK_SANDBOX_ID"], flush=True)
chunk = b"x" * (4 * 1024 * 1024)
for folder in ("/tmp", "/dev/shm", os.environ["HOME"]):
    written = 0
    try:
        with open(os.path.join(folder, "fill"), "wb") as f:
            while written < {HOG_CAP_MB} * 1024 * 1024:
                f.write(chunk)
                f.flush()
                written += len(chunk)
    except OSError as exc:
        print("refused", folder, written // (1024 * 1024), exc.errno, flush=True)
        continue
    print("filled", folder, written // (1024 * 1024), flush=True)
"""

WAITER = "import os, sys; print(os.environ['LNK_SANDBOX_ID'], flush=True); sys.stdin.readline()"


@contextmanager
def _other_owner() -> Iterator[tuple[int, int, Path]]:
    name = "lnkl" + secrets.token_hex(3)
    subprocess.run(["useradd", "-m", "-s", "/bin/bash", "-K", "UID_MIN=1500", name], check=True)
    try:
        entry = pwd.getpwnam(name)
        yield entry.pw_uid, entry.pw_gid, Path(entry.pw_dir)
    finally:
        subprocess.run(["userdel", "-r", name], capture_output=True, check=False)


def _env(running_box: RunningBox, box: Any, home: Path | None = None) -> dict[str, str]:
    env = {**running_box.owner_env(), **{k: v for k, v in box.env.items() if k.startswith("LNK_")}}
    if home is not None:
        env["HOME"] = str(home)
    return env


def _lnk(
    running_box: RunningBox, box: Any, *args: str, timeout: float = RUN_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    """`lnk ARGS` as the session's owner, from their home, against the private box."""
    owner = running_box.owner
    return subprocess.run(
        as_user(owner.uid, owner.gid, LNK, *args),
        env=_env(running_box, box),
        cwd=str(owner.home),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _owner_run(running_box: RunningBox, *args: str) -> list[str]:
    owner = running_box.owner
    return as_user(owner.uid, owner.gid, LNK, "sandbox", "run", "--yes", *args)


def _python(running_box: RunningBox, box: Any, script: str, **kw: Any) -> Any:
    return subprocess.Popen(
        _owner_run(running_box, "--command=python3", "--", "python3", "-c", script),
        env=_env(running_box, box),
        cwd=str(running_box.owner.home),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def _nothing_left(box: Any, sandbox_id: str) -> None:
    """No user of the box's range (so no process of its uid: a user is removed only after
    its processes are gone), no v1 or v2 cgroup of the sandbox."""
    assert box.user_lines() == []
    # The controller was started from this process: its own groups are this process's.
    groups = [p / sandbox_id for p in v1_hierarchies().values()] + [group_of(sandbox_id)]
    assert [g for g in groups if g.exists()] == []
    assert len(groups) == 4  # pids, memory, cpu (v1) and the v2 group: the host this runs on


def _true_as_other(box: Any, running_box: RunningBox, other: tuple[int, int, Path]) -> float:
    uid, gid, home = other
    started = time.monotonic()
    result = subprocess.run(
        as_user(uid, gid, LNK, "sandbox", "run", "--yes", "--", "/bin/true"),
        env=_env(running_box, box, home),
        cwd=str(home),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    took = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    return took


def _listed_and_shown(running_box: RunningBox, box: Any, sandbox_id: str) -> tuple[Any, str]:
    """The ended sandbox's row in `lnk sandbox list --all --json`, and `show`'s output."""
    listed = _lnk(running_box, box, "sandbox", "list", "--all", "--json")
    (row,) = [r for r in json.loads(listed.stdout) if r["id"] == sandbox_id]
    shown = _lnk(running_box, box, "sandbox", "show", sandbox_id)
    assert shown.returncode == 0, shown.stderr
    return row, shown.stdout


def test_a_fork_storm_meets_its_process_limit_and_others_still_start(
    running_box: RunningBox, private_box: Any
) -> None:
    config = f"[limits]\nprocesses = {PROCESSES}\n"
    with private_box(config) as box, _other_owner() as other:
        storm = _python(running_box, box, STORM)
        try:
            assert storm.stdout is not None and storm.stdin is not None
            sandbox_id = storm.stdout.readline().strip()
            where = storm.stdout.readline().split()
            assert where[:1] == ["at-limit"], f"the storm was not stopped: {where}"
            assert int(where[1]) < PROCESSES
            took = _true_as_other(box, running_box, other)  # while the storm holds the limit
            storm.stdin.write("done\n")
            storm.stdin.flush()
            out, err = storm.communicate(timeout=RUN_TIMEOUT_S)
        finally:
            if storm.poll() is None:
                storm.kill()
                storm.wait()
        assert "still refused" in out
        assert storm.returncode == 0, err
        assert f"the sandbox reached its process limit ({PROCESSES})" in err
        assert took < START_S, f"another owner's sandbox took {took:.2f} s to run"
        _nothing_left(box, sandbox_id)
        # `lnk sandbox list` and `show` say it too, in the words the client was told.
        said = next(line for line in err.splitlines() if "process limit" in line)
        said = said.removeprefix("lnk: ")
        row, shown = _listed_and_shown(running_box, box, sandbox_id)
        assert (row["limit_met"], row["exit_status"]) == (said, 0)
        assert row["limits"].startswith(f"{PROCESSES} processes")
        assert f"limit met: {said}" in shown
        human = _lnk(running_box, box, "sandbox", "list", "--all")
        assert f"({said})" in human.stdout


def test_a_memory_hog_is_stopped_at_its_limit_and_the_client_told(
    running_box: RunningBox, private_box: Any
) -> None:
    with private_box(f"[limits]\nmemory_mb = {MEMORY_MB}\n") as box:
        hog = _python(running_box, box, HOG)
        out, err = hog.communicate(timeout=RUN_TIMEOUT_S)
        assert "allocated" not in out, "the hog got all it asked for"
        assert hog.returncode == 128 + 9, err  # killed: its own status
        said = f"the sandbox reached its memory limit ({MEMORY_MB} MiB) and was stopped"
        assert said in err
        sandbox_id = out.split()[0]
        _nothing_left(box, sandbox_id)
        row, shown = _listed_and_shown(running_box, box, sandbox_id)
        assert (row["limit_met"], row["exit_status"]) == (said, 137)
        assert row["limits"].startswith(f"{PROCESSES_DEFAULT} processes, {MEMORY_MB} MiB memory")
        assert f"limit met: {said}" in shown


def test_filling_tmp_shm_and_home_stops_at_the_memory_limit(
    running_box: RunningBox, private_box: Any
) -> None:
    with private_box(f"[limits]\nmemory_mb = {MEMORY_MB}\n") as box:
        filler = _python(running_box, box, FILLER)
        out, err = filler.communicate(timeout=RUN_TIMEOUT_S)
        lines = out.split("\n")
        written = sum(int(line.split()[2]) for line in lines if line.startswith(("filled", "ref")))
        # All three folders' pages are the sandbox's memory: together they stay under it.
        assert written <= MEMORY_MB, out
        told = f"the sandbox reached its memory limit ({MEMORY_MB} MiB) and was stopped" in err
        refused = any(line.startswith("refused") for line in lines)
        assert told or refused, (out, err)
        _nothing_left(box, lines[0].strip())


def test_an_owner_at_their_sandbox_count_is_refused_and_another_is_not(
    running_box: RunningBox, private_box: Any
) -> None:
    with private_box("[limits]\nowner_sandboxes = 2\n") as box, _other_owner() as other:
        waiting = [_python(running_box, box, WAITER) for _ in range(2)]
        try:
            ids = [p.stdout.readline().strip() for p in waiting if p.stdout is not None]
            assert all(ids), ids
            users_before = box.user_lines()
            third = _lnk(running_box, box, "sandbox", "run", "--yes", "--", "/bin/true")
            assert third.returncode == 126, third.stderr  # refused: a run's status
            assert "the owner's sandbox limit" in third.stderr
            assert "(2)" in third.stderr
            assert box.user_lines() == users_before  # nothing of a third one was made
            listed = _lnk(running_box, box, "sandbox", "list", "--json")
            assert sorted(s["id"] for s in json.loads(listed.stdout)) == sorted(ids)
            _true_as_other(box, running_box, other)  # another owner is not counted with them
        finally:
            for process in waiting:
                process.communicate("\n", timeout=RUN_TIMEOUT_S)
        for process in waiting:
            assert process.returncode == 0
        # Places are given back: a launch after they ended runs.
        again = _lnk(running_box, box, "sandbox", "run", "--yes", "--", "/bin/true")
        assert again.returncode == 0, again.stderr
        for sandbox_id in ids:
            _nothing_left(box, sandbox_id)


def test_the_launcher_sets_the_rlimit_floor(running_box: RunningBox, private_box: Any) -> None:
    config = f"[limits]\nprocesses = {PROCESSES}\nopen_files = 100\n"
    with private_box(config) as box:
        result = _lnk(
            running_box,
            box,
            "sandbox",
            "run",
            "--yes",
            "--command=cat",
            "--",
            "cat",
            "/proc/self/limits",
        )
        assert result.returncode == 0, result.stderr
        rows = {line[:26].strip(): line[26:].split() for line in result.stdout.splitlines()}
        assert rows["Max processes"][:2] == [str(PROCESSES), str(PROCESSES)]
        assert rows["Max open files"][:2] == ["100", "100"]
    # All sandboxes together are held to the host's memory less the box's reserve (512 MiB).
    with open("/proc/meminfo", encoding="ascii") as f:
        total = int(f.readline().split()[1]) * 1024
    shared = v1_hierarchies()["memory"] / "memory.limit_in_bytes"
    assert int(shared.read_text()) <= total - 512 * 1024 * 1024
    # ... and weighed below a service for CPU (a v1 group's tasks share its shares against
    # each task of the root's, the proxy's included): half a nice-0 task's 1024.
    if "cpu" in v1_hierarchies():
        weight = v1_hierarchies()["cpu"] / "cpu.shares"
        assert int(weight.read_text()) == 512  # cgroup_limits.SANDBOXES_CPU_SHARES


def _check(running_box: RunningBox, box: Any) -> tuple[int, dict[str, Any], str]:
    result = _lnk(running_box, box, "sandbox", "check", "--json", timeout=RUN_TIMEOUT_S * 2)
    doc = json.loads(result.stdout) if result.stdout.startswith("{") else {}
    return result.returncode, doc, result.stderr


def _limit_verdicts(doc: dict[str, Any]) -> dict[str, str]:
    return {p["id"]: p["verdict"] for p in doc["probes"] if p["id"].startswith("limits:")}


def test_check_tries_the_limits_and_reports_them(running_box: RunningBox, private_box: Any) -> None:
    with private_box(f"[limits]\nprocesses = {PROCESSES}\n") as box:
        code, doc, err = _check(running_box, box)
    assert code == 0, err
    assert _limit_verdicts(doc) == {
        "limits:processes": "refused",
        "limits:open_files": "refused",
        "limits:oom_score": "refused",
    }
    # The probe's threads met the process limit: the report says so as a client is told it.
    assert doc["limit_met"].startswith(f"the sandbox reached its process limit ({PROCESSES}): ")
    assert doc["limits"].startswith(f"{PROCESSES} processes, 1 GiB memory"), doc["limits"]
    assert "v1 pids" in doc["limits"] and "v1 memory" in doc["limits"]


def test_check_reports_a_sandbox_without_limits_as_leaked(
    running_box: RunningBox, private_box: Any
) -> None:
    with private_box("[limits]\nunsafe_no_limits = true\n") as box:
        code, doc, err = _check(running_box, box)
        log = (box.state_dir / "logs" / "controller.log").read_text()
    assert code == 1, err  # leaked
    assert _limit_verdicts(doc) == {
        "limits:processes": "leaked",
        "limits:open_files": "leaked",
        "limits:oom_score": "leaked",  # it inherits the controller's, below its own services'
    }
    assert doc["limits"].startswith("none")
    assert doc["limit_met"] is None  # no limit, none met
    assert "unsafe_no_limits" in log  # the switch says so at each launch


def test_a_launch_may_ask_for_less_never_for_more(
    running_box: RunningBox, private_box: Any
) -> None:
    config = f"[limits]\nprocesses = {PROCESSES}\nopen_files = 100\n"
    with private_box(config) as box:
        spec = running_box.owner.home / "limits.toml"
        spec.write_text('[limits]\nopen_files = 50\n[commands]\nallow = ["cat"]\n')
        os.chown(spec, running_box.owner.uid, running_box.owner.gid)
        try:
            less = _lnk(
                running_box,
                box,
                *("sandbox", "run", "--yes", f"--spec={spec}", "--processes=32", "--"),
                *("cat", "/proc/self/limits"),
            )
        finally:
            spec.unlink()
        assert less.returncode == 0, less.stderr
        rows = {line[:26].strip(): line[26:].split() for line in less.stdout.splitlines()}
        assert rows["Max processes"][:2] == ["32", "32"]  # the flag
        assert rows["Max open files"][:2] == ["50", "50"]  # the spec's [limits]
        for asked, named in (
            (f"--processes={PROCESSES + 1}", "the process limit"),
            ("--memory=2G", "the memory limit"),
            ("--open-files=101", "the open-file limit"),
        ):
            more = _lnk(running_box, box, "sandbox", "run", "--yes", asked, "--", "/bin/true")
            assert more.returncode == 126, more.stderr  # refused: a run's status
            assert named in more.stderr and "more than this box allows" in more.stderr
            assert "Traceback" not in more.stderr
            assert box.user_lines() == []  # nothing was made for it


LOWER_OOM_SCORE = """
with open("/proc/self/oom_score_adj") as f:
    score = int(f.read())
print(score, flush=True)
try:
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write(str(score - 1))
    print("lowered")
except OSError as exc:
    print("refused", exc.errno)
"""


def test_the_hosts_oom_killer_takes_a_sandbox_before_the_services(
    running_box: RunningBox, private_box: Any
) -> None:
    """A sandbox cannot make itself look smaller than the box's services to the host's OOM
    killer: they stand at -500 (at 0 where root lacks CAP_SYS_RESOURCE, as in a container),
    it at +500, and it cannot lower its own."""
    with private_box() as box:
        for service in ("controller", "proxy", "bridge-store"):
            pid = (box.run_dir / f"{service}.pid").read_text().strip()
            score = Path(f"/proc/{pid}/oom_score_adj").read_text()
            assert score == ("-500\n" if _may_lower_oom_scores() else "0\n"), service
        result = _lnk(
            running_box,
            box,
            *("sandbox", "run", "--yes", "--command=python3", "--"),
            *("python3", "-c", LOWER_OOM_SCORE),
        )
        assert result.returncode == 0, result.stderr
        score, refused = result.stdout.splitlines()
        assert score == "500"
        assert refused.startswith("refused "), refused  # EACCES by the kernel's floor


CAP_SYS_RESOURCE = 24


def _may_lower_oom_scores() -> bool:
    with open("/proc/self/status", encoding="ascii") as f:
        effective = next(line for line in f if line.startswith("CapEff:")).split()[1]
    return bool(int(effective, 16) >> CAP_SYS_RESOURCE & 1)
