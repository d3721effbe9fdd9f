"""`lnk sandbox check` end to end: the installed `lnk`, run as a real unprivileged owner, against
a real box (the session's, or a private one with the test internet behind its proxy).

Each test also checks the outside itself: the bait is gone afterwards (files, folders made for
the run, the bait server, the program holding a secret), what the check says reached a host did
reach it (the test internet's accept logs), and the spec was not remembered.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import install_prefix
import pytest
from as_owner import lnk_argv, owner_env
from check_run import run_check, verdicts_of
from net import NAS, WWW

from lnk_shared.protected_names import PROTECTED_NAMES

RunningBox = Any  # tests/e2e/conftest.py
pytestmark = [pytest.mark.needs_root, pytest.mark.e2e]

LNK = str(install_prefix.LNK)
BAIT_PREFIX = "lnk-check-"
BAIT_ENV = b"LNK_CHECK_BAIT="
CHECK_TIMEOUT_S = 60
# What a sandbox with no grants must show, probe family by family: every one refused, the ELF
# loader running an ungranted /usr program too (test_wall_exec).
FAMILIES = (
    "read.home",
    "read.settings",
    "read.var-tmp",
    "read.agents:",
    "read.hidden:~/.ssh",
    "list.ssh",
    "write.home",
    "confiner",
    "server:127.0.0.1",
    "server:::ffff:127.0.0.1",
    "abstract-socket",
    "internet:direct",
    "environ",
    "privilege",
    "kernel:",
    "exec:ungranted",
    "exec:loader",
    "exec:tmp-copy",
    "exec:memfd",
)


# -- helpers ------------------------------------------------------------------------------------


def _check(
    box: RunningBox, *flags: str, private: Any | None = None
) -> tuple[int, dict[str, Any], str]:
    return run_check(box, *flags, private=private, timeout=CHECK_TIMEOUT_S)


def _not_refused(doc: dict[str, Any]) -> dict[str, str]:
    return {p["id"]: p["verdict"] for p in doc["probes"] if p["verdict"] != "refused"}


def _tree(root: Path) -> set[str]:
    """Every path under `root`, links not followed."""
    found = set()
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            found.add(os.path.join(folder, name))
    return found


def _bait_processes(owner_uid: int) -> list[int]:
    """Bait programs of this owner's checks still running (another run's checks on this machine
    are not this test's)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid != owner_uid:
                    continue
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if BAIT_ENV in f.read():
                        found.append(int(entry))
            except OSError:
                continue
    return found


def _bait_files(owner_uid: int) -> list[str]:
    """Bait this owner's checks left in /var/tmp (another run's are its own)."""
    found = []
    for name in os.listdir("/var/tmp"):
        if name.startswith(BAIT_PREFIX):
            try:
                if os.lstat(f"/var/tmp/{name}").st_uid == owner_uid:
                    found.append(name)
            except OSError:
                continue
    return found


def _bait_port(doc: dict[str, Any]) -> int:
    tried = next(p["tried"] for p in doc["probes"] if p["id"] == "server:127.0.0.1")
    return int(re.search(r"port (\d+)", tried).group(1))  # type: ignore[union-attr]


def _assert_nothing_remains(box: RunningBox, before: set[str], port: int | None) -> None:
    home = box.owner.home
    assert _tree(home) == before, f"left in the home: {_tree(home) ^ before}"
    assert _bait_files(box.owner.uid) == []
    assert _bait_processes(box.owner.uid) == []
    if port is not None:
        with socket.socket() as s, pytest.raises(ConnectionRefusedError):
            s.connect(("127.0.0.1", port))


