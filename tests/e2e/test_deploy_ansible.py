"""The Ansible role (deploy/ansible) deploys a box onto THIS machine over real SSH, into private
folders with names of its own (`deploy_box.DeployedBox`), and the box works: lint, unit
verification, a converge then a second run with nothing changed, `--check --diff` quiet, the
permissions, the services running as their units say, a sandbox confined, the proxy filtering,
and an upgrade to a newer wheel that restarts each service once and migrates the database.

One box is converged for the whole module; everything it made (folders, units, users, services,
sshd) is removed after, even when a test or the converge fails. systemd is not PID 1 here (as in
CI): the role's handlers start each service from its rendered unit through the restart hook.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import sqlite3
import stat
import subprocess
import tomllib
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from as_user import as_user
from deploy_box import PLAYBOOK_DIR, DeployedBox, PlaybookRun, find_tool
from deploy_sshd import RootSshd
from deploy_wheel import (
    CHECKOUT,
    PROBE_REVISION,
    PROBE_TABLE,
    build_wheel,
    head_revision,
    project_version,
)
from net import OTHER, WWW, TestInternet

pytestmark = [pytest.mark.needs_root, pytest.mark.e2e]

TOOLS = ("ansible-playbook", "ansible-lint", "yamllint")


def _tool(name: str) -> str:
    """The tool's path; outside CI a missing tool skips (say how to get it), under CI it fails."""
    path = find_tool(name)
    if path is None:
        reason = f"{name} is missing: pip install '.[deploy]' (scripts/install does)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    return path


def _tool_env(tool: str) -> dict[str, str]:
    """The environment with the tool's own folder first on PATH: ansible-lint runs ansible's
    other commands, which live next to it (in the venv of the deploy extra)."""
    return {**os.environ, "PATH": f"{Path(tool).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"}


@dataclass
class Owner:
    """A real unprivileged user of the deployed box, with bait in a home only it reads."""

    name: str
    uid: int
    gid: int
    home: Path
    secret: str


@dataclass
class Deployment:
    box: DeployedBox
    sshd: RootSshd
    wheel: Path
    converge: PlaybookRun
    owner: Owner
    internet: TestInternet
    upgrade_wheel: Future[Path]  # built while the converge runs (the upgrade test's)

    def lnk_as_owner(self, *args: str) -> subprocess.CompletedProcess[str]:
        """The DEPLOYED `lnk` (its own prefix), as the owner, pointed at the deployed box."""
        return subprocess.run(
            as_user(self.owner.uid, self.owner.gid, str(self.box.venv / "bin" / "lnk"), *args),
            env={
                "PATH": "/usr/local/bin:/usr/bin:/bin",
                "HOME": str(self.owner.home),
                "USER": self.owner.name,
                "LANG": "C.UTF-8",
                **self.box.env(),
            },
            cwd=str(self.owner.home),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )


def _make_owner() -> Owner:
    name = "lnkdo" + secrets.token_hex(3)
    subprocess.run(["useradd", "-m", "-s", "/bin/sh", "-K", "UID_MIN=1500", name], check=True)
    entry = pwd.getpwnam(name)
    home = Path(entry.pw_dir)
    secret = secrets.token_hex(16)
    (home / "secret.txt").write_text(f"{secret}\n")
    (home / "project").mkdir()
    (home / "project" / "readme.txt").write_text("hello deployed box\n")
    subprocess.run(["chown", "-R", f"{entry.pw_uid}:{entry.pw_gid}", str(home)], check=True)
    home.chmod(0o700)
    return Owner(name, entry.pw_uid, entry.pw_gid, home, secret)


@pytest.fixture(scope="module")
def deployed() -> Iterator[Deployment]:
    if os.geteuid() != 0:
        pytest.skip("needs root: deploys a box (users, units, services) on this machine")
    _tool("ansible-playbook")
    with TestInternet() as internet:
        box = DeployedBox(
            proxy_settings={
                "unsafe_public_networks": [str(internet.public_subnet)],
                "unsafe_dns_table": str(internet.dns_file),
            }
        )
        box.work.mkdir(mode=0o700)
        sshd = RootSshd(box.work / "sshd")
        owner = None
        # The upgrade's wheel (a compile of its own) is built beside the converge, which mostly
        # waits on Ansible and pip, instead of in the upgrade test; in a folder of its own, as
        # build_wheel finds the wheel it made by what is new in its folder.
        builder = ThreadPoolExecutor(max_workers=1)
        try:
            owner = _make_owner()
            wheel = build_wheel(box.work / "wheels", box.work / "build")
            newer = builder.submit(
                build_wheel, box.work / "wheels-upgrade", box.work / "build", upgrade=True
            )
            sshd.start()
            box.prepare(sshd)
            converge = box.playbook(wheel)
            assert converge.ok, converge.failure()
            box.start_box_sshd()
            yield Deployment(box, sshd, wheel, converge, owner, internet, newer)
        finally:
            builder.shutdown(wait=True)  # before cleanup removes the folder it builds in
            problems = box.cleanup(sshd)
            if owner is not None:
                subprocess.run(["userdel", "-r", owner.name], capture_output=True, check=False)
            assert not problems, problems


