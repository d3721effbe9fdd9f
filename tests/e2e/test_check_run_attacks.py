"""The seed's "Tests": `lnk sandbox run` a program that tries to read ~/.ssh, the box's settings
and its caller's environment, write the home folder and reach the network; every attempt fails,
and the outside agrees (the files are untouched, the listener accepted nothing).

The control runs the same program with the home granted for reading: the same attempts at
~/.ssh and the home then succeed, so the program can tell success from failure.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import install_prefix
import pytest
from as_user import as_user

RunningBox = Any  # tests/e2e/conftest.py
pytestmark = [pytest.mark.needs_root, pytest.mark.e2e]

# Each attempt prints "ok" or the error it met; nothing is dialed off this machine: 1.1.1.1 is
# connected to only when a route lookup (UDP connect, no packet) finds no route to it.
ATTEMPTS = r"""
import errno, json, os, socket, sys
home, settings_file, port, machine = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
results, seen = {}, []
def attempt(name, fn):
    try:
        value = fn()
        results[name] = "ok"
        if value:
            seen.append(str(value))
    except OSError as e:
        results[name] = errno.errorcode.get(e.errno, str(e)) if e.errno else str(e)
def read(path):
    with open(path, "rb") as f:
        return f.read().decode("latin-1")
def environs():
    found = [json.dumps(dict(os.environ))]
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) != os.getpid():
            try:
                found.append(read(f"/proc/{pid}/environ"))
            except OSError:
                pass
    text = "\n".join(found)
    if "LNK_CALLER_SECRET" not in text:
        raise PermissionError(errno.EACCES, "not found")
    return text
def write_home():
    with open(os.path.join(home, "written-by-sandbox"), "x") as f:
        f.write("x")
def connect(host):
    with socket.create_connection((host, port), timeout=3):
        pass
def internet():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
        u.connect(("1.1.1.1", 80))  # a route lookup: raises when there is none
    return "a route to 1.1.1.1"
attempt("read ssh key", lambda: read(os.path.join(home, ".ssh", "id_ed25519")))
attempt("list ssh", lambda: ",".join(os.listdir(os.path.join(home, ".ssh"))))
attempt("read settings", lambda: read(settings_file))
attempt("caller env", environs)
attempt("write home", write_home)
attempt("tcp loopback", lambda: connect("127.0.0.1"))
attempt("tcp machine", lambda: connect(machine))
attempt("dns", lambda: socket.getaddrinfo("example.com", 80))
attempt("internet", internet)
print(json.dumps({"results": results, "seen": seen}))
"""


def _machine_address() -> str:
    out = subprocess.run(
        ["ip", "-j", "-4", "addr", "show", "scope", "global"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for link in json.loads(out):
        for info in link.get("addr_info", []):
            return str(info["local"])
    return "127.0.0.2"


@pytest.fixture
def settings_bait(running_box: RunningBox) -> Iterator[tuple[Path, str]]:
    """A secret in the owner's ~/.lnk (made for the test when missing)."""
    owner = running_box.owner
    folder = owner.home / ".lnk"
    made = not folder.exists()
    folder.mkdir(mode=0o700, exist_ok=True)
    path = folder / f"bait-{secrets.token_hex(4)}"
    secret = secrets.token_hex(16)
    path.write_text(secret)
    for p in (folder, path):
        os.chown(p, owner.uid, owner.gid)
    try:
        yield path, secret
    finally:
        path.unlink(missing_ok=True)
        if made:
            shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A TCP listener on every address of this machine, on one port."""
    server = socket.socket()
    server.bind(("0.0.0.0", 0))
    server.listen(16)
    try:
        yield server
    finally:
        server.close()


def _accepted(server: socket.socket) -> int:
    server.setblocking(False)
    count = 0
    while True:
        try:
            conn, _ = server.accept()
        except BlockingIOError:
            return count
        conn.close()
        count += 1


def _attempts(
    box: RunningBox, settings: Path, port: int, caller_secret: str, *flags: str
) -> tuple[dict[str, str], str]:
    owner = box.owner
    argv = as_user(
        owner.uid,
        owner.gid,
        str(install_prefix.LNK),
        "sandbox",
        "run",
        "--yes",
        *flags,
        "--",
        "python3",
        "-I",
        "-c",
        ATTEMPTS,
        str(owner.home),
        str(settings),
        str(port),
        _machine_address(),
    )
    result = subprocess.run(
        argv,
        env={**box.owner_env(), "LNK_CALLER_SECRET": caller_secret},
        cwd=str(owner.home),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout.strip().splitlines()[-1])
    return doc["results"], result.stdout + result.stderr


def test_a_sandboxed_program_reaches_none_of_the_owners_secrets_home_or_network(
    running_box: RunningBox, settings_bait: tuple[Path, str], listener: socket.socket
) -> None:
    settings, settings_secret = settings_bait
    caller_secret = secrets.token_hex(16)
    home = running_box.owner.home
    results, output = _attempts(running_box, settings, listener.getsockname()[1], caller_secret)
    assert set(results) == {
        "read ssh key",
        "list ssh",
        "read settings",
        "caller env",
        "write home",
        "tcp loopback",
        "tcp machine",
        "dns",
        "internet",
    }
    assert "ok" not in results.values(), results
    for secret in (running_box.owner.secret, settings_secret, caller_secret):
        assert secret not in output
    assert not (home / "written-by-sandbox").exists()
    assert _accepted(listener) == 0
    with socket.create_connection(("127.0.0.1", listener.getsockname()[1]), timeout=3):
        pass  # control: the listener does listen
    assert _accepted(listener) == 1


def test_the_same_program_sees_the_home_when_it_is_granted(
    running_box: RunningBox, settings_bait: tuple[Path, str], listener: socket.socket
) -> None:
    settings, _ = settings_bait
    home = running_box.owner.home
    results, output = _attempts(
        running_box, settings, listener.getsockname()[1], "unused", f"--read={home}"
    )
    assert results["read ssh key"] == "ok"
    assert results["list ssh"] == "ok"
    assert running_box.owner.secret in output
    assert results["read settings"] != "ok"  # ~/.lnk stays hidden inside a granted home
    assert results["write home"] != "ok"  # granted for reading only
    assert not (home / "written-by-sandbox").exists()
