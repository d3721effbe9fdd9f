"""What a sandbox could do on its caller's side, attacked from inside a real sandbox launched by
the real owner with the installed clients: the C client (`lnk`, its quick path) and the Python
client (the same request from lnk_cli), each on the same spec.

- the caller's terminal: a sandbox given it (stdin or stderr a tty, the other streams pipes)
  turned echo off for good; now it gets /dev/null or a pipe, and the modes are as before;
- a link made in a write folder, which the owner's own `echo x > report.txt` outside would
  follow into ~/.ssh/authorized_keys: refused by Landlock (no MAKE_SYM in write grants);
- a `>> log` stdout, which the sandbox could truncate and overwrite: it gets a pipe the
  controller appends from;
- what names or identifies the host: /etc/hosts, the boot id, machine-id.

Each attack is judged from outside too (the terminal's modes, the files on the host as the
owner's tools see them), and each has its neighbour showing what is granted still works.
"""

from __future__ import annotations

import json
import os
import secrets
import select
import signal
import socket
import subprocess
import termios
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import install_prefix
import pytest
from as_user import as_user

pytestmark = [pytest.mark.e2e, pytest.mark.needs_root]
RunningBox = Any  # tests/e2e/conftest.py
WAIT_S = 60.0
PYTHON_CLI = (
    str(install_prefix.PREFIX / "venv" / "bin" / "python3"),
    "-P",
    "-c",
    "from lnk_cli.__main__ import main; main()",
)
CLIENTS = {"c": (str(install_prefix.LNK),), "python": PYTHON_CLI}


def _argv(box: RunningBox, client: str, *words: str) -> list[str]:
    return as_user(box.owner.uid, box.owner.gid, *CLIENTS[client], *words)


@pytest.fixture
def spec(running_box: RunningBox) -> Iterator[Any]:
    """`spec(text)` writes a spec file the owner owns; removed afterwards."""
    made: list[Path] = []
    owner = running_box.owner

    def write(text: str) -> Path:
        path = owner.home / f"caller-{secrets.token_hex(3)}.toml"
        path.write_text(text)
        os.chown(path, owner.uid, owner.gid)
        made.append(path)
        return path

    yield write
    for path in made:
        path.unlink(missing_ok=True)


def _launch(
    box: RunningBox, client: str, spec: Path, script: str, **streams: Any
) -> subprocess.CompletedProcess[bytes]:
    argv = _argv(box, client, "sandbox", "run", "--spec", str(spec), "--yes", "--")
    return subprocess.run(
        [*argv, "/bin/sh", "-c", script],
        env=box.owner_env(),
        cwd=str(box.owner.home),
        timeout=WAIT_S,
        check=False,
        **streams,
    )


def _echo_on(fd: int) -> bool:
    return bool(termios.tcgetattr(fd)[3] & termios.ECHO)


def _drain(master: int, into: bytearray) -> threading.Thread:
    """Read the pty's master to its end (a full pty would block whoever writes it)."""

    def read() -> None:
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                return
            if not chunk:
                return
            into.extend(chunk)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


# -- the caller's terminal ----------------------------------------------------------------------

# Which stream is the terminal: the C client's quick path runs only with stdin and stdout not
# terminals, so its case is stderr; the Python client's are stdin alone and stderr alone.
TERMINAL_CASES = [("python", 0), ("python", 2), ("c", 2)]


@pytest.mark.parametrize(("client", "tty_fd"), TERMINAL_CASES, ids=str)
def test_a_terminal_on_one_stream_only_is_not_passed_and_echo_stays_on(
    running_box: RunningBox, spec: Any, client: str, tty_fd: int
) -> None:
    master, secondary = os.openpty()
    seen = bytearray()
    reader = None
    try:
        before = termios.tcgetattr(secondary)
        reader = _drain(master, seen)
        streams: dict[str, Any] = {
            "stdin": subprocess.DEVNULL,
            "stdout": subprocess.PIPE,
            "stderr": subprocess.PIPE,
        }
        streams[("stdin", "stdout", "stderr")[tty_fd]] = secondary
        script = (
            'for fd in 0 1 2; do [ -t "$fd" ] && echo "terminal on $fd" >&1; done; '
            f"stty -echo raw <&{tty_fd} 2>/dev/null && echo 'stty worked'; echo ran"
        )
        ran = _launch(
            running_box, client, spec('[commands]\nallow = ["stty"]\n'), script, **streams
        )
        after = termios.tcgetattr(secondary)
        echo = _echo_on(secondary)
    finally:
        os.close(secondary)
        if reader is not None:  # it ends once no one holds the terminal: then close
            reader.join(WAIT_S)
        os.close(master)
    out = (ran.stdout or b"").decode() + seen.decode(errors="replace")
    assert ran.returncode == 0, (ran.stderr, out)
    assert "ran" in out
    assert "terminal on" not in out, "the sandbox was given the caller's terminal"
    assert "stty worked" not in out
    assert echo, "echo is off on the caller's terminal after the run"
    assert after == before


