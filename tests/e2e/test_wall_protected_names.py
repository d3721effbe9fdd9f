"""The names tools run at the top of a write folder (protected_names.PROTECTED_NAMES) and the
files that redirect git, attacked from inside a real sandbox; and the placeholders that reserve
the missing ones, looked for by git inside and outside, during and after the run, and after the
controller was killed.

Each attack is checked twice: the sandbox is refused, and the folder, looked at from outside,
is byte for byte what it was (no entry made, none left).
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from as_owner import run_as_owner
from as_user import as_user
from install_prefix import LNK

from lnk_shared.protected_names import GIT_REDIRECTS, PROTECTED_NAMES

RunningBox = Any  # tests/e2e/conftest.py

pytestmark = pytest.mark.needs_root

STARTED = "lnk-names-test: started"
READY = "lnk-names-test: ready"
TOP_LEVEL = sorted({n.path for n in PROTECTED_NAMES if "/" not in n.path})
GIT_COMMANDS = ("--command=git", "--command=cat", "--command=ls")
GIT_ID = "-c user.email=sandbox@example.invalid -c user.name=sandbox"
WAIT_S = 60.0  # a sandbox start on a loaded 2-core machine, with margin
RECONCILE_S = 30.0  # a restarted controller's reconcile, with margin


def _give(owner: Any, root: Path) -> None:
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)]:
            os.chown(name, owner.uid, owner.gid, follow_symlinks=False)


def _listing(root: Path) -> dict[str, tuple[int, bytes]]:
    """Every entry below `root` (inside .git too): mode and content."""
    found: dict[str, tuple[int, bytes]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            info = path.lstat()
            content = path.read_bytes() if stat.S_ISREG(info.st_mode) else b""
            found[str(path.relative_to(root))] = (info.st_mode, content)
    return found


def _git(box: RunningBox, repo: Path, *args: str) -> str:
    done = run_as_owner(box, ["git", *GIT_ID.split(), *args], cwd=repo)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def folder(running_box: RunningBox) -> Iterator[Path]:
    """A fresh folder of the owner's with no protected entry at all (and no .git)."""
    path = running_box.owner.home / f"names-{secrets.token_hex(4)}"
    path.mkdir()
    (path / "readme.txt").write_text("hello\n")
    _give(running_box.owner, path)
    yield path
    subprocess.run(["chattr", "-R", "-i", str(path)], capture_output=True, check=False)
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def repo(running_box: RunningBox, folder: Path) -> Path:
    """`folder` as the owner's own git repository, everything committed (`git init` by the
    owner on the host, as the owner's project is)."""
    _git(running_box, folder, "init", "-q")
    _git(running_box, folder, "add", "-A")
    _git(running_box, folder, "commit", "-q", "-m", "start")
    return folder


def _attack(box: RunningBox, folder: Path, script: str, *flags: str) -> str:
    """Run `script` in a sandbox writing `folder`; return what it printed after starting."""
    result = box.sh(f"echo {STARTED}; cd {folder} && {{ {script}; }}", f"--write={folder}", *flags)
    first, _, rest = result.stdout.partition("\n")
    assert first == STARTED, f"the sandbox did not start: {result.stderr}"
    return rest


def _plant_each(names: list[str]) -> str:
    """Shell that tries, for each name, every way to put something there: write it as a file,
    make it a folder with a file in it, remove it and write it, move it aside and write it.
    Prints LEAK:<name>:<how> for each that worked."""
    parts = []
    for name in names:
        parts.append(
            f"(echo pwn > '{name}') 2>/dev/null && echo 'LEAK:{name}:write'; "
            f"(mkdir -p '{name}/x' && echo pwn > '{name}/x/f') 2>/dev/null "
            f"&& echo 'LEAK:{name}:mkdir'; "
            f"(rm -rf '{name}' && echo pwn > '{name}') 2>/dev/null && echo 'LEAK:{name}:rm'; "
            f"(mv '{name}' '{name}.aside' && echo pwn > '{name}') 2>/dev/null "
            f"&& echo 'LEAK:{name}:mv'; "
        )
    return "".join(parts) + "true"


def test_every_protected_name_at_the_top_is_refused_and_nothing_lands_outside(
    running_box: RunningBox, folder: Path
) -> None:
    before = _listing(folder)
    out = _attack(running_box, folder, _plant_each(TOP_LEVEL) + "; echo made > made.txt")
    assert [line for line in out.splitlines() if line.startswith("LEAK")] == []
    after = _listing(folder)
    assert after.pop("made.txt")[1] == b"made\n", "the granted write did not land"
    assert after == before


