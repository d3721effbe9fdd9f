"""The wall's exec limit, attacked from inside a real sandbox: only granted programs run.

Attacks print a marker only if the program they smuggle in actually ran, so "refused" means
the marker is absent, not just a non-zero status. Each group has a neighbour test showing
that what is granted still runs.
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

RunningBox = Any  # tests/e2e/conftest.py

pytestmark = pytest.mark.needs_root

LOADER = "/lib64/ld-linux-x86-64.so.2"
UNGRANTED = "/usr/bin/basename"  # prints its argument: proof that it ran; never granted here
EXIT_CANNOT_EXECUTE = 126  # the shell's status for a program it found but could not run


def _marker() -> str:
    return f"RAN-{secrets.token_hex(6)}"


@pytest.fixture
def folder(running_box: RunningBox) -> Iterator[Path]:
    """A fresh folder in the owner's home, owned by the owner, with an empty `out/`."""
    path = running_box.owner.home / f"wall-{secrets.token_hex(4)}"
    (path / "out").mkdir(parents=True)
    for p in (path, path / "out"):
        os.chown(p, running_box.owner.uid, running_box.owner.gid)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _script(running_box: RunningBox, folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    path.chmod(0o755)
    os.chown(path, running_box.owner.uid, running_box.owner.gid)
    return path


# -- programs not granted ------------------------------------------------------------------------


def test_exec_of_an_ungranted_program_is_refused(running_box: RunningBox) -> None:
    marker = _marker()
    result = running_box.sh(f"{UNGRANTED} {marker}; echo status=$?")
    assert marker not in result.stdout
    assert f"status={EXIT_CANNOT_EXECUTE}" in result.stdout
    assert "Permission denied" in result.stderr


def test_granted_program_runs(running_box: RunningBox) -> None:
    marker = _marker()
    result = running_box.sh(f"{UNGRANTED} {marker}", "--command=basename")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{marker}\n"


def test_loader_runs_no_ungranted_system_program(running_box: RunningBox) -> None:
    """`ld.so /usr/bin/<ungranted>` (the loader maps what it is given with mmap(PROT_EXEC),
    which Landlock does not check): with only /bin/sh granted, /usr is a noexec clone, so the
    mapping fails; the ungranted program never runs (exec_mounts.py)."""
    marker = _marker()
    result = running_box.run(cmd=["/bin/sh", "-c", f"{LOADER} {UNGRANTED} {marker}"])
    assert result.returncode != 0
    assert marker not in result.stdout
    assert "failed to map segment" in result.stderr


def test_loader_runs_a_granted_system_program(running_box: RunningBox) -> None:
    marker = _marker()
    script = f"{LOADER} {UNGRANTED} {marker}"
    result = running_box.run("--command=basename", cmd=["/bin/sh", "-c", script])
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{marker}\n"


@pytest.fixture
def tools(running_box: RunningBox, folder: Path) -> Path:
    """A read grant of the owner's holding two programs, `granted` and `other`: copies of a
    program that prints its argument."""
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    for name in ("granted", "other"):
        path = bin_dir / name
        shutil.copyfile(UNGRANTED, path)
        path.chmod(0o755)
        os.chown(path, running_box.owner.uid, running_box.owner.gid)
    os.chown(bin_dir, running_box.owner.uid, running_box.owner.gid)
    return bin_dir


def test_loader_runs_no_ungranted_program_beside_a_granted_one_in_a_read_grant(
    running_box: RunningBox, folder: Path, tools: Path
) -> None:
    """The read grant is noexec and only the granted program is bound exec-capable over it:
    the loader cannot map its neighbour, and running the neighbour directly fails too."""
    marker, direct = _marker(), _marker()
    script = f"{tools}/other {direct}; {LOADER} {tools}/other {marker}"
    flags = (f"--read={folder}", f"--command={tools}/granted")
    result = running_box.run(*flags, cmd=["/bin/sh", "-c", script])
    assert result.returncode != 0
    assert marker not in result.stdout
    assert direct not in result.stdout
    assert "failed to map segment" in result.stderr
    assert "Permission denied" in result.stderr


def test_the_granted_program_in_a_read_grant_runs(
    running_box: RunningBox, folder: Path, tools: Path
) -> None:
    marker, loaded = _marker(), _marker()
    script = f"{tools}/granted {marker} && {LOADER} {tools}/granted {loaded}"
    flags = (f"--read={folder}", f"--command={tools}/granted")
    result = running_box.run(*flags, cmd=["/bin/sh", "-c", script])
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{marker}\n{loaded}\n"


def test_a_granted_python_loads_its_c_extensions(running_box: RunningBox) -> None:
    """lib-dynload's C modules and the system's site folders' (exec_mounts.program_folders)."""
    marker = _marker()
    code = f"import _ctypes, _ssl, _decimal, _sqlite3, yaml._yaml; print({marker!r})"
    result = running_box.run("--command=python3", cmd=["/bin/sh", "-c", f'python3 -c "{code}"'])
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{marker}\n"


def test_a_granted_git_works(running_box: RunningBox) -> None:
    script = (
        "cd /tmp && git init -q repo && cd repo && echo hi > f && git add f && "
        "git -c user.email=a@b -c user.name=n commit -q -m first && git log --format=%s"
    )
    result = running_box.run("--command=git", cmd=["/bin/sh", "-c", script])
    assert result.returncode == 0, result.stderr
    assert result.stdout == "first\n"


def test_with_command_star_the_loader_runs_anything(running_box: RunningBox) -> None:
    marker = _marker()
    script = f"{LOADER} {UNGRANTED} {marker}"
    result = running_box.run("--command=*", cmd=["/bin/sh", "-c", script])
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{marker}\n"


@pytest.mark.parametrize("where", ["write-folder", "tmp"])
def test_loader_running_a_copy_is_refused(
    running_box: RunningBox, folder: Path, where: str
) -> None:
    marker = _marker()
    copy = f"{folder}/out/prog" if where == "write-folder" else "/tmp/prog"
    result = running_box.sh(
        f"cp {UNGRANTED} {copy} && {LOADER} {copy} {marker}", f"--write={folder}/out"
    )
    assert result.returncode != 0
    assert marker not in result.stdout
    assert "failed to map segment" in result.stderr


@pytest.mark.parametrize("where", ["write-folder", "tmp", "home", "dev-shm"])
def test_copy_of_true_cannot_be_executed(running_box: RunningBox, folder: Path, where: str) -> None:
    copy = {
        "write-folder": f"{folder}/out/true",
        "tmp": "/tmp/true",
        "home": "$HOME/true",
        "dev-shm": "/dev/shm/true",
    }[where]
    result = running_box.sh(
        f'cp /bin/true "{copy}" && "{copy}"; echo status=$?', f"--write={folder}/out"
    )
    assert f"status={EXIT_CANNOT_EXECUTE}" in result.stdout, result.stderr
    assert "Permission denied" in result.stderr


@pytest.mark.parametrize("how", ["execv-proc-self-fd", "fexecve"])
def test_memfd_create_and_exec_is_refused(running_box: RunningBox, how: str) -> None:
    """A program written into an anonymous memory file and exec'd from its descriptor; the
    copy is of /bin/echo so that running it is visible."""
    marker = _marker()
    exec_line = {
        "execv-proc-self-fd": f'os.execv(f"/proc/self/fd/{{fd}}", ["echo", "{marker}"])',
        "fexecve": f'os.execve(fd, ["echo", "{marker}"], {{}})',
    }[how]
    code = "\n".join(
        [
            "import os",
            'fd = os.memfd_create("prog", 0)',
            'with open("/bin/echo", "rb") as f:',
            "    os.write(fd, f.read())",
            exec_line,
        ]
    )
    result = running_box.run(cmd=["python3", "-c", code])
    assert marker not in result.stdout
    assert result.returncode != 0
    assert "PermissionError" in result.stderr


# -- scripts -------------------------------------------------------------------------------------


def test_script_whose_interpreter_is_not_granted_is_refused(
    running_box: RunningBox, folder: Path
) -> None:
    marker = _marker()
    script = _script(running_box, folder, "tool", f'#!/usr/bin/perl\nprint "{marker}\\n";\n')
    result = running_box.sh(f"{script}; echo status=$?", f"--read={folder}", f"--command={script}")
    assert marker not in result.stdout
    assert f"status={EXIT_CANNOT_EXECUTE}" in result.stdout
    assert "Permission denied" in result.stderr


def test_script_runs_when_its_interpreter_is_granted(running_box: RunningBox, folder: Path) -> None:
    marker = _marker()
    script = _script(running_box, folder, "tool", f'#!/usr/bin/perl\nprint "{marker}\\n";\n')
    result = running_box.sh(
        str(script), f"--read={folder}", f"--command={script}", "--command=perl"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{marker}\n"


# -- [commands] allow = ["*"] --------------------------------------------------------------------


def test_command_star_lets_any_program_run(running_box: RunningBox, folder: Path) -> None:
    marker = _marker()
    result = running_box.sh(
        f"{UNGRANTED} {marker}-usr && cp {UNGRANTED} {folder}/out/prog && "
        f"{folder}/out/prog {marker}-write && cp {UNGRANTED} /tmp/prog && /tmp/prog {marker}-tmp",
        f"--write={folder}/out",
        "--command=*",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{marker}-usr\n{marker}-write\n{marker}-tmp\n"


def test_command_star_lifts_only_the_exec_limit(running_box: RunningBox, folder: Path) -> None:
    home = running_box.owner.home
    (folder / "readme.txt").write_text("hello\n")
    before = sorted(os.listdir(folder))
    result = running_box.sh(
        f"cat {home}/secret.txt; echo pwned > {folder}/new.txt; echo pwned >> {folder}/readme.txt;"
        " grep -E '^(NoNewPrivs|CapEff|Seccomp):' /proc/self/status; unshare -U true; "
        "echo unshare=$?",
        f"--read={folder}",
        f"--write={folder}/out",
        "--command=*",
    )
    assert running_box.owner.secret not in result.stdout + result.stderr
    assert sorted(os.listdir(folder)) == before
    assert (folder / "readme.txt").read_text() == "hello\n"
    assert "NoNewPrivs:\t1" in result.stdout
    assert "CapEff:\t0000000000000000" in result.stdout
    assert "Seccomp:\t2" in result.stdout
    assert "unshare=1" in result.stdout