def test_output_to_a_terminal_on_stderr_still_reaches_it(
    running_box: RunningBox, spec: Any
) -> None:
    master, secondary = os.openpty()
    seen = bytearray()
    try:
        reader = _drain(master, seen)
        ran = _launch(
            running_box,
            "c",
            spec(""),
            "echo to-the-terminal >&2; echo to-stdout",
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=secondary,
        )
    finally:
        os.close(secondary)
    reader.join(WAIT_S)
    os.close(master)
    assert (ran.returncode, ran.stdout) == (0, b"to-stdout\n")
    assert b"to-the-terminal" in seen


LEASE_S = 3  # the private box's lease: it runs out while the sandbox sleeps


@pytest.mark.parametrize("ending", ["stop", "lease", "sigkill"])
def test_a_killed_sandbox_leaves_the_callers_terminal_as_it_was(
    running_box: RunningBox, private_box: Any, spec: Any, ending: str
) -> None:
    """Stdin and stdout a terminal: the sandbox gets a pty, turns echo off there, and is ended
    from outside while the client relays: stopped from another process (`lnk sandbox stop`),
    or its lease runs out (a private box with a short lease), or every process of the sandbox
    gets SIGKILL (root, from outside)."""
    if ending == "lease":
        with private_box(f"lease_seconds = {LEASE_S}") as box:
            env = {k: v for k, v in box.env.items() if k.startswith("LNK_")}
            before, after, code = _ended_under_a_pty(running_box, spec, env, ending=ending)
    else:
        before, after, code = _ended_under_a_pty(running_box, spec, {}, ending=ending)
    assert code != 0
    assert after[3] & termios.ECHO, "echo is off on the caller's terminal after the run"
    assert after == before


def _ended_under_a_pty(
    box: RunningBox, spec: Any, extra_env: dict[str, str], *, ending: str
) -> tuple[list[Any], list[Any], int]:
    """(modes before, modes after, the client's exit status)."""
    master, secondary = os.openpty()
    seen = bytearray()
    reader = None
    owner = box.owner
    env = {**box.owner_env(), **extra_env}
    try:
        before = termios.tcgetattr(secondary)
        path = spec('[commands]\nallow = ["stty", "sleep"]\n')
        argv = _argv(box, "c", "sandbox", "run", "--spec", str(path), "--yes", "--")
        script = 'stty -echo; echo "started $LNK_SANDBOX_ID."; exec sleep 120'
        process = subprocess.Popen(
            [*argv, "/bin/sh", "-c", script],
            env=env,
            cwd=str(owner.home),
            stdin=secondary,
            stdout=secondary,
            stderr=secondary,
            start_new_session=True,
        )
        try:
            sandbox_id = _started_id(master, seen)
            if ending == "stop":
                stopped = box.as_owner("sandbox", "stop", sandbox_id)
                assert stopped.returncode == 0, stopped.stderr
            elif ending == "sigkill":
                _kill_sandbox(box, sandbox_id)
            reader = _drain(master, seen)  # the client's last words, so it never blocks
            process.wait(timeout=WAIT_S)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        after = termios.tcgetattr(secondary)
    finally:
        os.close(secondary)
        if reader is not None:  # it ends once no one holds the terminal: then close
            reader.join(WAIT_S)
        os.close(master)
    return before, after, process.returncode


