"""Nothing else suffers: one sandbox at every limit at once (its process limit met by a bounded
fork storm whose first children spin on every core, its memory nearly full with a hog and its
/tmp, /dev/shm and home filled, its open files at the cap) while, from outside, each of the
box's other users is timed and must answer within a stated bound: another owner's
`lnk sandbox run -- /bin/true`, the controller's API (`lnk sandbox list`), the proxy answering
another sandbox's request to a host of the test internet, the store bridge, and an SSH gate
session (a real sshd, a box user's key, `lnk sandbox enter`). The host's free
memory is sampled all along and never drops below the box's reserve. Then the hog asks past the
memory limit: the sandbox is stopped, its client told which limit, and nothing of it is left.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import install_prefix
import pytest
from as_user import as_user
from bridge_helpers import bridge_admin
from sshd import gate_sshd, let_in

sys.path.insert(0, str(Path(__file__).parent))  # pytest's importlib mode adds no test dir
from internet_box import proxy_config
from net import WWW, TestInternet
from test_limits import _env, _lnk, _nothing_left, _other_owner, _python, _true_as_other

from lnk_controller.cgroup_limits import v1_hierarchies

RunningBox = Any  # tests/e2e/conftest.py
pytestmark = [pytest.mark.needs_root, pytest.mark.e2e]

PROCESSES = 64  # the sandbox's process limit: small, so the storm meets it in well under a second
MEMORY_MB = 256  # the sandbox's memory limit
TMP_MB = 40  # each of /tmp, /dev/shm and home: filled to this, three of them under MEMORY_MB
HOLD_MB = 96  # the hog's first hold: with the folders' 120 MiB, near the limit but under it
OPEN_FILES = 256  # the sandbox's open-file limit, met by its main process
RESERVE_MB = 512  # lnk_controller.limits.BoxLimits' reserve_memory_mb default
# How long each may take while the sandbox holds every limit (quiet, on this 2-core machine:
# 0.1-0.3 s for the first two, under 0.3 s for the proxy, milliseconds for the bridge, ~1.3 s
# for a gate session); each bound leaves room for a machine others share, not for a stall.
BOUNDS_S = {
    "another owner's sandbox": 2.0,  # `lnk sandbox run -- /bin/true`: the bound
    "the controller's API": 3.0,  # `lnk sandbox list`: a Python client's start and one request
    "the proxy": 2.0,  # one request of another sandbox to the test internet, answered
    "the store bridge": 2.0,  # its admin socket's ping, answered
    "an SSH gate session": 4.0,  # ssh's key exchange and `lnk sandbox enter`'s sandbox
}
ROUNDS = 3  # each of them is timed this many times while the sandbox holds its limits
SAMPLE_S = 0.02  # the memory sampler's period: a hog fills 16 MiB in about this
RUN_TIMEOUT_S = 120
# The sandbox's own bounds, should a limit not hold: far above the limits, far below the host's.
STORM_CAP = 400
FILES_CAP = 4096
HOG_CAP_MB = 1024
CURL = f'curl -sS --max-time 20 -o /dev/null -w "%{{http_code}}\\n" http://{WWW}/'

# Stops itself 30 s after it starts, whatever happens, and at its own caps. Once at every limit
# it says where it stands, holds until told on stdin, then asks for memory past its limit.
AT_EVERY_LIMIT = f"""
import errno, os, select, sys, time
MIB = 1024 * 1024
print(os.environ["LNK_SANDBOX_ID"], flush=True)
deadline = time.monotonic() + 30
filled = 0
for folder in ("/tmp", "/dev/shm", os.environ["HOME"]):
    try:
        with open(os.path.join(folder, "fill"), "wb") as f:
            while filled < 3 * {TMP_MB} * MIB:
                f.write(b"x" * MIB)
                f.flush()
                filled += MIB
    except OSError as exc:
        assert exc.errno == errno.ENOSPC, exc
spinners = 2 * (os.cpu_count() or 1)
wait_r, wait_w = os.pipe()
kids, refused = [], False
while len(kids) < {STORM_CAP} and time.monotonic() < deadline:
    try:
        pid = os.fork()
    except BlockingIOError:
        refused = True
        break
    if pid == 0:
        os.close(wait_w)
        if len(kids) < spinners:
            while time.monotonic() < deadline:
                pass
        else:
            select.select([wait_r], [], [], max(0.0, deadline - time.monotonic()))
        os._exit(0)
    kids.append(pid)
