"""Nothing a sandbox writes, leaves or does acts outside it: attacks from inside a real sandbox,
then another local user (a stranger to the owner) or the owner outside tries to use what was
left. The installed box, real users, real bwrap, Landlock and seccomp.

- set-id: a copy of a shell made set-uid/set-gid (chmod, fchmod, created so) must leave no
  program that runs as the owner (as root, when root runs the sandbox) for the stranger;
- shared modes: chmod 0666/0777 and POSIX ACLs must leave nothing the stranger can write;
- written code: under `--command /bin/sh` only, a library written to /dev, /tmp or a write
  folder by the shell's printf is never preloaded into the granted shell, which still works;
- host network: a sandbox on the host's network takes no port (listen unbound, UDP), and
  still dials out.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import socket
import stat
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import install_prefix
import pytest
from as_user import as_user

RunningBox = Any  # tests/e2e/conftest.py
pytestmark = [pytest.mark.needs_root, pytest.mark.e2e]

LNK = str(install_prefix.LNK)
LIBRARY = next(
    p
    for p in ("/usr/lib/x86_64-linux-gnu/libdl.so.2", "/usr/lib/aarch64-linux-gnu/libdl.so.2")
    if os.path.exists(p)
)
ACL_NAMES = ("system.posix_acl_access", "system.posix_acl_default")


@dataclass(frozen=True)
class Stranger:
    name: str
    uid: int
    gid: int

    def run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            as_user(self.uid, self.gid, *argv),
            env={"PATH": "/usr/bin:/bin"},
            cwd="/",
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )


@pytest.fixture(scope="module")
def stranger() -> Iterator[Stranger]:
    """A second local user, in no group of the owner's."""
    name = "lnks" + secrets.token_hex(3)
    subprocess.run(["useradd", "-M", "-s", "/bin/sh", "-K", "UID_MIN=1500", name], check=True)
    try:
        entry = pwd.getpwnam(name)
        yield Stranger(name, entry.pw_uid, entry.pw_gid)
    finally:
        subprocess.run(["userdel", name], check=False)


@pytest.fixture
def shared(running_box: RunningBox) -> Iterator[Path]:
    """A fresh write folder of the owner's that other users may reach (and read), as a shared
    project is: the home traversable, the folder 0755."""
    owner = running_box.owner
    folder = owner.home / "project" / f"shared-{secrets.token_hex(3)}"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    os.chown(folder, owner.uid, owner.gid)
    home_mode = stat.S_IMODE(owner.home.stat().st_mode)
    project_mode = stat.S_IMODE((owner.home / "project").stat().st_mode)
    owner.home.chmod(0o711)
    (owner.home / "project").chmod(0o711)
    try:
        yield folder
    finally:
        owner.home.chmod(home_mode)
        (owner.home / "project").chmod(project_mode)
        shutil.rmtree(folder, ignore_errors=True)