def _kill_sandbox(box: RunningBox, sandbox_id: str) -> None:
    """SIGKILL to each process of the sandbox's host uid, by pid (as a crash or an OOM would)."""
    listed = box.as_owner("sandbox", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    (uid,) = [r["host_uid"] for r in json.loads(listed.stdout) if r["id"] == sandbox_id]
    killed = 0
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and os.stat(f"/proc/{entry}").st_uid == uid:
                os.kill(int(entry), signal.SIGKILL)
                killed += 1
        except (FileNotFoundError, ProcessLookupError):
            continue
    assert killed, "no process of the sandbox was found"


def _started_id(master: int, seen: bytearray) -> str:
    """The sandbox's id, from its "started ID." line on the pty."""
    while b"." not in seen.partition(b"started ")[2]:
        ready, _, _ = select.select([master], [], [], WAIT_S)
        assert ready, f"the sandbox did not start: {bytes(seen)!r}"
        seen.extend(os.read(master, 4096))
    return seen.partition(b"started ")[2].partition(b".")[0].decode()


# -- links in write folders ---------------------------------------------------------------------


@pytest.mark.parametrize("client", ["c", "python"])
def test_a_link_to_authorized_keys_made_in_a_write_folder_is_refused(
    running_box: RunningBox, spec: Any, client: str
) -> None:
    owner = running_box.owner
    out = owner.home / "project" / "out"
    report = out / f"report-{secrets.token_hex(3)}.txt"
    keys = owner.home / ".ssh" / "authorized_keys"
    script = (
        f"ln -s {keys} {report} && echo made-the-link; "
        f"mkdir -p {out}/d && ln -s ../../../.ssh {out}/d/ssh && echo made-relative; "
        f"echo a > /tmp/a && ln /tmp/a {out}/hard && echo made-hard; "
        "ln -s /usr /tmp/usr && echo private-link-ok; "
        f"echo plain > {out}/plain.txt && echo write-ok"
    )
    path = spec(f'[folders]\nwrite = ["{out}"]\n[commands]\nallow = ["ln", "mkdir"]\n')
    try:
        ran = _launch(running_box, client, path, script, capture_output=True, text=True)
        assert "made-the-link" not in ran.stdout
        assert "made-relative" not in ran.stdout
        assert "made-hard" not in ran.stdout
        assert not os.path.lexists(report)
        assert not os.path.lexists(out / "d" / "ssh")
        assert not os.path.lexists(out / "hard")
        # The granted side still works: links in its own /tmp, plain files in the grant.
        assert "private-link-ok" in ran.stdout, ran.stderr
        assert "write-ok" in ran.stdout, ran.stderr
        assert (out / "plain.txt").read_text() == "plain\n"
        # The owner's own tools afterwards, outside: the write lands in the folder.
        outside = subprocess.run(
            as_user(owner.uid, owner.gid, "/bin/sh", "-c", f"echo x > {report}"),
            capture_output=True,
            check=False,
        )
        assert outside.returncode == 0
        assert not keys.exists(), "the owner's write went through a link into authorized_keys"
        assert report.read_text() == "x\n"
        assert not report.is_symlink()
    finally:
        for leftover in (report, out / "plain.txt", out / "hard"):
            leftover.unlink(missing_ok=True)
        if (out / "d").exists():
            subprocess.run(["rm", "-rf", str(out / "d")], check=False)
        keys.unlink(missing_ok=True)


# -- an append-only stdout ----------------------------------------------------------------------

TRUNCATE = """
import fcntl, os, sys
fcntl.fcntl(1, fcntl.F_SETFL, fcntl.fcntl(1, fcntl.F_GETFL) & ~os.O_APPEND)
for name, attempt in (
    ("truncate", lambda: os.ftruncate(1, 0)),
    ("pwrite", lambda: os.pwrite(1, b"OVERWRITTEN", 0)),
    ("seek", lambda: os.lseek(1, 0, os.SEEK_SET)),
):
    try:
        attempt()
        print(name, "worked", file=sys.stderr)
    except OSError as exc:
        print(name, "refused", exc.errno, file=sys.stderr)
os.write(1, b"after\\n")
"""


@pytest.mark.parametrize("client", ["c", "python"])
def test_an_append_only_stdout_is_never_truncated_or_overwritten(
    running_box: RunningBox, spec: Any, client: str
) -> None:
    owner = running_box.owner
    log = owner.home / f"build-{secrets.token_hex(3)}.log"
    log.write_text("what was there before\n")
    os.chown(log, owner.uid, owner.gid)
    path = spec('[commands]\nallow = ["python3"]\n')
    fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    try:
        argv = _argv(running_box, client, "sandbox", "run", "--spec", str(path), "--yes", "--")
        ran = subprocess.run(
            [*argv, "python3", "-I", "-c", TRUNCATE],
            env=running_box.owner_env(),
            cwd=str(owner.home),
            stdin=subprocess.DEVNULL,
            stdout=fd,
            stderr=subprocess.PIPE,
            text=True,
            timeout=WAIT_S,
            check=False,
        )
        content = log.read_text()
    finally:
        os.close(fd)
        log.unlink(missing_ok=True)
    assert ran.returncode == 0, ran.stderr
    assert "worked" not in ran.stderr, ran.stderr
    assert content == "what was there before\nafter\n"


# -- what the sandbox learns of the host --------------------------------------------------------

IDENTITY = (
    'read -r boot < /proc/sys/kernel/random/boot_id; echo "boot $boot"; '
    'read -r name < /proc/sys/kernel/hostname; echo "name $name"; '
    'while read -r line; do echo "hosts $line"; done < /etc/hosts; '
    "for f in /etc/machine-id /var/lib/dbus/machine-id /etc/hostname; do "
    '[ -e "$f" ] && echo "present $f"; done; echo ran'
)


@pytest.mark.parametrize("client", ["c", "python"])
def test_the_sandbox_sees_its_own_hosts_file_and_boot_id(
    running_box: RunningBox, spec: Any, client: str
) -> None:
    path = spec("")
    runs = [
        _launch(running_box, client, path, IDENTITY, capture_output=True, text=True)
        for _ in range(2)
    ]
    with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
        host_boot = f.read().strip()
    host_name = socket.gethostname()
    boots = []
    for ran in runs:
        assert ran.returncode == 0, ran.stderr
        lines = ran.stdout.splitlines()
        assert lines[-1] == "ran"
        boot = next(line.split()[1] for line in lines if line.startswith("boot "))
        assert boot != host_boot
        assert len(boot) == len(host_boot)  # a UUID, as programs expect it
        boots.append(boot)
        hosts = [line.split()[1:] for line in lines if line.startswith("hosts ")]
        names = {name for entry in hosts for name in entry[1:]}
        assert host_name not in names
        assert "localhost" in names
        assert [line for line in lines if line.startswith("name ")] == ["name lnk-sandbox"]
        assert not [line for line in lines if line.startswith("present ")]
    assert boots[0] != boots[1], "the boot id is one per sandbox"


CLOCKS = (
    'read -r up idle < /proc/uptime; echo "up $up"; '
    'while read -r key value rest; do [ "$key" = btime ] && echo "btime $value"; '
    "done < /proc/stat; "
    "echo ran"
)


def _host_boot_time() -> int:
    with open("/proc/stat", encoding="ascii") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("btime "))


@pytest.mark.parametrize("client", ["c", "python"])
def test_the_sandbox_has_clocks_of_its_own_that_do_not_tell_when_the_host_booted(
    running_box: RunningBox, spec: Any, client: str
) -> None:
    path = spec("")
    before = time.clock_gettime(time.CLOCK_BOOTTIME)
    ran = _launch(running_box, client, path, CLOCKS, capture_output=True, text=True)
    after = time.clock_gettime(time.CLOCK_BOOTTIME)
    assert ran.returncode == 0, ran.stderr
    lines = dict(line.split(" ", 1) for line in ran.stdout.splitlines() if " " in line)
    assert ran.stdout.splitlines()[-1] == "ran"
    up = float(lines["up"])
    # Its uptime is its own age (born at 0 within the launch), not the host's: the host has
    # been up at least as long as this test module has been running.
    assert up <= after - before + 1.0, (up, before, after)
    assert before > up + 1.0, "the host booted too recently to tell the clocks apart"
    # btime = the wall clock less the boot clock: inside, that is when the sandbox started.
    assert abs(int(lines["btime"]) - _host_boot_time()) > 2
    assert abs(int(lines["btime"]) - time.time()) <= after - before + 3