def test_every_git_redirect_inside_an_existing_git_is_refused(
    running_box: RunningBox, repo: Path
) -> None:
    """`commondir`, `config.worktree`, `info/…`, `modules/…` and `worktrees/…` point the owner's
    git at config the sandbox wrote; `.lfsconfig` beside `.git` does the same for git-lfs."""
    before = _listing(repo)
    names = [n.path for n in GIT_REDIRECTS] + [".git/info/attributes", ".lfsconfig"]
    out = _attack(running_box, repo, _plant_each(names))
    assert [line for line in out.splitlines() if line.startswith("LEAK")] == []
    assert _listing(repo) == before


def test_git_add_all_and_commit_inside_commits_nothing_of_the_box(
    running_box: RunningBox, repo: Path
) -> None:
    out = _attack(
        running_box,
        repo,
        f"echo work > work.txt && git {GIT_ID} add -A && git {GIT_ID} commit -q -m work "
        "&& git show --name-only --format= HEAD",
        *GIT_COMMANDS,
    )
    assert out.split() == ["work.txt"], out
    assert _git(running_box, repo, "show", "--name-only", "--format=", "HEAD").split() == [
        "work.txt"
    ]
    assert _git(running_box, repo, "status", "--porcelain", "--untracked-files=all") == ""


