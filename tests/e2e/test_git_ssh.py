"""Git over ssh from inside a sandbox, through the proxy's CONNECT (the box's `lnk-connect` as
ssh's ProxyCommand, client_proxy_env.py's GIT_SSH_COMMAND), against a real OpenSSH sshd in the
test internet's public namespace (`net.py`) serving a git repository, as a non-root box user
under a finite `[commands]` list without Python (the connector is granted by the box).

`lnk sandbox check` tries the same two attacks (`plan_ssh.py`): `refused` here, and `leaked` on a
box whose proxy has `unsafe_ssh_port_by_any_entry` (a test-only switch, logged as a warning).

The attacks: ssh to a host the spec does not list, and to port 22 of a host the spec lists
without `:22` (a bare name, `*`): each refused by the proxy, its rule in the wire's log, and the
test sshd's log shows no connection at all. The grant: `host:22` clones, in both of git's ssh
spellings, and the wire's log shows the tunnel. Host keys are the user's: without a read grant
of ~/.ssh/known_hosts, ssh refuses the host (no prompt, no trust on first use).
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from as_user import as_user
from check_run import run_check
from conftest import LNK, Owner, _make_owner, _private_box
from internet_box import proxy_config
from net import OTHER, WWW, TestInternet
from on_pty import answer_on_pty
from test_readme_examples import usage_lines

pytestmark = [pytest.mark.needs_root, pytest.mark.e2e]

CHECK_TIMEOUT_S = 60  # as test_check.py's

RunningBox = Any  # tests/e2e/conftest.py
SSHD = "/usr/sbin/sshd"
UNLISTED, BARE = "proxy:ssh-unlisted", f"proxy:ssh-bare:{WWW}"  # lnk_cli.check.plan_ssh
SSH_PORT = 22
START_S = 10.0  # sshd listens within milliseconds; this only bounds a broken start
RUN_S = 60  # one sandbox's clone, on a loaded 2-core machine
MESSAGE = "served over ssh"
# git, the program git runs for its subcommands, ssh, the sh git runs GIT_SSH_COMMAND with and
# the bash ($SHELL) ssh runs its ProxyCommand with: no Python, and no lnk-connect (the box's)
COMMANDS = ("git", "/usr/lib/git-core/git", "ssh", "sh", "bash", "cat")


@dataclass
class GitServer:
    root: Path
    repo: Path
    log: Path
    owner: Owner
    work: Path

    def connections(self, address: str) -> int:
        """Connections sshd accepted on `address` (LogLevel VERBOSE logs each one)."""
        lines = self.log.read_text(errors="replace").splitlines()
        hit = f" on {address} port {SSH_PORT}"
        return sum(1 for line in lines if line.startswith("Connection from ") and hit in line)


@pytest.fixture(scope="module")
def box(internet: TestInternet) -> Iterator[Any]:
    with _private_box(proxy_config=proxy_config(internet)) as private:
        yield private


def _wait_listening(addresses: list[str], process: subprocess.Popen[bytes], log: Path) -> None:
    """Until sshd's log says it listens on each address (no probe: its connection would be
    logged too, later than any count a test takes first)."""
    deadline = time.monotonic() + START_S
    wanted = [f"Server listening on {address} port {SSH_PORT}." for address in addresses]
    while not all(line in log.read_text(errors="replace") for line in wanted):
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the test sshd did not start: {log.read_text()}")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def server(internet: TestInternet) -> Iterator[GitServer]:
    """A box user of its own (its ~/.ssh holds a real key and the hosts' keys), a bare
    repository it owns, and sshd on port 22 of both public hosts, in their namespace."""
    owner = _make_owner()
    root = Path(tempfile.mkdtemp(prefix="lnk-gitssh-", dir="/srv"))
    process: subprocess.Popen[bytes] | None = None
    try:
        root.chmod(0o755)
        subprocess.run(["usermod", "-p", "*", owner.name], check=True)  # not locked: sshd
        host_key = root / "host_ed25519"
        keygen = ["ssh-keygen", "-q", "-t", "ed25519", "-N", ""]
        subprocess.run([*keygen, "-f", str(host_key)], check=True)
        ssh_dir = owner.home / ".ssh"
        (ssh_dir / "id_ed25519").unlink()  # the session's bait: a real key here instead
        subprocess.run([*keygen, "-C", "sandbox", "-f", str(ssh_dir / "id_ed25519")], check=True)
        public = (ssh_dir / "id_ed25519.pub").read_text()
        (root / "authorized_keys").write_text(public)
        host_public = host_key.with_suffix(".pub").read_text().split()[:2]
        (ssh_dir / "known_hosts").write_text(
            "".join(f"{name} {' '.join(host_public)}\n" for name in (WWW, OTHER))
        )
        repo, seed, work = root / "repo.git", root / "seed", root / f"work-{owner.name}"
        git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
        subprocess.run([*git, "init", "-q", str(seed)], check=True)
        (seed / "readme.txt").write_text("over ssh\n")
        subprocess.run([*git, "-C", str(seed), "add", "readme.txt"], check=True)
        subprocess.run([*git, "-C", str(seed), "commit", "-q", "-m", MESSAGE], check=True)
        subprocess.run([*git, "clone", "-q", "--bare", str(seed), str(repo)], check=True)
        work.mkdir()
        for path in (ssh_dir, repo, work):
            subprocess.run(["chown", "-R", f"{owner.uid}:{owner.gid}", str(path)], check=True)
        log, config = root / "sshd.log", root / "sshd_config"
        config.write_text(
            f"ListenAddress {internet.www.address}:{SSH_PORT}\n"
            f"ListenAddress {internet.other.address}:{SSH_PORT}\n"
            f"HostKey {host_key}\n"
            f"PidFile {root / 'sshd.pid'}\n"
            f"AuthorizedKeysFile {root / 'authorized_keys'}\n"
            f"AllowUsers {owner.name}\n"
            "UsePAM no\n"
            "StrictModes no\n"  # the authorized keys are root's, in /srv
            "PubkeyAuthentication yes\n"
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            "LogLevel VERBOSE\n"  # a line per accepted connection, with the address it hit
        )
        with open(log, "ab") as out:
            process = subprocess.Popen(
                ["ip", "netns", "exec", internet.www.netns, SSHD, "-D", "-e", "-f", str(config)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,
            )
        _wait_listening([internet.www.address, internet.other.address], process, log)
        yield GitServer(root, repo, log, owner, work)
    finally:
        if process is not None:
            process.terminate()
            try:
                process.wait(timeout=START_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        subprocess.run(["userdel", "-r", owner.name], capture_output=True, check=False)
        shutil.rmtree(root, ignore_errors=True)


def _run(box: Any, server: GitServer, *flags: str, script: str) -> subprocess.CompletedProcess[str]:
    owner = server.owner
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(owner.home),
        "USER": owner.name,
        "LANG": "C.UTF-8",
        **{k: v for k, v in box.env.items() if k.startswith("LNK_")},
    }
    commands = [f"--command={c}" for c in COMMANDS]
    argv = ["sandbox", "run", "--yes", *commands, f"--write={server.work}", *flags]
    return subprocess.run(
        as_user(owner.uid, owner.gid, str(LNK), *argv, "--", "/bin/sh", "-c", script),
        env=env,
        cwd=str(server.work),
        stdin=subprocess.DEVNULL,  # no terminal: a host key prompt could not be answered
        capture_output=True,
        text=True,
        timeout=RUN_S,
        check=False,
    )


def _wire(box: Any) -> list[dict[str, Any]]:
    lines = []
    for path in sorted((Path(box.state_dir) / "wire").rglob("*.log")):
        lines += [json.loads(line) for line in path.read_text().splitlines() if line]
    return lines


def _grants(server: GitServer) -> tuple[str, ...]:
    ssh_dir = server.owner.home / ".ssh"
    return (f"--read={ssh_dir / 'known_hosts'}", f"--read={ssh_dir / 'id_ed25519'}")


def test_git_clone_over_ssh_reaches_a_host_listed_with_22(
    box: Any, server: GitServer, internet: TestInternet
) -> None:
    before = server.connections(internet.www.address)
    user = server.owner.name
    script = (
        f"git clone -q ssh://{user}@{WWW}{server.repo} url && "
        f"git clone -q {user}@{WWW}:{server.repo} scp && "
        "git -C url log --format=%s && cat scp/readme.txt"
    )
    run = _run(box, server, f"--internet-host={WWW}:22", *_grants(server), script=script)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.splitlines() == [MESSAGE, "over ssh"]
    # what the sandbox cloned is the owner's, outside
    clone = server.work / "url" / "readme.txt"
    assert clone.read_text() == "over ssh\n" and clone.stat().st_uid == server.owner.uid
    assert server.connections(internet.www.address) == before + 2
    assert f"Accepted publickey for {user}" in server.log.read_text()
    tunnels = [w for w in _wire(box) if w.get("target") == f"{WWW}:22"]
    assert len(tunnels) >= 2, tunnels
    assert all(
        w["method"] == "CONNECT" and w["decision"] == "allowed" and w["rule"] == "allowed-internet"
        for w in tunnels
    ), tunnels
    assert all(w["up"] > 0 and w["down"] > 0 for w in tunnels), tunnels  # the tunnel's bytes


@pytest.mark.parametrize(
    ("listed", "host", "rule"),
    [
        pytest.param(f"{WWW}:22", OTHER, "not-listed", id="unlisted-host"),
        pytest.param(WWW, WWW, "port-not-listed", id="listed-without-22"),
        pytest.param("*", WWW, "port-not-listed", id="star"),
    ],
)
def test_ssh_where_the_spec_does_not_list_host_22_is_refused_and_reaches_nothing(
    box: Any, server: GitServer, internet: TestInternet, listed: str, host: str, rule: str
) -> None:
    address = internet.host(host).address
    before = server.connections(address)
    wire_before = _wire(box)
    target = server.work / f"refused-{secrets.token_hex(4)}"
    script = f"git clone -q ssh://{server.owner.name}@{host}{server.repo} {target}"
    run = _run(box, server, f"--internet-host={listed}", *_grants(server), script=script)
    assert run.returncode != 0, run.stdout + run.stderr
    assert f"lnk: refused ({rule})" in run.stderr, run.stderr  # lnk-connect says the rule
    assert server.connections(address) == before  # sshd saw no connection at all
    assert not target.exists()
    new = [w for w in _wire(box) if w not in wire_before]  # each file is one sandbox's
    refused = [w for w in new if w.get("target") == f"{host}:22"]
    assert [(w["decision"], w["rule"]) for w in refused] == [("refused", rule)], refused


def test_without_a_known_hosts_grant_ssh_refuses_the_host_without_asking(
    box: Any, server: GitServer
) -> None:
    ssh_dir = server.owner.home / ".ssh"
    target = server.work / "unknown-host"
    script = f"git clone -q ssh://{server.owner.name}@{WWW}{server.repo} {target}"
    key_only = f"--read={ssh_dir / 'id_ed25519'}"
    run = _run(box, server, f"--internet-host={WWW}:22", key_only, script=script)
    assert run.returncode != 0
    assert "Host key verification failed" in run.stderr, run.stderr
    assert "continue connecting" not in run.stderr  # never a prompt
    assert not target.exists()
    assert not os.path.exists(server.work / "unknown-host" / ".git")


def test_the_readmes_git_over_ssh_line_runs_as_written(
    box: Any, server: GitServer, internet: TestInternet
) -> None:
    """README.md's usage line, the test sshd standing in for github.com (its repository for
    you/repo.git), answered "y" on a pty as a user would."""
    (line,) = [line for line in usage_lines() if "git clone" in line]
    user, repo = server.owner.name, server.repo
    argv = [
        arg.replace("git@github.com:you/repo.git", f"{user}@{WWW}:{repo}").replace(
            "github.com", WWW
        )
        for arg in shlex.split(line)
    ]
    assert argv[0] == "lnk" and f"{WWW}:22" in argv, argv
    argv[0] = str(LNK)
    folder = server.work / f"readme-{secrets.token_hex(3)}"
    folder.mkdir()
    os.chown(folder, server.owner.uid, server.owner.gid)
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(server.owner.home),
        "USER": user,
        "LANG": "C.UTF-8",
        **{k: v for k, v in box.env.items() if k.startswith("LNK_")},
    }
    command = as_user(server.owner.uid, server.owner.gid, *argv)
    status, screen = answer_on_pty(command, "y", env=env, cwd=folder)
    assert status == 0, screen.decode(errors="replace")
    assert (folder / "repo" / "readme.txt").read_text() == "over ssh\n"
    assert "lnk-connect (granted by the box with a proxy" in screen.decode(errors="replace")


def test_spec_show_names_the_connector_as_the_boxs_grant_only_with_a_proxy(
    box: Any, server: GitServer
) -> None:
    owner, connector = server.owner, str(LNK.parent / "lnk-connect")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(owner.home), "LANG": "C.UTF-8", **box.env}
    shown = {}
    for flags in ([f"--internet-host={WWW}:22"], [f"--read={server.work}"]):
        argv = as_user(owner.uid, owner.gid, str(LNK), "spec", "show", "--json", *flags)
        done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr
        shown[flags[0]] = json.loads(done.stdout)["granted_by_the_box"]["with_a_proxy"]
    assert shown == {f"--internet-host={WWW}:22": [connector], f"--read={server.work}": []}


def _ssh_check(running_box: RunningBox, box: Any) -> tuple[int, dict[str, Any], str, str]:
    code, doc, stderr = run_check(
        running_box, f"--internet-host={WWW}", private=box, timeout=CHECK_TIMEOUT_S
    )
    wire = (box.state_dir / "wire" / f"{doc.get('sandbox')}.log").read_text()
    found = {p["id"]: p for p in doc["probes"] if p["id"] in (UNLISTED, BARE)}
    assert set(found) == {UNLISTED, BARE}, stderr
    return code, {i: p["verdict"] for i, p in found.items()}, wire, stderr


def test_check_refuses_ssh_off_the_list_and_leaks_it_when_the_switch_reopens_it(
    running_box: RunningBox, box: Any, internet: TestInternet
) -> None:
    _, verdicts, wire, stderr = _ssh_check(running_box, box)
    assert verdicts == {UNLISTED: "refused", BARE: "refused"}, stderr
    assert '"rule":"port-not-listed"' in wire and f'"target":"{WWW}:22"' in wire
    unsafe_config = proxy_config(internet, "unsafe_ssh_port_by_any_entry = true")
    with _private_box(proxy_config=unsafe_config) as unsafe:
        code, verdicts, wire, stderr = _ssh_check(running_box, unsafe)
        proxy_log = (unsafe.state_dir / "logs" / "proxy.log").read_text(errors="replace")
    assert verdicts == {UNLISTED: "refused", BARE: "leaked"}, stderr  # unlisted: still refused
    assert code != 0
    assert f'"target":"{WWW}:22"' in wire and '"decision":"allowed"' in wire
    assert "unsafe_ssh_port_by_any_entry" in proxy_log  # the switch warns
