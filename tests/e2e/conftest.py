"""End-to-end fixtures: the installed `lnk` (from the prefix scripts/install made), real
services, real users.

`box`: a box whose state lives in a temp dir, not started (for `lnk spec` tests).
`running_box`: the box's services started with `lnk box up` on private run/state dirs, and a
real unprivileged owner user with a home holding bait; everything is stopped and removed after,
and the test fails if a sandbox user, mount or staging dir is left behind.
`private_box`: a box of its own, for a test that changes its config or breaks it.
`internet`: the test internet (net.py), one per module; `netbox`: a private box whose proxy sees
it as the only one; `ca_dir`: its CA in a folder a sandbox may read (internet_box.py).
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import signal
import subprocess
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, closing, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from as_user import as_user
from box_teardown import end_box
from internet_box import ca_folder, proxy_config
from net import TestInternet

PREFIX = Path(os.environ.get("LNK_PREFIX", "/opt/lnk"))
LNK = PREFIX / "venv" / "bin" / "lnk"
SANDBOX_USER_PREFIX = "lnk-sbx-"
UID_BLOCKS_START = 2_001_000_000  # above the default range a real box on this machine uses
UID_BLOCK = 1000  # uids per test box
UID_BLOCKS = 100_000  # blocks to pick from: all below 2**31, bwrap's limit


@dataclass
class Box:
    env: dict[str, str]
    root: Path
    lnk_path: Path = LNK

    def lnk(self, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(LNK), *args],
            env=self.env,
            input=input,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )


@pytest.fixture
def box(tmp_path: Path) -> Box:
    if not LNK.exists():
        pytest.fail(f"{LNK} is missing: run scripts/install first")
    root = tmp_path / "box"
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
        "HOME": os.environ.get("HOME", "/root"),
        "LNK_CONFIG_DIR": str(root / "etc"),
        "LNK_STATE_DIR": str(root / "state"),
        "LNK_RUN_DIR": str(root / "run"),
        "LANG": "C.UTF-8",
    }
    return Box(env=env, root=root)


@dataclass
class Owner:
    """A real unprivileged host user who owns specs and folders, like a box's user."""

    name: str
    uid: int
    gid: int
    home: Path
    secret: str


@dataclass
class RunningBox:
    env: dict[str, str]
    run_dir: Path
    state_dir: Path
    owner: Owner
    extra_env: dict[str, str] = field(default_factory=dict)

    def owner_env(self) -> dict[str, str]:
        return {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(self.owner.home),
            "USER": self.owner.name,
            "LANG": "C.UTF-8",
            "LNK_RUN_DIR": str(self.run_dir),
            "LNK_STATE_DIR": str(self.state_dir),
            "LNK_CONFIG_DIR": self.env["LNK_CONFIG_DIR"],
            **self.extra_env,
        }

    def as_owner(
        self, *args: str, timeout: float = 60, **kw: object
    ) -> subprocess.CompletedProcess[str]:
        """Run `lnk ARGS` as the owner (setpriv drops root), from the owner's home."""
        argv = as_user(self.owner.uid, self.owner.gid, str(LNK), *args)
        return subprocess.run(
            argv,
            env=self.owner_env(),
            cwd=str(self.owner.home),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            **kw,  # type: ignore[arg-type]
        )

    def run(
        self, *flags: str, cmd: list[str], timeout: float = 60, **kw: object
    ) -> subprocess.CompletedProcess[str]:
        """`lnk sandbox run --yes FLAGS -- CMD` as the owner."""
        return self.as_owner("sandbox", "run", "--yes", *flags, "--", *cmd, timeout=timeout, **kw)

    def sh(self, script: str, *flags: str, **kw: object) -> subprocess.CompletedProcess[str]:
        """A /bin/sh script in a sandbox; the usual tools granted unless flags say otherwise."""
        tools = [
            f"--command={c}"
            for c in (
                "cat",
                "ls",
                "id",
                "touch",
                "cp",
                "ln",
                "mv",
                "rm",
                "mkdir",
                "grep",
                "head",
                "sleep",
                "python3",
            )
        ]
        return self.run(*tools, *flags, cmd=["/bin/sh", "-c", script], **kw)


def _make_owner() -> Owner:
    name = "lnkt" + secrets.token_hex(3)
    subprocess.run(["useradd", "-m", "-s", "/bin/bash", "-K", "UID_MIN=1500", name], check=True)
    entry = pwd.getpwnam(name)
    home = Path(entry.pw_dir)
    secret = secrets.token_hex(16)
    (home / ".ssh").mkdir(mode=0o700)
    (home / ".ssh" / "id_ed25519").write_text(f"KEY {secret}\n")
    (home / "secret.txt").write_text(f"{secret}\n")
    (home / "project" / "out").mkdir(parents=True)
    (home / "project" / "readme.txt").write_text("hello project\n")
    (home / "project" / ".git" / "hooks").mkdir(parents=True)
    subprocess.run(["chown", "-R", f"{entry.pw_uid}:{entry.pw_gid}", str(home)], check=True)
    os.chmod(home, 0o700)
    return Owner(name, entry.pw_uid, entry.pw_gid, home, secret)