# -- lint (no box needed) ----------------------------------------------------------------------


def test_yamllint_passes() -> None:
    yamllint = _tool("yamllint")
    result = subprocess.run(
        [yamllint, "--strict", "."],
        cwd=PLAYBOOK_DIR,
        env=_tool_env(yamllint),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_ansible_lint_production_profile_strict_passes(tmp_path: Path) -> None:
    lint = _tool("ansible-lint")
    result = subprocess.run(
        [lint, "--offline", "--profile", "production", "--strict", "--nocolor"],
        cwd=PLAYBOOK_DIR,
        env={**_tool_env(lint), "HOME": str(tmp_path), "ANSIBLE_HOME": str(tmp_path / "ansible")},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Profile 'production' was required, and it passed" in result.stdout + result.stderr


def test_playbook_syntax_check_passes(tmp_path: Path) -> None:
    playbook = _tool("ansible-playbook")
    result = subprocess.run(
        [playbook, "--syntax-check", "-i", "inventory/example.yml", "site.yml"],
        cwd=PLAYBOOK_DIR,
        env={**_tool_env(playbook), "ANSIBLE_HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# -- the converged box -------------------------------------------------------------------------


def test_converge_made_the_box(deployed: Deployment) -> None:
    stats = deployed.converge.stats()
    assert stats["failed"] == 0 and stats["unreachable"] == 0
    assert stats["changed"] > 0, "a fresh box was changed"
    assert deployed.box.services.restarts() == dict.fromkeys(deployed.box.service_names, 1)


def test_the_role_puts_lnk_on_path_and_only_the_runtime_in_the_venv(deployed: Deployment) -> None:
    link = deployed.box.bin_link
    assert link.is_symlink() and link.resolve() == (deployed.box.venv / "bin" / "lnk").resolve()
    version = subprocess.run(
        ["lnk", "--version"],
        env={"PATH": f"{link.parent}:/usr/bin:/bin", "LANG": "C.UTF-8"},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert version.returncode == 0 and version.stdout.startswith("lnk "), version
    python = str(deployed.box.venv / "bin" / "python")
    for module in ("pytest", "ruff", "mypy", "ansible", "bin"):
        imported = subprocess.run(
            [python, "-c", f"import {module}"], capture_output=True, check=False
        )
        assert imported.returncode != 0, f"the deployed venv imports {module}"
    # the proxy's C pass over model bodies (setup.py's extension) is in the wheel and loads
    scan = subprocess.run(
        [python, "-c", "import lnk_proxy._json_scan"], capture_output=True, check=False
    )
    assert scan.returncode == 0, scan.stderr


@pytest.fixture(scope="module")
def rerun(deployed: Deployment) -> dict[str, PlaybookRun]:
    """A second run and a `--check --diff` run on the converged box, side by side: neither
    changes anything (if one did, both tests fail), and together they take the time of one."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        second = pool.submit(deployed.box.playbook, deployed.wheel)
        check = pool.submit(deployed.box.playbook, deployed.wheel, "--check", "--diff")
        return {"second": second.result(), "check": check.result()}


def test_a_second_run_changes_nothing(rerun: dict[str, PlaybookRun]) -> None:
    run = rerun["second"]
    assert run.ok, run.failure()
    assert run.stats()["changed"] == 0, run.changed_tasks()
    assert run.changed_tasks() == []


def test_check_diff_on_a_converged_box_reports_no_change(rerun: dict[str, PlaybookRun]) -> None:
    run = rerun["check"]
    assert run.ok, run.failure()
    assert run.stats()["changed"] == 0, run.changed_tasks()
    assert "--- before" not in run.result.stdout


def test_rendered_units_pass_systemd_analyze_verify(deployed: Deployment) -> None:
    units = sorted(deployed.box.unit_dir.glob("*.service"))
    assert [u.name for u in units] == sorted(f"{n}.service" for n in deployed.box.service_names)
    result = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", *map(str, units)],
        env={"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "SYSTEMD_LOG_LEVEL": "notice"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    ours = [line for line in result.stderr.splitlines() if "lnk-dt-" in line]
    assert not ours, ours


def _unsafe_bits(path: Path) -> list[str]:
    """Entries under `path` (itself included) not root's or writable by group or other."""
    found = []
    for folder, dirs, files in os.walk(path):
        for name in [".", *dirs, *files]:
            entry = Path(folder) / name
            info = entry.lstat()
            if stat.S_ISLNK(info.st_mode):
                continue
            if info.st_uid != 0 or info.st_gid != 0 or info.st_mode & 0o022:
                found.append(f"{entry} {info.st_uid}:{info.st_gid} {oct(info.st_mode)}")
    return found


def test_venv_units_and_config_are_roots_with_no_group_or_other_write(
    deployed: Deployment,
) -> None:
    box = deployed.box
    assert _unsafe_bits(box.prefix) == []
    assert _unsafe_bits(box.config_dir) == []
    assert _unsafe_bits(box.unit_dir) == []
    for path in (*box.unit_dir.rglob("*"), *box.config_dir.rglob("*")):
        mode = 0o755 if path.is_dir() else 0o644
        assert stat.S_IMODE(path.stat().st_mode) == mode, path
    python = (box.venv / "bin" / "python").resolve()
    assert python == Path("/usr/bin/python3").resolve(), "the venv is Debian's Python's"


def test_state_and_run_folders_have_their_owners_and_modes(deployed: Deployment) -> None:
    box = deployed.box
    proxy_uid = pwd.getpwnam(box.proxy_user).pw_uid
    bridge_uid = pwd.getpwnam(box.bridge_store_user).pw_uid
    expected = {
        box.state_dir: (0, 0o755),
        box.state_dir / "homes": (0, 0o711),
        box.state_dir / "wire": (proxy_uid, 0o750),
        box.run_dir: (0, 0o755),
        box.run_dir / "flags": (0, 0o755),
        box.run_dir / "proxy": (proxy_uid, 0o700),
        box.state_dir / "bridge-store": (bridge_uid, 0o700),
        box.run_dir / "bridge-store": (bridge_uid, 0o700),
    }
    found = {p: (p.stat().st_uid, stat.S_IMODE(p.stat().st_mode)) for p in expected}
    assert found == expected


def test_the_services_users_are_system_users_with_no_login(deployed: Deployment) -> None:
    entries = [pwd.getpwnam(u) for u in (deployed.box.proxy_user, deployed.box.bridge_store_user)]
    assert all(0 < e.pw_uid < 1000 for e in entries)
    assert entries[0].pw_uid != entries[1].pw_uid
    assert {(e.pw_shell, e.pw_dir) for e in entries} == {("/usr/sbin/nologin", "/nonexistent")}


def _status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


def test_each_service_runs_as_its_unit_says(deployed: Deployment) -> None:
    box = deployed.box
    pids = [box.services.pid(name) for name in box.service_names]
    assert all(pids)
    proxy, bridge, controller = (_status(pid) for pid in pids if pid)
    for status, user in ((proxy, box.proxy_user), (bridge, box.bridge_store_user)):
        assert status["Uid"].split() == [str(pwd.getpwnam(user).pw_uid)] * 4
        assert status["Groups"].strip() == ""
        assert status["NoNewPrivs"] == "1" and status["Umask"] == "0077"
    assert controller["Uid"].split() == ["0"] * 4
    assert controller["NoNewPrivs"] == "1"
    assert controller["Umask"] == "0022", "the controller sets its own umask for what it makes"
    argv = Path(f"/proc/{pids[0]}/cmdline").read_bytes().split(b"\0")
    assert argv[0] == str(box.venv / "bin" / "python").encode()


# -- the deployed box at work ------------------------------------------------------------------


def test_a_sandbox_of_the_deployed_box_runs_a_granted_read(deployed: Deployment) -> None:
    project = deployed.owner.home / "project"
    result = deployed.lnk_as_owner(
        "sandbox",
        "run",
        "--yes",
        f"--read={project}",
        "--command=cat",
        "--",
        "cat",
        f"{project}/readme.txt",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "hello deployed box\n"


def test_a_sandbox_of_the_deployed_box_cannot_read_the_owners_home(
    deployed: Deployment,
) -> None:
    owner = deployed.owner
    result = deployed.lnk_as_owner(
        "sandbox",
        "run",
        "--yes",
        f"--read={owner.home / 'project'}",
        "--command=cat",
        "--",
        "cat",
        f"{owner.home}/secret.txt",
    )
    assert result.returncode != 0
    assert owner.secret not in result.stdout + result.stderr
    assert deployed.box.sandbox_users() == [], "each sandbox's user is gone when it ends"


def test_the_deployed_box_checks_a_sandbox_with_no_grants_as_closed(deployed: Deployment) -> None:
    result = deployed.lnk_as_owner("sandbox", "check", "--json")
    assert result.returncode == 0, result.stderr
    probes = json.loads(result.stdout)["probes"]
    assert len(probes) > 20  # every family of probes ran
    verdicts = {p["id"]: p["verdict"] for p in probes}
    assert "leaked" not in verdicts.values(), verdicts
    # Only the wall's documented gap (the ELF loader mapping an ungranted /usr program).
    assert {i for i, v in verdicts.items() if v != "refused"} <= {"exec:loader"}, verdicts


def _curl_in_sandbox(deployed: Deployment, url: str) -> subprocess.CompletedProcess[str]:
    return deployed.lnk_as_owner(
        "sandbox",
        "run",
        "--yes",
        f"--internet-host={WWW}",
        "--command=curl",
        "--",
        "curl",
        "-sS",
        "--max-time",
        "10",
        "-w",
        "%{http_code}",
        url,
    )


def test_the_deployed_proxy_lets_a_listed_host_through(deployed: Deployment) -> None:
    internet = deployed.internet
    before = internet.accepted(internet.www)
    result = _curl_in_sandbox(deployed, f"http://{WWW}/")
    assert result.returncode == 0, result.stderr
    assert WWW in result.stdout and result.stdout.endswith("200")
    assert internet.accepted(internet.www) == before + 1


def test_the_deployed_proxy_refuses_an_unlisted_host_and_never_dials_it(
    deployed: Deployment,
) -> None:
    internet = deployed.internet
    before = internet.accepted(internet.other)
    result = _curl_in_sandbox(deployed, f"http://{OTHER}/")
    assert "403" in result.stdout and "not-listed" in result.stdout
    assert internet.accepted(internet.other) == before


# -- the SSH gate of the deployed box -----------------------------------------------------------


def test_the_gate_line_is_roots_and_the_box_users_shell_is_sh(deployed: Deployment) -> None:
    box = deployed.box
    path = box.keys_dir / box.box_user
    info = path.stat()
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (0, 0, 0o644)
    (line,) = path.read_text().splitlines()
    from lnk_shared.accounts import home_token, prove_account

    user = pwd.getpwnam(box.box_user)
    proof = prove_account(user.pw_uid)
    assert proof is not None
    assert line.startswith(
        f'restrict,pty,command="{box.venv}/bin/lnk sandbox enter '
        f"--spec {box.config_dir}/users/{box.box_user}.toml --folder {box.gate_folder} "
        f'--run-dir {box.run_dir} --account {home_token(user.pw_uid, proof)}" ssh-ed25519 '
    )
    assert pwd.getpwnam(box.box_user).pw_shell == "/bin/sh"
    assert (box.dropin_dir / "50-lnk-gate.conf").read_text().count(f"{box.keys_dir}/%u") == 1


def test_the_role_turned_off_user_readenv_in_sshds_pam_stack(deployed: Deployment) -> None:
    text = deployed.box.pam_file.read_text()
    assert "user_readenv=1" not in text and "user_readenv=0" in text


def test_a_gate_session_runs_in_a_sandbox_of_the_deployed_box(deployed: Deployment) -> None:
    box = deployed.box
    result = box.ssh_as_box_user(f"id -u; touch {box.gate_folder}/from-ssh")
    assert result.returncode == 0, result.stderr
    uid = int(result.stdout.split()[0])
    assert box.uid_first <= uid <= box.uid_last, "a fresh sandbox user of this box's range"
    assert (box.gate_folder / "from-ssh").exists(), "its one folder is written"


def test_a_gate_session_cannot_read_the_box_users_home(deployed: Deployment) -> None:
    box = deployed.box
    entry = pwd.getpwnam(box.box_user)
    secret = secrets.token_hex(16)
    bait = Path(entry.pw_dir) / "bait.txt"
    bait.write_text(f"{secret}\n")
    os.chown(bait, entry.pw_uid, entry.pw_gid)
    bait.chmod(0o600)
    result = box.ssh_as_box_user(f"cat {bait}")
    assert result.returncode != 0
    assert secret not in result.stdout + result.stderr


def test_a_broken_sshd_setting_fails_validation_and_changes_nothing(
    deployed: Deployment,
) -> None:
    box = deployed.box
    dropin = box.dropin_dir / "50-lnk-gate.conf"
    before = dropin.read_bytes()
    run = box.playbook(
        deployed.wheel,
        "--tags",
        "lnk_box_gate",
        extra={"lnk_box_ssh_keys_dir": f"{box.keys_dir}\nNoSuchOption yes"},
    )
    assert not run.ok
    assert "sshd refuses the config" in run.result.stdout, run.failure()
    assert dropin.read_bytes() == before
    assert sorted(p.name for p in box.dropin_dir.iterdir()) == ["50-lnk-gate.conf"]
    assert box.box_sshd is not None and box.box_sshd.poll() is None
    again = box.ssh_as_box_user("id -u")
    assert again.returncode == 0, again.stderr


# -- the upgrade (last: it changes the box) ----------------------------------------------------


def _installed_version(box: DeployedBox) -> str:
    return subprocess.run(
        [
            str(box.venv / "bin" / "python"),
            "-I",
            "-c",
            "import importlib.metadata as m; print(m.version('lnk-box'))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def _passwd_names(tag: str) -> list[str]:
    """This box's users in /etc/passwd (other tests make and remove users of their own)."""
    with open("/etc/passwd", encoding="utf-8") as f:
        return [name for name in (line.split(":", 1)[0] for line in f) if tag in name]


def test_an_upgrade_restarts_each_service_once_and_migrates_the_database(
    deployed: Deployment,
) -> None:
    box = deployed.box
    before = box.services.restarts()
    pids = {name: box.services.pid(name) for name in before}
    users_before = _passwd_names(box.tag)
    assert sorted(users_before) == sorted([box.proxy_user, box.bridge_store_user, box.box_user])
    newer = deployed.upgrade_wheel.result()

    run = box.playbook(newer)

    assert run.ok, run.failure()
    after = box.services.restarts()
    assert {name: after[name] - before[name] for name in after} == dict.fromkeys(
        box.service_names, 1
    )
    assert all(box.services.pid(name) not in (None, pid) for name, pid in pids.items())
    assert _installed_version(box) == f"{project_version()}.post1"
    with sqlite3.connect(box.state_dir / "controller.db") as db:
        assert db.execute("SELECT version_num FROM alembic_version").fetchall() == [
            (PROBE_REVISION,)
        ]
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master")}
    assert PROBE_TABLE in tables and "sandboxes" in tables
    bridge_versions = CHECKOUT / "services/bridge-store/lnk_bridge_store/migrations/versions"
    with sqlite3.connect(box.state_dir / "bridge-store" / "store.db") as db:
        assert db.execute("SELECT version_num FROM alembic_version").fetchall() == [
            (head_revision(bridge_versions),)
        ]
    # Nothing orphaned: no user made or left, only the services' own sockets, one staging mount.
    assert _passwd_names(box.tag) == users_before
    assert box.sandbox_users() == []
    assert [p.relative_to(box.run_dir) for p in box.sockets()] == sorted(
        Path(p)
        for p in ("bridge-store/admin.sock", "controller.sock", "launch.sock", "proxy/admin.sock")
    )
    assert box.mounts() in ([], [str(box.run_dir / "sandboxes")])


def test_the_role_writes_the_box_limits_and_delegates_their_controllers(
    deployed: Deployment,
) -> None:
    box = deployed.box
    config = tomllib.loads((box.config_dir / "controller.toml").read_text())
    assert config["limits"] == {  # the role's defaults (defaults/main.yml)
        "processes": 512,
        "memory_mb": 1024,
        "cpu_percent": 100,
        "open_files": 1024,
        "owner_sandboxes": 8,
        "owner_memory_mb": 4096,
        "reserve_memory_mb": 512,
        "favordynmods": True,
    }
    assert (config["tmp_size_mb"], config["max_lease_seconds"]) == (256, 7 * 24 * 3600)
    unit = next(box.unit_dir.glob("*controller*.service")).read_text()
    assert "\nDelegate=pids memory cpu\n" in unit
    for name in ("controller", "proxy", "bridge-store"):  # below every sandbox, OOM killer's
        service = next(box.unit_dir.glob(f"*{name}.service"))
        assert "\nOOMScoreAdjust=-500\n" in service.read_text(), service