def _sandbox(box: RunningBox, *args: str) -> subprocess.Popen[str]:
    """`lnk sandbox run --yes ARGS` as the owner, left running: its stdin, stdout and stderr
    are pipes (a sandbox that reads stdin waits for the test)."""
    return subprocess.Popen(
        as_user(box.owner.uid, box.owner.gid, LNK, "sandbox", "run", "--yes", *args),
        env=box.owner_env(),
        cwd=str(box.owner.home),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _acls(path: Path) -> list[str]:
    return [n for n in os.listxattr(path, follow_symlinks=False) if n in ACL_NAMES]


# -- set-id -----------------------------------------------------------------------------------

SET_ID_SCRIPT = """
cp /bin/sh {w}/suid; chmod 4755 {w}/suid; echo "chmod 4755: $?"
chmod 2755 {w}/suid; echo "chmod 2755: $?"
python3 -c 'import os; os.chmod("{w}/suid", 0o6755)'; echo "python chmod: $?"
python3 -c 'import os; os.close(os.open("{w}/made", os.O_CREAT | os.O_WRONLY, 0o4755))'
echo "create 04755: $?"
cp /bin/sh {w}/plain; chmod 0755 {w}/plain; echo "chmod 0755: $?"
"""


def _assert_no_set_id_program(folder: Path, stranger: Stranger, owner_uid: int) -> None:
    for entry in folder.iterdir():
        assert not os.lstat(entry).st_mode & (stat.S_ISUID | stat.S_ISGID), entry
    ran = stranger.run(str(folder / "suid"), "-p", "-c", "id -u; id -g")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == [str(stranger.uid), str(stranger.gid)]
    assert str(owner_uid) not in ran.stdout.split()


def test_set_id_program_left_in_a_write_folder_is_refused_and_runs_as_no_owner(
    running_box: RunningBox, shared: Path, stranger: Stranger
) -> None:
    result = running_box.sh(SET_ID_SCRIPT.format(w=shared), f"--write={shared}", "--command=chmod")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "chmod 4755: 1" in out and "chmod 2755: 1" in out, out
    assert "python chmod: 1" in out and "create 04755: 1" in out, out
    assert "chmod 0755: 0" in out, out  # a plain mode still works
    assert not (shared / "made").exists()
    assert _mode(shared / "suid") == 0o755
    _assert_no_set_id_program(shared, stranger, running_box.owner.uid)


def test_root_run_sandbox_leaves_no_set_uid_root_program(
    running_box: RunningBox, stranger: Stranger
) -> None:
    folder = Path("/srv") / f"lnk-test-{secrets.token_hex(3)}"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    try:
        env = {**running_box.owner_env(), "HOME": "/root", "USER": "root"}
        flags = [f"--write={folder}", "--command=cp", "--command=chmod", "--command=python3"]
        script = SET_ID_SCRIPT.format(w=folder)
        result = subprocess.run(
            [LNK, "sandbox", "run", "--yes", *flags, "--", "/bin/sh", "-c", script],
            env=env,
            cwd="/",
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        assert "chmod 4755: 1" in result.stdout and "create 04755: 1" in result.stdout
        assert os.lstat(folder / "suid").st_uid == 0  # root's file: set-uid would be root's
        _assert_no_set_id_program(folder, stranger, 0)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# -- group and other write, ACLs --------------------------------------------------------------

SHARED_SCRIPT = """
echo data > {w}/f; mkdir {w}/d
chmod 0666 {w}/f; echo "chmod 0666: $?"
chmod 0777 {w}/d; echo "chmod 0777: $?"
chmod g+w {w}/f; echo "chmod g+w: $?"
setfacl -m o::rw {w}/f; echo "acl access: $?"
setfacl -d -m o::rwx {w}/d; echo "acl default: $?"
setfacl -m u:{stranger}:rwx {w}/d; echo "acl user: $?"
"""


def test_shared_write_modes_and_acls_are_refused_and_the_stranger_writes_nothing(
    running_box: RunningBox, shared: Path, stranger: Stranger
) -> None:
    script = SHARED_SCRIPT.format(w=shared, stranger=stranger.uid)
    result = running_box.sh(script, f"--write={shared}", "--command=chmod", "--command=setfacl")
    assert result.returncode == 0, result.stderr
    for line in ("chmod 0666", "chmod 0777", "chmod g+w", "acl access", "acl default", "acl user"):
        assert f"{line}: 1" in result.stdout, result.stdout
    for entry in (shared / "f", shared / "d"):
        assert not _mode(entry) & 0o022, entry
        assert _acls(entry) == [], entry
    assert stranger.run("/bin/sh", "-c", f"echo x >> {shared}/f").returncode != 0
    assert stranger.run("/usr/bin/touch", f"{shared}/d/theirs").returncode != 0
    assert (shared / "f").read_text() == "data\n"
    assert list((shared / "d").iterdir()) == []


# -- written code under a finite list ---------------------------------------------------------


def _printf_script(path: str, data: bytes) -> str:
    """A dash script that writes `data` to `path` with printf's octal escapes, in chunks."""
    lines = [f"printf '' > {path}"]  # not `:`: a failed redirection would end dash
    chunk = 512
    for i in range(0, len(data), chunk):
        escaped = "".join(f"\\{b:03o}" for b in data[i : i + chunk])
        lines.append(f"printf '{escaped}' >> {path}")
    return "\n".join(lines)


def test_a_library_written_by_printf_is_never_preloaded_into_the_granted_shell(
    running_box: RunningBox, shared: Path
) -> None:
    data = Path(LIBRARY).read_bytes()
    places = ["/dev/lnk-x.so", "/tmp/lnk-x.so", f"{shared}/lnk-x.so"]
    script = []
    for place in places:
        script.append(_printf_script(place, data))
        script.append(f'echo "wrote {place}: $?"')
        # Mapped as code shows as an r-xp line of /proc/self/maps (a refused preload may leave
        # its first, read-only page mapped: ld.so reserves it before mapping the code).
        script.append(
            f'LD_PRELOAD={place} /bin/sh -c \'while read l; do case "$l" in '
            f'*" r-xp "*lnk-x.so*) echo MAPPED {place};; esac; done '
            "< /proc/self/maps; echo shell works'"
        )
    result = running_box.run(  # the script on stdin: it is larger than one argument may be
        f"--write={shared}", "--command=/bin/sh", cmd=["/bin/sh", "-s"], input="\n".join(script)
    )
    assert result.returncode == 0, result.stderr
    assert "MAPPED" not in result.stdout, result.stdout
    assert result.stdout.count("shell works") == len(places)
    assert "wrote /dev/lnk-x.so: 0" not in result.stdout  # /dev is read-only
    assert "wrote /tmp/lnk-x.so: 0" in result.stdout  # written, yet never mapped as code
    assert "cannot be preloaded" in result.stderr
    assert (shared / "lnk-x.so").read_bytes() == data  # the write grant took the write


# -- host network -----------------------------------------------------------------------------

LISTEN_SCRIPT = """
import socket, sys
def attempt(what, fn):
    try:
        print(what, fn(), flush=True)
    except OSError as exc:
        print(what, "refused", exc.errno, flush=True)
def listen():
    s = socket.socket()
    s.listen()
    return s.getsockname()[1]
def udp():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("0.0.0.0", 0))
    return s.getsockname()[1]
def dial():
    with socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5):
        return "connected"
attempt("listen", listen)
attempt("udp", udp)
attempt("dial", dial)
sys.stdin.read()  # the ports, if any, stay open until the test has tried them
"""


def test_host_mode_takes_no_port_on_the_host_but_still_dials_out(
    running_box: RunningBox,
) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(4)
        proc = _sandbox(
            running_box,
            "--network-mode=host",
            "--command=python3",
            "--",
            "python3",
            "-c",
            LISTEN_SCRIPT,
            str(server.getsockname()[1]),
        )
        try:
            assert proc.stdout is not None
            lines = dict(proc.stdout.readline().split(" ", 1) for _ in range(3))
            for kind in ("listen", "udp"):  # whatever it says, the host must reach no port
                said = lines[kind].split()
                if said[0].isdigit():
                    family = socket.SOCK_STREAM if kind == "listen" else socket.SOCK_DGRAM
                    with socket.socket(socket.AF_INET, family) as s, contextlib.suppress(OSError):
                        s.settimeout(2)
                        s.connect(("127.0.0.1", int(said[0])))
                        if kind == "listen":
                            pytest.fail(f"the host reached the sandbox's port {said[0]}")
            assert lines["listen"].strip() == "refused 1", lines
            assert lines["udp"].strip() == "refused 1", lines
            assert lines["dial"].strip() == "connected", lines
        finally:
            _out, err = proc.communicate(input="", timeout=60)
        assert proc.returncode == 0, err


# -- a cleared umask: the gap while it runs, the sweep after ----------------------------------

UMASK_SCRIPT = """
umask 0
echo data > {w}/f; mkdir {w}/d; mkdir {w}/d/e
echo made
read go
"""


def test_gap_a_cleared_umask_shares_what_is_made_until_the_sandbox_ends_then_the_sweep(
    running_box: RunningBox, shared: Path, stranger: Stranger
) -> None:
    proc = _sandbox(
        running_box,
        f"--write={shared}",
        "--command=mkdir",
        "--",
        "/bin/sh",
        "-c",
        UMASK_SCRIPT.format(w=shared),
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "made\n"
        # The gap (seccomp_modes cannot see the umask): while it runs, what it made is shared.
        assert _mode(shared / "f") == 0o666 and _mode(shared / "d") == 0o777
    finally:
        _out, err = proc.communicate(input="go\n", timeout=60)
    assert proc.returncode == 0, err
    # The sweep at its end (leftover_modes): nothing it made stays writable by others.
    for entry in (shared / "f", shared / "d", shared / "d" / "e"):
        assert not _mode(entry) & 0o022, entry
    assert stranger.run("/bin/sh", "-c", f"echo x >> {shared}/f").returncode != 0
    assert stranger.run("/usr/bin/touch", f"{shared}/d/theirs").returncode != 0
    assert (shared / "f").read_text() == "data\n"