held = [bytearray(16 * MIB) for _ in range({HOLD_MB} // 16)]  # touched: zero-filled
fds = []
try:
    while len(fds) < {FILES_CAP}:
        fds.append(os.open("/dev/null", os.O_RDONLY))
except OSError as exc:
    at_cap = exc.errno == errno.EMFILE
else:
    at_cap = False
print("held", refused, len(kids), at_cap, len(fds), filled // MIB, flush=True)
sys.stdin.readline()
while len(held) * 16 < {HOG_CAP_MB}:
    held.append(bytearray(16 * MIB))
print("not stopped", len(held) * 16, flush=True)
"""


@dataclass
class Sampler:
    """The host's MemAvailable and the sandbox's memory use (its v1 group), every SAMPLE_S."""

    group: Path | None = None
    least_free: int = 1 << 62
    most_used: int = 0
    samples: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self._stop.is_set():
            with open("/proc/meminfo", encoding="ascii") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        self.least_free = min(self.least_free, int(line.split()[1]) * 1024)
            if self.group is not None:
                try:
                    used = int((self.group / "memory.usage_in_bytes").read_text())
                except OSError:
                    used = 0  # removed: the sandbox ended
                self.most_used = max(self.most_used, used)
            self.samples += 1
            self._stop.wait(SAMPLE_S)

    def stop(self) -> None:
        self._stop.set()


def _timed(work: Callable[[], object]) -> float:
    started = time.monotonic()
    work()
    return time.monotonic() - started


def _proxied(client: Any) -> Callable[[], None]:
    """One request by the other owner's sandbox, through the proxy, to the test internet."""

    def ask() -> None:
        client.stdin.write("go\n")
        client.stdin.flush()
        assert client.stdout.readline() == "200\n", "the proxy did not answer the other sandbox"

    return ask


def test_one_sandbox_at_every_limit_at_once_and_nothing_else_suffers(
    running_box: RunningBox, private_box: Any, internet: TestInternet
) -> None:
    config = (
        f"tmp_size_mb = {TMP_MB}\n[limits]\nprocesses = {PROCESSES}\nmemory_mb = {MEMORY_MB}\n"
        f"open_files = {OPEN_FILES}\n"
    )
    sampler = Sampler()
    watching = threading.Thread(target=sampler.run, daemon=True)
    with (
        private_box(config, proxy_config=proxy_config(internet)) as box,
        _other_owner() as other,
        gate_sshd() as sshd,
    ):
        uid, gid, home = other
        gate_user = let_in(box, sshd)
        client = subprocess.Popen(
            as_user(
                uid,
                gid,
                str(install_prefix.LNK),
                *("sandbox", "run", "--yes", "--command=curl", f"--internet-host={WWW}", "--"),
                *("/bin/sh", "-c", f"while read go; do {CURL}; done"),
            ),
            env=_env(running_box, box, home),
            cwd=str(home),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        hog = None
        try:
            ask_proxy = _proxied(client)
            ask_proxy()  # it runs, and its way out works, before the storm
            checks: dict[str, Callable[[], object]] = {
                "another owner's sandbox": lambda: _true_as_other(box, running_box, other),
                "the controller's API": lambda: _listed(running_box, box),
                "the proxy": ask_proxy,
                "the store bridge": lambda: _pinged(box),
                "an SSH gate session": lambda: _session(sshd, gate_user),
            }
            quiet = {name: _timed(check) for name, check in checks.items()}
            watching.start()
            hog = _python(running_box, box, AT_EVERY_LIMIT)
            assert hog.stdout is not None and hog.stdin is not None
            sandbox_id = hog.stdout.readline().strip()
            sampler.group = v1_hierarchies()["memory"] / sandbox_id
            held = hog.stdout.readline().split()
            assert held[:2] == ["held", "True"], f"not at the process limit: {held}"
            assert int(held[2]) < PROCESSES and held[3] == "True", held
            assert int(held[4]) < OPEN_FILES and int(held[5]) == 3 * TMP_MB, held
            took: dict[str, list[float]] = {name: [] for name in checks}
            for _ in range(ROUNDS):
                for name, check in checks.items():
                    took[name].append(_timed(check))
            assert hog.poll() is None, "the sandbox ended before it was asked past its memory"
            # Still at its process limit all the while (its children stop at 30 s, after this).
            pids = v1_hierarchies()["pids"] / sandbox_id / "pids.current"
            assert int(pids.read_text()) == PROCESSES, "the storm ended before it was measured"
            hog.stdin.write("more\n")
            hog.stdin.flush()
            out, err = hog.communicate(timeout=RUN_TIMEOUT_S)
            after = _timed(checks["another owner's sandbox"])
        finally:
            sampler.stop()
            if watching.is_alive():
                watching.join()
            if hog is not None and hog.poll() is None:
                hog.kill()
                hog.communicate()
            client.communicate("", timeout=RUN_TIMEOUT_S)  # its loop ends at end of input
        assert "not stopped" not in out, "the hog got past its memory limit"
        assert hog.returncode == 128 + 9, err
        said = f"the sandbox reached its memory limit ({MEMORY_MB} MiB) and was stopped"
        assert said in err
        slow = {
            name: (f"{max(times):.2f} s (quiet: {quiet[name]:.2f} s)")
            for name, times in took.items()
            if max(times) >= BOUNDS_S[name]
        }
        assert not slow, f"these suffered while one sandbox was at every limit: {slow}"
        bound = BOUNDS_S["another owner's sandbox"]
        assert after < bound, f"another owner's sandbox took {after:.2f} s after the kill"
        assert sampler.samples > 0 and 0 < sampler.most_used <= MEMORY_MB * 1024 * 1024
        assert sampler.least_free >= RESERVE_MB * 1024 * 1024, (
            f"the host's free memory fell to {sampler.least_free // (1024 * 1024)} MiB"
        )
        assert client.returncode == 0
        _nothing_left(box, sandbox_id)


def _listed(running_box: RunningBox, box: Any) -> None:
    listed = _lnk(running_box, box, "sandbox", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    json.loads(listed.stdout)


def _session(sshd: Any, user: Any) -> None:
    result = sshd.ssh(user, command="true")
    assert result.returncode == 0, result.stderr


def _pinged(box: Any) -> None:
    assert bridge_admin(box.run_dir, {"op": "ping"})["ok"] is True
