"""The `lnk` command in C (lnk_cli/native/lnk_client*.c), built once per session, and a scripted
fake controller on a real launch socket for it to talk to.

`native_client`: the binary in a folder laid out as a venv's (bin/lnk beside bin/python3,
pyvenv.cfg and lib/ of the venv running these tests), so its fallback finds the Python CLI
the way an installed `lnk` does: a bare python3 symlink elsewhere is not a venv (Python looks
for pyvenv.cfg beside the path it was started as, then resolves the link to the base Python).
`controller`: a launch socket in a short temp folder (a unix socket's path is at most 108
bytes); each `serve(script)` accepts one client, records its request frame (the bytes as sent,
what the descriptors are, and which program the caller was, from SO_PEERCRED and /proc), then
runs the script on the connection.

`plan`: a temp home with the check's bait in it, the judged grants of spec flags for its owner
and the plan `lnk sandbox check` makes of them (test_check_plan*.py).
"""

from __future__ import annotations

import argparse
import array
import json
import os
import shutil
import socket
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from bridge_clients import FakeBridge, Result, key_pem
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from lnk_cli.app import run
from lnk_cli.check.bait import Bait
from lnk_cli.check.plan import Probe, build_plan
from lnk_shared.discovery import context_for, resolve_spec
from lnk_shared.frames import HEADER_BYTES, MAX_FDS, no_duplicate_keys
from lnk_shared.grants import Grants
from lnk_shared.native_build import CLIENT, build
from lnk_shared.paths import BoxPaths
from lnk_shared.refusals import judge
from lnk_shared.spec_flags import add_spec_arguments, spec_from_arguments
from lnk_shared.unix import peer_cred

TIMEOUT_S = 10.0


@pytest.fixture(scope="session")
def native_client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("venv")
    (root / "bin").mkdir()
    venv = Path(sys.prefix)
    if (venv / "pyvenv.cfg").exists():
        shutil.copy(venv / "pyvenv.cfg", root / "pyvenv.cfg")
        (root / "lib").symlink_to(venv / "lib")
        (root / "bin" / "python3").symlink_to(venv / "bin" / "python3")
    else:  # a plain Python (lnk_cli on PYTHONPATH): its own python3 is enough
        (root / "bin" / "python3").symlink_to(sys.executable)
    return build(root / "bin" / CLIENT, program=CLIENT)


@dataclass
class Launch:
    """What a client sent first, and who it was."""

    raw: bytes  # the request's JSON, byte for byte
    message: dict[str, object]
    stats: list[os.stat_result]  # of each descriptor passed (closed once read: a client's
    blocking: list[bool]  # stdout held here would keep its reader waiting for EOF)
    exe: str  # the caller's program when it connected (/proc/PID/exe)


Script = Callable[[socket.socket, Launch], None]  # the connection and what came on it


def read_frame(conn: socket.socket) -> tuple[bytes, list[int]]:
    """One frame as its raw JSON bytes and the descriptors on it (b"" at EOF)."""
    fds = array.array("i")
    data, ancillary, _flags, _ = conn.recvmsg(HEADER_BYTES, socket.CMSG_SPACE(MAX_FDS * 4))
    for level, kind, rights in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(rights[: len(rights) - len(rights) % fds.itemsize])
    if not data:
        return b"", list(fds)
    while len(data) < HEADER_BYTES:
        data += conn.recv(HEADER_BYTES - len(data))
    length = int.from_bytes(data, "big")
    body = b""
    while len(body) < length:
        chunk = conn.recv(length - len(body))
        if not chunk:
            break
        body += chunk
    return body, list(fds)


def decode(raw: bytes) -> dict[str, object]:
    value = json.loads(raw, object_pairs_hook=no_duplicate_keys)
    assert isinstance(value, dict)
    return value


def write_frame(conn: socket.socket, message: dict[str, object] | bytes, fds: list[int]) -> None:
    body = message if isinstance(message, bytes) else json.dumps(message).encode()
    data = len(body).to_bytes(HEADER_BYTES, "big") + body
    if fds:
        rights = array.array("i", fds).tobytes()
        sent = conn.sendmsg([data[:1]], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, rights)])
        data = data[sent:]
    conn.sendall(data)


@dataclass
class Controller:
    run_dir: Path
    listener: socket.socket
    launches: list[Launch] = field(default_factory=list)
    _threads: list[threading.Thread] = field(default_factory=list)
    _errors: list[BaseException] = field(default_factory=list)

    # The frame helpers, for scripts (a test module cannot import this conftest by name).
    read_frame = staticmethod(read_frame)
    write_frame = staticmethod(write_frame)
    timeout_s = TIMEOUT_S

    def serve(self, script: Script) -> None:
        """Answer the next client with `script` (in a thread; `check` re-raises its failure)."""
        thread = threading.Thread(target=self._serve_one, args=(script,), daemon=True)
        self._threads.append(thread)
        thread.start()

    def _serve_one(self, script: Script) -> None:
        try:
            conn, _ = self.listener.accept()
            with conn:
                conn.settimeout(TIMEOUT_S)
                pid = peer_cred(conn).pid
                exe = os.readlink(f"/proc/{pid}/exe")
                raw, fds = read_frame(conn)
                try:
                    stats = [os.fstat(fd) for fd in fds]
                    blocking = [os.get_blocking(fd) for fd in fds]
                finally:
                    for fd in fds:
                        os.close(fd)
                message = decode(raw) if raw else {}
                launch = Launch(raw, message, stats, blocking, exe)
                self.launches.append(launch)
                script(conn, launch)
        except BaseException as exc:  # re-raised in the test's thread by check()
            self._errors.append(exc)

    def check(self) -> Launch:
        """Wait for the scripts, re-raise what failed in them; the last launch."""
        for thread in self._threads:
            thread.join(TIMEOUT_S)
            assert not thread.is_alive(), "the fake controller's script did not end"
        if self._errors:
            raise self._errors[0]
        assert self.launches, "no client connected"
        return self.launches[-1]


