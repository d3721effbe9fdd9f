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


def test_gap_loader_runs_an_ungranted_system_program(running_box: RunningBox) -> None:
    """KNOWN GAP, pinned: `ld.so /usr/bin/<ungranted>` runs the ungranted program.

    Landlock's EXECUTE right is checked at execve only. The ELF loader must be executable
    (every dynamic program needs it), and when it is run directly it maps the program it is
    given with mmap(PROT_EXEC), which Landlock does not mediate; `/usr` is bound without
    noexec (granted programs live there), so the mapping succeeds. So every program under
    `/usr` can run in any sandbox despite `[commands]`; what still holds it is the rest of
    the wall (Landlock read/write, seccomp, the namespaces, no privilege). Programs copied into
    the sandbox's writable places do not run this way: those are mounted noexec (see
    test_loader_running_a_copy_is_refused). When this gap is closed (e.g. a seccomp or LSM
    check on mmap(PROT_EXEC) of files outside the granted set, or an exec-only view of
    `/usr` holding just the granted programs and their libraries), this test fails: flip it
    into a `..._is_refused` test.
    """
    marker = _marker()
    result = running_box.sh(f"{LOADER} {UNGRANTED} {marker}")
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