def _leftovers(first: int, last: int) -> list[str]:
    """Sandbox users and groups of this box's uid block still in /etc."""
    found = []
    for path, kind in (("/etc/passwd", "user"), ("/etc/group", "group")):
        with open(path, encoding="utf-8") as f:
            for line in f:
                fields = line.split(":")
                if fields[0].startswith(SANDBOX_USER_PREFIX) and first <= int(fields[2]) <= last:
                    found.append(f"{kind} {fields[0]}")
    return found


@pytest.fixture(scope="session")
def running_box() -> Iterator[RunningBox]:
    if os.geteuid() != 0:
        pytest.skip("needs root: starts the box's services and makes users")
    if not LNK.exists():
        pytest.fail(f"{LNK} is missing: run scripts/install first")
    tag = secrets.token_hex(4)
    # Outside /tmp/pytest-of-root (0700), so the unprivileged owner can reach the sockets.
    run_dir = Path(f"/run/lnk-test-{tag}")
    state_dir = Path(f"/var/lib/lnk-test-{tag}")
    config_dir = Path(f"/etc/lnk-test-{tag}")
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
        "LNK_RUN_DIR": str(run_dir),
        "LNK_STATE_DIR": str(state_dir),
        "LNK_CONFIG_DIR": str(config_dir),
        "LANG": "C.UTF-8",
    }
    # A uid block of its own, so boxes of other runs on this machine never share (or reconcile
    # away) each other's sandbox users.
    config_dir.mkdir(parents=True)
    first = UID_BLOCKS_START + secrets.randbelow(UID_BLOCKS) * UID_BLOCK
    (config_dir / "controller.toml").write_text(
        f"uid_first = {first}\nuid_last = {first + UID_BLOCK - 1}\n"
    )
    owner = _make_owner()
    before = _leftovers(first, first + UID_BLOCK - 1)
    up = subprocess.run(
        [str(LNK), "box", "up"], env=env, capture_output=True, text=True, check=False
    )
    try:
        if up.returncode != 0:
            log = state_dir / "logs" / "controller.log"
            pytest.fail(
                f"lnk box up failed: {up.stderr}\n{log.read_text() if log.exists() else ''}"
            )
        yield RunningBox(env=env, run_dir=run_dir, state_dir=state_dir, owner=owner)
    finally:
        subprocess.run([str(LNK), "box", "down"], env=env, capture_output=True, check=False)
        left = [u for u in _leftovers(first, first + UID_BLOCK - 1) if u not in before]
        groups = _cgroups_left(state_dir / "controller.db")
        staged = list((run_dir / "sandboxes").iterdir()) if (run_dir / "sandboxes").exists() else []
        ended = end_box(run_dir)  # a service `box down` missed, then every mount under it
        subprocess.run(
            ["umount", "-l", str(run_dir / "sandboxes")], capture_output=True, check=False
        )
        shutil.rmtree(run_dir, ignore_errors=True)
        shutil.rmtree(state_dir, ignore_errors=True)
        shutil.rmtree(config_dir, ignore_errors=True)
        subprocess.run(["userdel", "-r", owner.name], capture_output=True, check=False)
        assert not left, f"sandbox users left behind: {left}"
        assert not staged, f"staging left behind: {staged}"
        assert not groups, f"sandbox cgroups left behind: {groups}"
        assert not ended, f"the box's teardown left: {ended}"


def _cgroups_left(database: Path) -> list[str]:
    """The cgroups of this box's sandboxes (every one it ever recorded) still on the host: its
    v2 group and its limits' v1 groups (the controller was started from this process, so its
    own v1 groups, under which the sandboxes' are, are this process's)."""
    import sqlite3

    from lnk_controller.cgroup_limits import v1_hierarchies
    from lnk_controller.cgroups import group_of

    if not database.exists():
        return []
    with closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as db:
        ids = [row[0] for row in db.execute("SELECT id FROM sandboxes")]
    parents = list(v1_hierarchies().values())
    groups = [group_of(i) for i in ids] + [p / i for p in parents for i in ids]
    return [str(group) for group in groups if group.exists()]