def _start_waiting(
    box: RunningBox, folder: Path, then: str = "true", box_env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """A sandbox writing `folder` that prints READY, waits for a line on its stdin, then runs
    `then` in `folder`; on the session's box, or on the one `box_env`'s LNK_ dirs name."""
    owner = box.owner
    env = {**box.owner_env(), **{k: v for k, v in (box_env or {}).items() if k.startswith("LNK_")}}
    argv = as_user(
        owner.uid,
        owner.gid,
        str(LNK),
        "sandbox",
        "run",
        "--yes",
        f"--write={folder}",
        "--command=head",
        "--command=mkdir",
        "--",
        "/bin/sh",
        "-c",
        f"echo {READY}; head -n 1 >/dev/null; cd {folder} && {{ {then}; }}",
    )
    return subprocess.Popen(
        argv,
        env=env,
        cwd=str(owner.home),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_ready(process: subprocess.Popen[str]) -> None:
    assert process.stdout is not None
    line = process.stdout.readline().strip()
    if line != READY:
        process.kill()
        _, err = process.communicate(timeout=WAIT_S)
        pytest.fail(f"the sandbox did not start: {line!r} {err}")


def _finish(process: subprocess.Popen[str]) -> str:
    """Let the sandbox go on; return what it printed after READY."""
    out, _ = process.communicate("go\n", timeout=WAIT_S)
    return out


def test_host_git_status_during_and_after_the_run_shows_nothing_of_the_box(
    running_box: RunningBox, repo: Path
) -> None:
    process = _start_waiting(running_box, repo)
    try:
        _wait_ready(process)
        reserved = [name for name in TOP_LEVEL if (repo / name).exists()]
        assert reserved, "no placeholder while the sandbox runs: nothing was proven"
        during = _git(running_box, repo, "status", "--porcelain", "--untracked-files=all")
        ignored = _git(running_box, repo, "status", "--porcelain", "--ignored")
    finally:
        _finish(process)
    assert process.returncode == 0, process.stderr
    assert during == ""
    assert ignored == ""
    assert _git(running_box, repo, "status", "--porcelain", "--untracked-files=all") == ""
    assert sorted(os.listdir(repo)) == [".git", "readme.txt"]


def test_owners_git_clean_mid_run_uncovers_no_protected_name(
    running_box: RunningBox, repo: Path
) -> None:
    """The owner's `git clean -fdx` while a sandbox runs: were a placeholder removed, the kernel
    would drop the sandbox's cover on that name (a mount whose dentry another namespace removes
    is detached) and the sandbox could write `.envrc`. Placeholders are immutable while their
    sandbox runs: git cannot remove them, and the sandbox's second try is refused too."""
    process = _start_waiting(
        running_box,
        repo,
        then="(echo pwn > .envrc) 2>/dev/null && echo LEAK:.envrc; "
        "(mkdir -p .vscode/x) 2>/dev/null && echo LEAK:.vscode",
    )
    try:
        _wait_ready(process)
        cleaned = run_as_owner(running_box, ["git", "clean", "-f", "-f", "-d", "-x"], cwd=repo)
    finally:
        out = _finish(process)
    assert "LEAK" not in out, out
    assert (repo / "readme.txt").exists(), cleaned.stderr
    assert sorted(os.listdir(repo)) == [".git", "readme.txt"]


def test_owner_cannot_remove_a_placeholder_while_the_sandbox_runs(
    running_box: RunningBox, folder: Path
) -> None:
    """Removing the reserved name from the host would drop the sandbox's cover on it (the
    kernel detaches a mount whose dentry another namespace removes): placeholders are
    immutable while their sandbox runs."""
    process = _start_waiting(running_box, folder)
    try:
        _wait_ready(process)
        removed = run_as_owner(running_box, ["rmdir", str(folder / ".envrc")], cwd=folder)
    finally:
        _finish(process)
    assert removed.returncode != 0
    assert "Operation not permitted" in removed.stderr
    assert sorted(os.listdir(folder)) == ["readme.txt"]


def test_kill_9_of_the_controller_mid_run_leaves_nothing_in_the_folder(
    running_box: RunningBox, private_box: Any, folder: Path
) -> None:
    before = _listing(folder)
    with private_box() as box:
        process = _start_waiting(running_box, folder, box_env=box.env)
        try:
            _wait_ready(process)
            assert (folder / ".envrc").is_dir(), "no placeholder while the sandbox runs"
            os.kill(box.controller_pid(), signal.SIGKILL)
            process.wait(timeout=WAIT_S)
        finally:
            if process.poll() is None:
                process.kill()
            process.communicate(timeout=WAIT_S)
        up = box.lnk("box", "up")
        assert up.returncode == 0, up.stderr
        started = time.monotonic()
        while _listing(folder) != before and time.monotonic() - started < RECONCILE_S:
            time.sleep(0.1)  # polling reconcile's outcome, bounded: not a synchronisation
    assert _listing(folder) == before


@pytest.mark.parametrize("folder", ["bin", ".local/bin", "go/bin"])
def test_write_of_a_login_path_folder_is_refused_though_the_callers_path_lacks_it(
    running_box: RunningBox, folder: str
) -> None:
    """The owner's ~/.profile (Debian's, from /etc/skel) puts ~/bin and ~/.local/bin first on
    PATH at the next login once they exist; `go install` fills ~/go/bin. The caller's PATH here
    is /usr/local/bin:/usr/bin:/bin, without any of them."""
    home = running_box.owner.home
    profile = (home / ".profile").read_text()
    assert '"$HOME/bin' in profile and '"$HOME/.local/bin' in profile
    target = home / folder
    existed = target.exists()
    target.mkdir(parents=True, exist_ok=True)
    _give(running_box.owner, home / folder.split("/", maxsplit=1)[0])
    try:
        assert str(target) not in running_box.owner_env()["PATH"]
        result = running_box.sh(f"echo pwn > {target}/ls", f"--write={target}")
        assert result.returncode != 0
        assert "login PATH" in result.stderr or "home dot folder" in result.stderr, result.stderr
        assert not (target / "ls").exists()
    finally:
        if not existed:
            shutil.rmtree(home / folder.split("/", maxsplit=1)[0])


def test_write_beside_login_path_folders_still_works(running_box: RunningBox, folder: Path) -> None:
    result = running_box.sh(f"echo made > {folder}/made.txt", f"--write={folder}")
    assert result.returncode == 0, result.stderr
    assert (folder / "made.txt").read_text() == "made\n"


def test_gap_git_init_at_the_top_of_a_write_folder_without_git_fails_inside(
    running_box: RunningBox, folder: Path
) -> None:
    """A missing `.git` is reserved read-only (a sandbox-made `.git/config` or hook would run
    in the owner's git): `git init` there fails inside, and nothing lands outside. A folder
    below the top may hold a repository of the sandbox's own (write.deep-dot: a known gap)."""
    before = _listing(folder)
    out = _attack(
        running_box,
        folder,
        "(git init -q) 2>/dev/null && echo LEAK:git-init; echo tried",
        *GIT_COMMANDS,
    )
    assert "LEAK" not in out and "tried" in out
    assert _listing(folder) == before
