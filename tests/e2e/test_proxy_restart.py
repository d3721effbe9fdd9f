"""A proxy restart loses no sandbox: a box of its own with the test internet behind its proxy, a
sandbox that is running, `kill -9` of the proxy, then `lnk box up` (which starts what is down):
the sandbox's next requests are judged and answered as before, because the controller kept the
listening socket and handed it to the new proxy (`proxy_link.keep_listeners`). While the proxy
is down, the sandbox's request gets the controller's 503 saying so (`proxy_standin`), where
before it waited in the listener's backlog until its client gave up.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # pytest's importlib mode adds no test dir
from as_owner import LNK, start_as_owner
from net import WWW, TestInternet

RunningBox = Any  # tests/e2e/conftest.py
pytestmark = [pytest.mark.needs_root, pytest.mark.e2e]

REQUESTS = 10
DEATH_S = 10.0  # a SIGKILLed process is gone in milliseconds
SANDBOX_S = 120  # the whole run: a launch, a restart and eleven requests
CURL = f'curl -sS --max-time 20 -o /dev/null -w "%{{http_code}}\\n" http://{WWW}/'
DOWN_S = 20  # the 503 comes within a second of the proxy's death (the keeper's interval)
# The answer's body and code on one line (`echo` of it unquoted), whatever curl got: no wait.
DOWN_CURL = f'echo $(curl -sS --max-time {DOWN_S} -w " %{{http_code}}" http://{WWW}/)'
SCRIPT = f"{CURL}; read go; {DOWN_CURL}; read go; for i in $(seq {REQUESTS}); do {CURL}; done"


def _proxy_pid(box: Any) -> int:
    return int((box.run_dir / "proxy.pid").read_text().strip())


def _allowed_lines(box: Any) -> int:
    return sum(p.read_text().count('"allowed"') for p in (box.state_dir / "wire").glob("*.log"))


def _wait_logged(box: Any, count: int) -> None:
    """Until the wire log holds `count` allowed lines: an exchange's line is written once it
    ends, after its answer, so the client's "200" can come before it (a `kill -9` then would
    lose that line: README's known gaps)."""
    deadline = time.monotonic() + DEATH_S
    while _allowed_lines(box) < count:
        assert time.monotonic() < deadline, f"{_allowed_lines(box)} allowed lines, not {count}"
        time.sleep(0.01)


def _wait_dead(pid: int) -> None:
    deadline = time.monotonic() + DEATH_S
    while Path(f"/proc/{pid}").exists():
        stat = Path(f"/proc/{pid}/stat").read_text(errors="replace")
        if stat.rsplit(")", 1)[1].split()[0] in ("Z", "X"):
            return
        assert time.monotonic() < deadline, f"the proxy {pid} did not die"
        time.sleep(0.01)


def test_kill_9_of_the_proxy_then_box_up_keeps_a_running_sandboxs_way_out(
    running_box: RunningBox, netbox: Any, internet: TestInternet
) -> None:
    argv = [
        LNK,
        "sandbox",
        "run",
        "--yes",
        "--command=curl",
        "--command=seq",
        f"--internet-host={WWW}",
        "--",
        "/bin/sh",
        "-c",
        SCRIPT,
    ]
    sandbox = start_as_owner(running_box, argv, box=netbox)
    try:
        assert sandbox.stdout is not None and sandbox.stdin is not None
        assert sandbox.stdout.readline() == "200\n", sandbox.stderr
        _wait_logged(netbox, 1)  # the killed proxy's one exchange is in the log before it dies
        before = internet.accepted(internet.www)
        old = _proxy_pid(netbox)
        os.kill(old, signal.SIGKILL)
        _wait_dead(old)
        status = netbox.lnk("box", "status")  # says so while it is down
        proxy_line = next(line for line in status.stdout.splitlines() if line.startswith("proxy "))
        assert status.returncode == 1 and " down " in proxy_line, status.stdout
        sandbox.stdin.write("go\n")  # a request while the proxy is down
        sandbox.stdin.flush()
        said = sandbox.stdout.readline()
        assert said.endswith(" 503\n") and "filtering proxy is down" in said, said
        assert "lnk box up" in said
        assert internet.accepted(internet.www) == before  # it went nowhere
        up = netbox.lnk("box", "up")
        assert up.returncode == 0, up.stderr
        assert _proxy_pid(netbox) != old
        sandbox.stdin.write("go\n")
        sandbox.stdin.flush()
        out, err = sandbox.communicate(timeout=SANDBOX_S)
    finally:
        if sandbox.poll() is None:
            sandbox.kill()
            sandbox.communicate()
    assert out.splitlines() == ["200"] * REQUESTS, err
    assert internet.accepted(internet.www) > before  # by the new proxy (pooled: one or more)
    _wait_logged(netbox, REQUESTS + 1)  # judged, logged (each line once its exchange ended)