@dataclass
class PrivateBox:
    """A box of its own (never the session's), with its own uid range: a starting controller
    removes the unrecorded users of its range, which would be another box's sandboxes."""

    env: dict[str, str]
    run_dir: Path
    state_dir: Path
    config_dir: Path
    uid_first: int
    uid_last: int

    def lnk(self, *args: str, wrap: Sequence[str] = ()) -> subprocess.CompletedProcess[str]:
        """`lnk ARGS` as root for this box (under the argv prefix `wrap`, when given)."""
        return subprocess.run(
            [*wrap, str(LNK), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def controller_pid(self) -> int:
        return int((self.run_dir / "controller.pid").read_text().strip())

    def user_lines(self) -> list[str]:
        """Sandbox users' and groups' lines of this box's range still in /etc."""
        found = []
        for path in ("/etc/passwd", "/etc/group"):
            with open(path, encoding="utf-8") as f:
                for line in f:
                    uid = line.split(":")[2]
                    ours = uid.isdigit() and self.uid_first <= int(uid) <= self.uid_last
                    if line.startswith(SANDBOX_USER_PREFIX) and ours:
                        found.append(f"{path}: {line.strip()}")
        return found

    def uids(self) -> list[int]:
        return sorted(
            {
                int(line.split(":")[3])
                for line in self.user_lines()
                if line.startswith("/etc/passwd")
            }
        )


_REMOVE_USERS = """
import sys
from lnk_controller import host_users
first, last = int(sys.argv[1]), int(sys.argv[2])
for user in host_users.list_lnk_users():
    if first <= user.uid <= last:
        host_users.remove_user(user)
"""


@contextmanager
def _private_box(
    config: str = "",
    proxy_config: str = "",
    *,
    state_tmpfs_mb: int | None = None,
    services_wrap: Sequence[str] = (),
) -> Iterator[PrivateBox]:
    tag = secrets.token_hex(4)
    first = UID_BLOCKS_START + secrets.randbelow(UID_BLOCKS) * UID_BLOCK
    box = PrivateBox(
        env={
            "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
            "LNK_RUN_DIR": f"/run/lnk-test-{tag}",
            "LNK_STATE_DIR": f"/var/lib/lnk-test-{tag}",
            "LNK_CONFIG_DIR": f"/etc/lnk-test-{tag}",
            "LANG": "C.UTF-8",
        },
        run_dir=Path(f"/run/lnk-test-{tag}"),
        state_dir=Path(f"/var/lib/lnk-test-{tag}"),
        config_dir=Path(f"/etc/lnk-test-{tag}"),
        uid_first=first,
        uid_last=first + UID_BLOCK - 1,
    )
    box.config_dir.mkdir(mode=0o755)
    (box.config_dir / "controller.toml").write_text(
        f"uid_first = {box.uid_first}\nuid_last = {box.uid_last}\n{config}\n"
    )
    if proxy_config:
        (box.config_dir / "proxy.toml").write_text(proxy_config + "\n")
    if state_tmpfs_mb is not None:  # a small disk of its own, for a test to fill
        box.state_dir.mkdir(mode=0o755)
        size = f"size={state_tmpfs_mb}m,mode=0755"
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", size, "lnk-test", str(box.state_dir)], check=True
        )
    try:
        up = box.lnk("box", "up", wrap=services_wrap)  # its services start under the wrap
        if up.returncode != 0:
            log = box.state_dir / "logs" / "controller.log"
            pytest.fail(
                f"lnk box up failed: {up.stderr}\n{log.read_text() if log.exists() else ''}"
            )
        yield box
    finally:
        box.lnk("box", "down")
        with suppress(OSError, ValueError):
            os.kill(box.controller_pid(), signal.SIGKILL)
        # Every process of the box gone (a controller still starting too), then its mounts.
        ended = end_box(box.run_dir)
        subprocess.run(
            ["umount", "-R", "-l", str(box.run_dir / "sandboxes")], capture_output=True, check=False
        )
        subprocess.run(
            [
                str(PREFIX / "venv" / "bin" / "python"),
                "-I",
                "-c",
                _REMOVE_USERS,
                str(box.uid_first),
                str(box.uid_last),
            ],
            capture_output=True,
            check=False,
        )
        if state_tmpfs_mb is not None:
            subprocess.run(["umount", "-l", str(box.state_dir)], capture_output=True, check=False)
        for path in (box.run_dir, box.state_dir, box.config_dir):
            shutil.rmtree(path, ignore_errors=True)
        assert not ended, f"the box's teardown left: {ended}"


@pytest.fixture
def private_box() -> Callable[..., AbstractContextManager[PrivateBox]]:
    """`with private_box("lease_seconds = 2") as box:` a box of its own with that controller
    config (and `proxy_config=` for its proxy's; `state_tmpfs_mb=` puts its state folder on a
    tmpfs of that size; `services_wrap=` an argv prefix its `lnk box up` runs under, such as
    net_standin.trusting_box's mount namespace)."""
    return _private_box


@pytest.fixture(scope="module")
def internet() -> Iterator[TestInternet]:
    """The test internet (net.py), one for each module that asks (a module may build its own)."""
    with TestInternet() as net:
        yield net


@pytest.fixture
def netbox(
    running_box: RunningBox,
    private_box: Callable[..., AbstractContextManager[PrivateBox]],
    internet: TestInternet,
) -> Iterator[PrivateBox]:
    """A box of its own whose proxy sees the test internet as the only one
    (`internet_box.proxy_config`)."""
    with private_box(proxy_config=proxy_config(internet)) as box:
        yield box


@pytest.fixture
def ca_dir(internet: TestInternet) -> Iterator[Path]:
    """The test internet's CA in a folder a sandbox may be granted (`internet_box.ca_folder`)."""
    with ca_folder(internet) as folder:
        yield folder