@pytest.fixture
def odd_cwd(tmp_path: Path) -> bytes:
    """A working folder whose name is every kind of odd (quotes, a backslash, not UTF-8), with
    a spec file in it."""
    folder = bytes(tmp_path) + "/wörk dir \"'\\".encode() + b"\xff"
    os.mkdir(folder)
    Path(os.fsdecode(folder), "spec.toml").write_text("# read by the controller, not here\n")
    return folder


@pytest.fixture
def controller() -> Iterator[Controller]:
    run_dir = Path(tempfile.mkdtemp(prefix="lnkc-", dir="/tmp"))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(run_dir / "launch.sock"))
    listener.listen(8)
    listener.settimeout(TIMEOUT_S)
    fake = Controller(run_dir=run_dir, listener=listener)
    try:
        yield fake
    finally:
        listener.close()
        for thread in fake._threads:
            thread.join(TIMEOUT_S)
        shutil.rmtree(run_dir, ignore_errors=True)


# -- the check's plan --------------------------------------------------------------------------

CONFINER_DIR = "/opt/lnk/venv/lib/python3.11/site-packages/lnk_controller"


def judged_flags(home: Path, *flags: str) -> Grants:
    """The judged grants of these spec flags for an owner whose home is `home`."""
    parser = argparse.ArgumentParser()
    add_spec_arguments(parser)
    spec = spec_from_arguments(parser.parse_args(list(flags)), cwd=str(home))
    box = BoxPaths(home.parent / "etc", home.parent / "state", home.parent / "run")
    ctx = context_for(os.getuid(), env={"PATH": "/usr/bin:/bin"}, box=box, home=str(home))
    return judge(resolve_spec(spec, ctx, path_env="/usr/bin:/bin"), ctx)


@pytest.fixture
def grants_for() -> Callable[..., Grants]:
    """`grants_for(home, *flags)`: the judged grants of those flags (`judged_flags`)."""
    return judged_flags


@dataclass
class PlanKit:
    """A home with a key, a config folder and a write folder holding a `.envrc`, the bait set
    up in it, and what `build_plan` makes of a spec's flags there."""

    home: Path
    bait: Bait

    def grants(self, *flags: str) -> Grants:
        return judged_flags(self.home, *flags)

    def probes(self, grants: Grants) -> list[Probe]:
        return build_plan(grants, self.bait, CONFINER_DIR)

    @staticmethod
    def expected(probes: list[Probe]) -> dict[str, str]:
        return {p.id: p.expected for p in probes}


@pytest.fixture
def plan(tmp_path: Path) -> Iterator[PlanKit]:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("KEY\n")
    (home / ".config").mkdir()
    (home / "project" / "out").mkdir(parents=True)
    (home / "project" / "out" / ".envrc").write_text("export X=1\n")
    with Bait.set_up(str(home)) as bait:
        yield PlanKit(home, bait)


# -- the C `lnk bridge` client (test_native_bridge*.py; tests/unit/helpers/bridge_clients.py) ---


@pytest.fixture(scope="module")
def c_only(native_client: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The C client alone: no python3 beside it, so nothing it answers is Python's."""
    folder = tmp_path_factory.mktemp("c-only")
    return Path(shutil.copy(native_client, folder / "lnk"))


@pytest.fixture
def py(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Any:
    """The Python CLI in this process (as fast as a call gets): (status, stdout, stderr)."""

    def call(words: list[str], env: dict[str, str]) -> Result:
        for name in ("LNK_AGENT", "LNK_AGENT_KEY", "LNK_BRIDGE"):
            if name in env:
                monkeypatch.setenv(name, env[name])
            else:
                monkeypatch.delenv(name, raising=False)
        capsys.readouterr()
        try:
            status = run(words)
        except SystemExit as exc:  # argparse's --help and its errors
            status = exc.code if isinstance(exc.code, int) else 1
        out = capsys.readouterr()
        return status, out.out.encode(), out.err.encode()

    return call


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[tuple[FakeBridge, Path, Ed25519PrivateKey]]:
    folder = Path(tempfile.mkdtemp(prefix="lnkfb", dir="/tmp"))
    bridge = FakeBridge(folder)
    key = Ed25519PrivateKey.generate()
    key_file = tmp_path / "key.pem"
    key_file.write_bytes(key_pem(key))
    key_file.chmod(0o600)
    try:
        yield bridge, key_file, key
    finally:
        bridge.close()
        shutil.rmtree(folder, ignore_errors=True)