def _remembered(box: RunningBox, private: Any | None = None) -> list[Any]:
    listed = subprocess.run(
        lnk_argv(box, "spec", "list", "--json"),
        env=owner_env(box, private),
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    rows: list[Any] = json.loads(listed.stdout)
    return rows


class _Served:
    """A loopback server on this machine standing for whatever serves a `[localhost]` port."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]

    def accepted(self) -> int:
        self.sock.setblocking(False)
        count = 0
        while True:
            try:
                conn, _ = self.sock.accept()
            except BlockingIOError:
                return count
            conn.close()
            count += 1


@pytest.fixture
def served() -> Iterator[_Served]:
    server = _Served()
    try:
        yield server
    finally:
        server.sock.close()


# -- no grants ----------------------------------------------------------------------------------


def test_check_with_no_grants_refuses_every_probe_and_leaves_nothing(
    running_box: RunningBox,
) -> None:
    before = _tree(running_box.owner.home)
    remembered = _remembered(running_box)
    code, doc, stderr = _check(running_box)
    assert code == 0, stderr
    verdicts = verdicts_of(doc)
    for family in FAMILIES:  # each family was really tried, not skipped
        assert any(i.startswith(family) for i in verdicts), family
    assert _not_refused(doc) == {}  # the loader's probe too: the gap is closed
    assert {"kernel:pidfd_getfd", "kernel:kcmp"} <= set(verdicts)  # another's descriptors
    assert doc["leaked"] is False
    assert doc["summary"]["refused"] == len(verdicts)
    assert all(p["expected"] == p["verdict"] for p in doc["probes"])
    _assert_nothing_remains(running_box, before, _bait_port(doc))
    assert _remembered(running_box) == remembered  # checking approves nothing


# -- the checker's honesty ------------------------------------------------------------------------


def _has_route(address: str) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((address, 80))  # a route lookup: nothing is sent
        except OSError:
            return False
    return True


def test_check_of_an_open_sandbox_reports_exactly_its_leaks_gaps_and_grants(
    running_box: RunningBox, served: _Served
) -> None:
    """A checker that always says "refused" fails here: with the home readable, the host's
    network shared and a localhost port, each of those must show, and nothing else."""
    home = running_box.owner.home
    before = _tree(home)
    code, doc, stderr = _check(
        running_box, f"--read={home}", "--network-mode=host", f"--port={served.port}"
    )
    assert code == 1, stderr
    assert doc["leaked"] is True
    verdicts = verdicts_of(doc)
    expected = {
        "read.home": "allowed",
        "list.ssh": "allowed",
        "server:127.0.0.1": "leaked",
        "server:::ffff:127.0.0.1": "leaked",
        f"port:{served.port}": "known gap",
    }
    hidden = [i for i in verdicts if i.startswith("read.hidden:")]  # ~/.ssh, and any other
    assert "read.hidden:~/.ssh" in hidden
    expected.update(dict.fromkeys(hidden, "allowed"))
    if "server:::1" in verdicts:
        expected["server:::1"] = "leaked"
    if "server:machine" in verdicts:
        expected["server:machine"] = "leaked"
    if _has_route("1.1.1.1"):  # host mode: a route there is what the grant gives (not dialed)
        expected["internet:direct"] = "allowed"
    assert _not_refused(doc) == expected
    # Hidden inside the read grant, and outside it: still refused.
    assert verdicts["read.settings"] == "refused"
    assert verdicts["read.agents:Link/Agents"] == "refused"
    assert verdicts["read.var-tmp"] == "refused"
    assert served.accepted() == 1  # the port's server was reached, once, by the probe
    observed = {p["id"]: p["observed"] for p in doc["probes"]}
    for ident in ("server:127.0.0.1", "server:::ffff:127.0.0.1"):  # seen outside, not only said
        assert "the bait server accepted a connection" in observed[ident]
    assert "the secret came back" in observed["read.home"]
    _assert_nothing_remains(running_box, before, _bait_port(doc))


# -- grants through the proxy ---------------------------------------------------------------------


@pytest.fixture
def spec_file(running_box: RunningBox) -> Iterator[Path]:
    path = running_box.owner.home / "check-spec.toml"
    yield path
    path.unlink(missing_ok=True)


def _write_spec(box: RunningBox, path: Path, text: str) -> None:
    path.write_text(text)
    os.chown(path, box.owner.uid, box.owner.gid)


def test_check_with_grants_allows_what_they_open_and_refuses_the_rest(
    running_box: RunningBox, netbox: Any, internet: Any, served: _Served, spec_file: Path
) -> None:
    home = running_box.owner.home
    out = home / "project" / "out"
    _write_spec(
        running_box,
        spec_file,
        f'[folders]\nread = ["{home / "project"}"]\nwrite = ["{out}"]\n'
        f'[internet]\nhosts = ["{WWW}"]\n'
        f'[lan]\nhosts = ["{NAS}"]\n'
        f"[localhost]\nports = [{served.port}]\n",
    )
    before = _tree(home)
    remembered = _remembered(running_box, netbox)
    www, nas = internet.accepted(internet.www), internet.accepted(internet.nas)
    code, doc, stderr = _check(running_box, f"--spec={spec_file}", private=netbox)
    assert code == 0, stderr
    assert _not_refused(doc) == {
        f"write.folder:{out}": "allowed",
        f"internet-host:{WWW}": "allowed",
        f"lan-host:{NAS}": "allowed",
        f"port:{served.port}": "known gap",
        f"write.deep-dot:{out}": "known gap",  # dot entries are kept only at the top
    }
    verdicts = verdicts_of(doc)
    asked = [i for i in verdicts if i.startswith("proxy:")]
    assert "proxy:tunnel-1.1.1.1" in asked
    assert "proxy:unlisted" in asked
    assert any(i.startswith("proxy:machine:[64:ff9b::") for i in asked)
    assert any(i.startswith("proxy:network:") for i in asked)
    # Every name of the one table (protected_names.py) is tried at the top of the write folder.
    assert sum(1 for i in verdicts if i.startswith(f"write.dot:{out}/")) == len(PROTECTED_NAMES)
    assert verdicts[f"exec:write-copy:{out}"] == "refused"  # written there, not run from there
    assert verdicts[f"write.read-folder:{home / 'project'}"] == "refused"  # granted read only
    # The outside agrees: the listed hosts were reached once each (the probes), nothing else of
    # the test internet was (its networks were asked for by address, and refused).
    assert internet.accepted(internet.www) == www + 1
    assert internet.accepted(internet.nas) == nas + 1
    assert served.accepted() == 1
    _assert_nothing_remains(running_box, before, _bait_port(doc))
    assert _remembered(running_box, netbox) == remembered
    # Not approved by the check: a run still asks (and, with no terminal, refuses).
    run = subprocess.run(
        lnk_argv(running_box, "sandbox", "run", f"--spec={spec_file}", "--", "/bin/true"),
        env=owner_env(running_box, netbox),
        cwd=str(home),
        capture_output=True,
        text=True,
        timeout=CHECK_TIMEOUT_S,
        check=False,
    )
    assert run.returncode != 0
    assert "not approved" in run.stderr


def test_check_of_host_network_reports_the_bait_server_leaked(running_box: RunningBox) -> None:
    """The person's report: one line per probe, a summary, exit 1."""
    result = subprocess.run(
        lnk_argv(running_box, "sandbox", "check", "--network-mode=host"),
        env=owner_env(running_box, None),
        capture_output=True,
        text=True,
        timeout=CHECK_TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    leaked = [line for line in lines if line.startswith("leaked ")]
    assert any("bait server at 127.0.0.1" in line for line in leaked), result.stdout
    assert lines[-1].startswith("LEAKED:")


# -- interrupted --------------------------------------------------------------------------------


def _running_sandboxes(box: RunningBox, private: Any) -> list[Any]:
    listed = subprocess.run(
        lnk_argv(box, "sandbox", "list", "--json"),
        env=owner_env(box, private),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return [r for r in json.loads(listed.stdout or "[]") if r["state"] == "running"]


def test_check_interrupted_with_sigint_leaves_nothing(
    running_box: RunningBox, netbox: Any, internet: Any
) -> None:
    """A `[lan]` address nothing answers holds the probes for a few seconds (the proxy dials
    it): SIGINT arrives while the sandbox runs, the bait is there and the probes are busy."""
    home = running_box.owner.home
    silent = str(internet.lan_subnet.network_address + 99)
    before = _tree(home)
    check = subprocess.Popen(
        lnk_argv(running_box, "sandbox", "check", f"--lan-host={silent}"),
        env=owner_env(running_box, netbox),
        cwd=str(home),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while not _running_sandboxes(running_box, netbox):
            assert check.poll() is None, check.communicate()
            assert time.monotonic() < deadline, "the check's sandbox never ran"
            time.sleep(0.05)
        assert _bait_processes(running_box.owner.uid), (
            "the bait was not set up while the sandbox ran"
        )
        check.send_signal(signal.SIGINT)
        out, err = check.communicate(timeout=30)
    finally:
        if check.poll() is None:
            check.kill()
            check.wait()
    assert check.returncode == 1
    assert "interrupted" in err
    assert out == ""  # no report: an interrupted check passes nothing
    assert _running_sandboxes(running_box, netbox) == []
    _assert_nothing_remains(running_box, before, None)


# -- a sandbox that cannot be built -----------------------------------------------------------


def test_check_of_a_refused_spec_is_an_error_and_sets_nothing_up(running_box: RunningBox) -> None:
    before = _tree(running_box.owner.home)
    result = subprocess.run(
        lnk_argv(running_box, "sandbox", "check", f"--write={running_box.owner.home}/.ssh"),
        env=owner_env(running_box, None),
        capture_output=True,
        text=True,
        timeout=CHECK_TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 3, result.stderr
    assert result.stdout == ""
    _assert_nothing_remains(running_box, before, None)


def test_check_of_a_sandbox_the_box_cannot_build_is_an_error(
    running_box: RunningBox, private_box: Any
) -> None:
    before = _tree(running_box.owner.home)
    with private_box("unsafe_pretend_landlock_abi = 1") as box:
        result = subprocess.run(
            lnk_argv(running_box, "sandbox", "check"),
            env=owner_env(running_box, box),
            capture_output=True,
            text=True,
            timeout=CHECK_TIMEOUT_S,
            check=False,
        )
    assert result.returncode == 3, result.stderr  # refused: the wall cannot be built
    assert "Landlock" in result.stderr
    assert result.stdout == ""
    _assert_nothing_remains(running_box, before, None)


def test_check_probes_a_folder_passed_open_with_with_fd(running_box: RunningBox) -> None:
    home = running_box.owner.home
    folder = home / "project" / "out"
    before = _tree(home)
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        result = subprocess.run(
            lnk_argv(running_box, "sandbox", "check", "--json", f"--with-fd={fd}:write"),
            env=owner_env(running_box, None),
            cwd=str(home),
            capture_output=True,
            text=True,
            timeout=CHECK_TIMEOUT_S,
            check=False,
            pass_fds=(fd,),
        )
    finally:
        os.close(fd)
    assert result.returncode == 0, result.stderr
    verdicts = verdicts_of(json.loads(result.stdout))
    assert verdicts[f"write.folder:{folder}"] == "allowed"
    assert verdicts[f"write.dot:{folder}/.git/hooks"] == "refused"
    assert verdicts[f"exec:write-copy:{folder}"] == "refused"
    _assert_nothing_remains(running_box, before, None)
