"""Idmapped grants and noexec tmpfs, checked from a child running as the sandbox uid.

Each test stages real mounts (as root) under a fresh 0711 dir in /tmp, then runs `setpriv`
as the sandbox uid to read, write, exec and `mmap(PROT_EXEC)` through them, and bwrap to show
the flags survive its bind. A fixture unmounts everything under that dir, even on failure.
The sandbox uid is below 2**31: bwrap 0.8 writes its uid_map with "%d", so a larger uid makes
it fail with "setting up uid map: Invalid argument".
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import struct
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from lnk_controller import idmap_mounts
from lnk_controller.idmap_mounts import StagedMount
from lnk_shared.errors import LaunchRefused, StateError

pytestmark = pytest.mark.needs_root

OWNER = 4_000_000_001  # the person who grants the folder
SANDBOX = 2_000_000_002  # the fresh uid (and gid) the sandbox runs as
THIRD = 4_000_000_003  # someone else whose files sit in the granted folder
OTHER = 4_000_000_004  # another local user, who must reach nothing through staging
OVERFLOW = 65534  # what an id the map lacks reads as (/proc/sys/kernel/overflowuid)
SECRET = b"owner's secret\n"
PT_INTERP = 3  # ELF program header type naming the loader

Stage = Callable[..., StagedMount]


def _elf_interpreter(path: str) -> str:
    """The loader named in a 64-bit little-endian ELF's PT_INTERP header."""
    data = Path(path).read_bytes()
    (phoff,) = struct.unpack("<Q", data[32:40])
    (phentsize,) = struct.unpack("<H", data[54:56])
    (phnum,) = struct.unpack("<H", data[56:58])
    for index in range(phnum):
        entry = data[phoff + index * phentsize :][:phentsize]
        p_type, _flags, p_offset, _va, _pa, p_filesz = struct.unpack("<IIQQQQ", entry[:40])
        if p_type == PT_INTERP:
            return data[p_offset : p_offset + p_filesz].rstrip(b"\0").decode()
    raise AssertionError(f"{path} has no PT_INTERP")


def _mount_points() -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4].replace("\\040", " ") for line in f]


def _mountinfo(target: Path) -> str:
    with open("/proc/self/mountinfo") as f:
        return next(line for line in f if line.split()[4] == str(target))


def as_sandbox(*argv: str, cwd: str = "/") -> subprocess.CompletedProcess[str]:
    ids = ["--reuid", str(SANDBOX), "--regid", str(SANDBOX), "--clear-groups"]
    command = ["/usr/bin/setpriv", *ids, "--no-new-privs", "--", *argv]
    return subprocess.run(command, check=False, capture_output=True, text=True, timeout=30, cwd=cwd)


def sandbox_python(code: str, *args: str) -> str:
    """Run `code` in a Python child as the sandbox uid; its stdout (an errno name or OK)."""
    result = as_sandbox("/usr/bin/python3", "-I", "-c", code, *args)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


TRY_OPEN = """
import errno, os, sys
try:
    os.close(os.open(sys.argv[1], getattr(os, sys.argv[2])))
    print("OK")
except OSError as exc:
    print(errno.errorcode[exc.errno])
"""

TRY_MMAP = """
import errno, mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
prot = mmap.PROT_READ | (mmap.PROT_EXEC if sys.argv[2] == "exec" else 0)
try:
    mmap.mmap(fd, 4096, flags=mmap.MAP_PRIVATE, prot=prot).close()
    print("OK")
except OSError as exc:
    print(errno.errorcode[exc.errno])
"""


@pytest.fixture
def base() -> Iterator[Path]:
    """A fresh 0711 dir in /tmp; every mount under it is detached and it is removed after."""
    path = Path(tempfile.mkdtemp(prefix="lnk-idmap-", dir="/tmp"))
    path.chmod(0o711)
    try:
        yield path
    finally:
        for point in sorted(_mount_points(), key=len, reverse=True):
            if point.startswith(f"{path}/"):
                subprocess.run(["/usr/bin/umount", "--lazy", point], check=False)
        shutil.rmtree(path)


@pytest.fixture
def owner_dir(base: Path) -> Path:
    """The owner's folder: 0700, a 0600 secret, a copy of /usr/bin/true, third-party files."""
    root = base / "owner"
    root.mkdir(mode=0o700)
    (root / "secret").write_bytes(SECRET)
    shutil.copy("/usr/bin/true", root / "prog")
    (root / "theirs").write_text("third party\n")
    (root / "shared-group").write_text("owner's, group not mapped\n")
    for name, mode, uid, gid in (
        (".", 0o700, OWNER, OWNER),
        ("secret", 0o600, OWNER, OWNER),
        ("prog", 0o700, OWNER, OWNER),
        ("theirs", 0o666, THIRD, THIRD),
        ("shared-group", 0o660, OWNER, THIRD),
    ):
        os.chown(root / name, uid, gid)
        os.chmod(root / name, mode)
    return root


@pytest.fixture
def userns_fd() -> Iterator[int]:
    fd = idmap_mounts.make_userns_fd(((OWNER, SANDBOX, 1),), ((OWNER, SANDBOX, 1),))
    try:
        yield fd
    finally:
        os.close(fd)


@pytest.fixture
def stage(base: Path, owner_dir: Path, userns_fd: int) -> Stage:
    def staged(name: str, *, read_only: bool = False, noexec: bool = False) -> StagedMount:
        if not (base / "stage").exists():  # a test may have made it (wrongly) itself
            idmap_mounts.make_staging_dir(base / "stage", gid=SANDBOX)
        return idmap_mounts.stage_idmapped(
            owner_dir,
            base / "stage" / name,
            userns_fd=userns_fd,
            read_only=read_only,
            noexec=noexec,
        )

    return staged


def test_owners_0600_file_reads_as_the_sandboxs_own(stage: Stage) -> None:
    staged = stage("rw")
    result = as_sandbox("/bin/cat", f"{staged.target}/secret")
    assert result.stdout == SECRET.decode()
    info = os.stat(f"{staged.target}/secret")
    assert (info.st_uid, info.st_gid) == (SANDBOX, SANDBOX)
    assert "idmapped" in _mountinfo(Path(staged.target))


def test_file_created_by_the_sandbox_lands_owned_by_the_owner(
    stage: Stage, owner_dir: Path
) -> None:
    staged = stage("rw")
    assert as_sandbox("/bin/sh", "-c", f"echo new > {staged.target}/made").returncode == 0
    info = os.stat(owner_dir / "made")
    assert (info.st_uid, info.st_gid) == (OWNER, OWNER)


def test_read_only_grant_refuses_writes_with_erofs(stage: Stage) -> None:
    staged = stage("ro", read_only=True)
    assert "ro," in _mountinfo(Path(staged.target)).split()[5] + ","
    assert sandbox_python(TRY_OPEN, f"{staged.target}/secret", "O_WRONLY") == "EROFS"
    assert sandbox_python(TRY_OPEN, f"{staged.target}/secret", "O_RDONLY") == "OK"
    assert as_sandbox("/bin/sh", "-c", f": > {staged.target}/new").returncode != 0


def test_exec_from_noexec_grant_is_refused(stage: Stage) -> None:
    assert as_sandbox(f"{stage('exec').target}/prog").returncode == 0  # the copy does run
    result = as_sandbox(f"{stage('noexec', noexec=True).target}/prog")
    assert result.returncode != 0
    assert "Permission denied" in result.stderr


def test_loader_running_binary_from_noexec_grant_is_refused(stage: Stage) -> None:
    loader = _elf_interpreter("/usr/bin/true")  # /lib64/ld-linux-x86-64.so.2 on x86_64
    assert as_sandbox(loader, "./prog", cwd=stage("exec").target).returncode == 0
    result = as_sandbox(loader, "./prog", cwd=stage("noexec", noexec=True).target)
    assert result.returncode != 0
    assert "failed to map segment" in result.stderr


def test_mmap_prot_exec_from_noexec_grant_is_refused(stage: Stage) -> None:
    prog = f"{stage('noexec', noexec=True).target}/prog"
    assert sandbox_python(TRY_MMAP, prog, "read") == "OK"
    assert sandbox_python(TRY_MMAP, prog, "exec") == "EPERM"


def test_third_party_file_reads_as_overflow_and_refuses_writes(stage: Stage) -> None:
    staged = stage("rw")
    info = os.stat(f"{staged.target}/theirs")
    assert (info.st_uid, info.st_gid) == (OVERFLOW, OVERFLOW)
    assert stat.S_IMODE(info.st_mode) == 0o666
    assert sandbox_python(TRY_OPEN, f"{staged.target}/theirs", "O_RDONLY") == "OK"
    assert sandbox_python(TRY_OPEN, f"{staged.target}/theirs", "O_WRONLY") == "EACCES"


def test_owners_file_with_unmapped_group_refuses_writes(stage: Stage) -> None:
    """The kernel refuses writes to any inode with an unmapped uid OR gid, even the owner's."""
    path = f"{stage('rw').target}/shared-group"
    assert os.stat(path).st_uid == SANDBOX
    assert sandbox_python(TRY_OPEN, path, "O_RDONLY") == "OK"
    assert sandbox_python(TRY_OPEN, path, "O_WRONLY") == "EACCES"


def test_unmapped_root_cannot_create_through_the_mount(stage: Stage) -> None:
    with pytest.raises(OSError) as caught:
        Path(stage("rw").target, "by-root").write_text("x")
    assert caught.value.errno == errno.EOVERFLOW


def test_unmount_leaves_nothing_and_may_be_repeated(stage: Stage) -> None:
    target = Path(stage("rw").target)
    assert str(target) in _mount_points()
    idmap_mounts.unmount(target)
    assert str(target) not in _mount_points()
    assert not os.path.lexists(target)
    idmap_mounts.unmount(target)


def as_other(*argv: str) -> subprocess.CompletedProcess[str]:
    """Another local user, neither the sandbox nor the owner."""
    ids = ["--reuid", str(OTHER), "--regid", str(OTHER), "--clear-groups"]
    command = ["/usr/bin/setpriv", *ids, "--no-new-privs", "--", *argv]
    return subprocess.run(command, check=False, capture_output=True, text=True, timeout=30)


def test_staging_dir_is_the_sandboxs_alone_to_traverse(
    stage: Stage, base: Path, owner_dir: Path
) -> None:
    # A 0644 file in the owner's 0700 folder: only the folder's mode keeps others out, and
    # a staging dir others may traverse would bypass it.
    (owner_dir / "open").write_text("readable by mode\n")
    os.chown(owner_dir / "open", OWNER, OWNER)
    os.chmod(owner_dir / "open", 0o644)
    staged = stage("rw")
    info = os.stat(base / "stage")
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (0, SANDBOX, 0o710)
    assert as_sandbox("/bin/ls", str(base / "stage")).returncode != 0  # traverse, not list
    assert as_sandbox("/bin/cat", f"{staged.target}/open").stdout == "readable by mode\n"
    # Another local user reaches nothing of the granted folder through the staging dir.
    result = as_other("/bin/cat", f"{staged.target}/open")
    assert result.returncode != 0 and "Permission denied" in result.stderr
    assert as_other("/bin/ls", staged.target).returncode != 0


def test_staging_dir_made_on_the_way_is_roots_alone(base: Path) -> None:
    staged = idmap_mounts.stage_tmpfs(
        base / "fresh" / "tmp", uid=SANDBOX, gid=SANDBOX, size_bytes=1 << 20
    )
    info = os.stat(base / "fresh")
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (0, 0o700)
    assert as_sandbox("/bin/ls", staged.target).returncode != 0


def test_staging_dir_open_to_others_is_refused(stage: Stage, base: Path) -> None:
    (base / "stage").mkdir(mode=0o755)
    os.chmod(base / "stage", 0o755)
    with pytest.raises(StateError, match="mode 755"):
        stage("rw")


def test_link_planted_at_target_is_refused(stage: Stage, base: Path, tmp_path: Path) -> None:
    stage("first")
    (base / "stage" / "planted").symlink_to(tmp_path)
    with pytest.raises(StateError, match="is a link"):
        stage("planted")
    assert str(tmp_path) not in _mount_points()


def test_link_as_source_is_refused(base: Path, owner_dir: Path, userns_fd: int) -> None:
    (base / "link").symlink_to(owner_dir)
    with pytest.raises(StateError, match="is a link"):
        idmap_mounts.stage_idmapped(
            base / "link", base / "stage" / "x", userns_fd=userns_fd, read_only=True, noexec=True
        )


def test_source_fd_is_used_not_a_path_swapped_after_open(
    base: Path, owner_dir: Path, userns_fd: int
) -> None:
    source_fd = os.open(owner_dir, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        owner_dir.rename(base / "moved")
        (base / "owner").mkdir()
        (base / "owner" / "decoy").write_text("swapped in\n")
        staged = idmap_mounts.stage_idmapped(
            source_fd, base / "stage" / "fd", userns_fd=userns_fd, read_only=True, noexec=True
        )
    finally:
        os.close(source_fd)
    assert sorted(os.listdir(staged.target)) == ["prog", "secret", "shared-group", "theirs"]
    assert staged.source == str(base / "moved")


def test_file_grant_is_mounted_on_a_file(base: Path, owner_dir: Path, userns_fd: int) -> None:
    idmap_mounts.make_staging_dir(base / "stage", gid=SANDBOX)
    staged = idmap_mounts.stage_idmapped(
        owner_dir / "secret",
        base / "stage" / "one",
        userns_fd=userns_fd,
        read_only=True,
        noexec=True,
    )
    assert as_sandbox("/bin/cat", staged.target).stdout == SECRET.decode()
    idmap_mounts.unmount(Path(staged.target))
    assert not os.path.lexists(staged.target)


def test_submount_under_the_grant_does_not_come_along(stage: Stage, owner_dir: Path) -> None:
    (owner_dir / "sub").mkdir()
    subprocess.run(["/usr/bin/mount", "-t", "tmpfs", "tmpfs", str(owner_dir / "sub")], check=True)
    try:
        (owner_dir / "sub" / "on-the-submount").write_text("x")
        assert os.listdir(f"{stage('rw').target}/sub") == []
    finally:
        subprocess.run(["/usr/bin/umount", str(owner_dir / "sub")], check=True)


def test_clone_of_a_shared_mount_is_private(base: Path, userns_fd: int) -> None:
    shared = base / "shared"
    shared.mkdir()
    subprocess.run(["/usr/bin/mount", "-t", "tmpfs", "-o", "mode=700", "t", shared], check=True)
    subprocess.run(["/usr/bin/mount", "--make-shared", shared], check=True)
    staged = idmap_mounts.stage_idmapped(
        shared, base / "stage" / "s", userns_fd=userns_fd, read_only=False, noexec=True
    )
    assert "shared:" in _mountinfo(shared)
    optional = _mountinfo(Path(staged.target)).split(" - ")[0].split()[6:]
    assert optional == []


def test_remount_exec_from_the_sandboxs_own_userns_is_refused(stage: Stage) -> None:
    staged = stage("noexec", read_only=True, noexec=True)
    for options in ("remount,bind,exec", "remount,bind,rw"):
        result = as_sandbox(
            "/usr/bin/unshare", "-r", "-m", "--", "/usr/bin/mount", "-o", options, staged.target
        )
        assert result.returncode != 0, options
        assert "permission denied" in result.stderr


def _bwrap(staged: StagedMount, script: str) -> subprocess.CompletedProcess[str]:
    return as_sandbox(
        "/usr/bin/bwrap", "--unshare-all", "--die-with-parent",
        "--ro-bind", "/usr", "/usr", "--symlink", "usr/lib64", "/lib64",
        "--symlink", "usr/lib", "/lib", "--symlink", "usr/bin", "/bin",
        "--bind", staged.target, "/work", "--proc", "/proc", "--dev", "/dev",
        "--", "/bin/sh", "-c", script,
    )  # fmt: skip


def test_bwrap_bind_keeps_noexec_and_sees_owners_files_as_its_own(
    stage: Stage, owner_dir: Path
) -> None:
    loader = _elf_interpreter("/usr/bin/true")
    result = _bwrap(
        stage("noexec", noexec=True),
        f"""stat -c %u /work/secret; id -u; cat /work/secret; echo made > /work/made
        grep ' /work ' /proc/self/mountinfo
        /work/prog && echo EXEC-RAN; {loader} /work/prog && echo LOADER-RAN; true""",
    )
    lines = result.stdout.splitlines()
    assert lines[0] == lines[1] == str(SANDBOX), result.stderr
    assert lines[2] == SECRET.decode().strip()
    assert "noexec" in lines[3].split()[5] and "nosuid" in lines[3].split()[5]
    assert "EXEC-RAN" not in result.stdout and "LOADER-RAN" not in result.stdout
    assert "failed to map segment" in result.stderr
    assert os.stat(owner_dir / "made").st_uid == OWNER


def test_bwrap_bind_keeps_read_only(stage: Stage, owner_dir: Path) -> None:
    result = _bwrap(stage("ro", read_only=True), "grep ' /work ' /proc/self/mountinfo; : > /work/x")
    assert result.stdout.split()[5].split(",")[0] == "ro"
    assert result.returncode != 0 and "Read-only file system" in result.stderr
    assert not (owner_dir / "x").exists()


def test_tmpfs_is_the_sandboxs_own_noexec_and_bounded(base: Path) -> None:
    idmap_mounts.make_staging_dir(base / "stage", gid=SANDBOX)
    staged = idmap_mounts.stage_tmpfs(
        base / "stage" / "tmp", uid=SANDBOX, gid=SANDBOX, size_bytes=1 << 20
    )
    info = os.stat(staged.target)
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (SANDBOX, SANDBOX, 0o700)
    prog = f"{staged.target}/prog"
    assert as_sandbox("/bin/cp", "/usr/bin/true", prog).returncode == 0
    assert as_sandbox(prog).returncode != 0
    assert as_sandbox(_elf_interpreter("/usr/bin/true"), prog).returncode != 0
    assert sandbox_python(TRY_MMAP, prog, "exec") == "EPERM"
    too_big = as_sandbox("/bin/dd", "if=/dev/zero", f"of={staged.target}/big", "bs=1M", "count=2")
    assert "No space left on device" in too_big.stderr
    assert "nosuid,nodev,noexec" in _mountinfo(Path(staged.target))
    idmap_mounts.unmount(Path(staged.target))
    assert staged.target not in _mount_points()


def test_empty_map_is_refused() -> None:
    with pytest.raises(LaunchRefused, match="empty"):
        idmap_mounts.make_userns_fd((), ((OWNER, SANDBOX, 1),))


def _children() -> set[str]:
    tasks = Path("/proc/self/task")
    return {
        pid for tid in os.listdir(tasks) for pid in (tasks / tid / "children").read_text().split()
    }


def test_userns_fd_is_a_new_namespace_and_leaves_no_child() -> None:
    before = _children()  # another test's leftover is that test's failure, not this one's
    fd = idmap_mounts.make_userns_fd(((OWNER, SANDBOX, 1),), ((OWNER, SANDBOX, 1),))
    try:
        assert os.fstat(fd).st_ino != os.stat("/proc/self/ns/user").st_ino
        assert not os.get_inheritable(fd)
    finally:
        os.close(fd)
    assert _children() <= before


def test_check_support_passes_here_and_names_a_filesystem_without_it(base: Path) -> None:
    idmap_mounts.check_support(base)
    with pytest.raises(LaunchRefused, match=r"MOUNT_ATTR_IDMAP\) are not supported .*: EINVAL"):
        idmap_mounts.check_support("/proc")


def test_userns_stage_and_unmount_again_and_again_leave_nothing(
    base: Path, owner_dir: Path
) -> None:
    # How long this takes is bench/sandbox_start.py's to show, beside bare bwrap in the same run:
    # a timed test fails on a loaded machine and proves nothing a benchmark would not.
    for index in range(10):
        fd = idmap_mounts.make_userns_fd(((OWNER, SANDBOX, 1),), ((OWNER, SANDBOX, 1),))
        target = base / "stage" / f"t{index}"
        idmap_mounts.stage_idmapped(owner_dir, target, userns_fd=fd, read_only=True, noexec=True)
        os.close(fd)
        idmap_mounts.unmount(target)
        assert not os.path.ismount(target)


def test_noexec_view_of_usr_maps_only_what_is_mounted_exec_capable_in_it(base: Path) -> None:
    """/usr's clone is noexec; the loader's folder and one program mounted in it stay
    exec-capable, and the loader maps nothing else of /usr (the loader gap, closed)."""
    loader = os.path.realpath(_elf_interpreter("/usr/bin/true"))
    target = base / "staging" / "usr"
    over = (os.path.dirname(loader), "/usr/bin/true")
    idmap_mounts.make_staging_dir(target.parent, gid=SANDBOX)  # as a launch makes it: 0710
    idmap_mounts.stage_noexec_tree("/usr", target, over)
    inside_true, inside_false = target / "bin" / "true", target / "bin" / "false"
    view_loader = str(target / os.path.relpath(loader, "/usr"))
    assert as_sandbox(view_loader, str(inside_true)).returncode == 0
    refused = as_sandbox(view_loader, str(inside_false))
    assert refused.returncode != 0
    assert "failed to map segment" in refused.stderr
    assert as_sandbox(str(inside_false)).returncode != 0  # nor run directly
    assert "noexec" in _mountinfo(target).split()[5]
    idmap_mounts.unmount(target)
    assert not [p for p in _mount_points() if p.startswith(str(target))]


def test_noexec_view_refuses_a_path_outside_its_source(base: Path) -> None:
    target = base / "staging" / "usr"
    with pytest.raises(StateError, match="not under /usr"):
        idmap_mounts.stage_noexec_tree("/usr", target, ("/etc",))
    idmap_mounts.unmount(target)


def test_one_detach_of_the_staging_root_takes_every_mount_staged_in_it(
    base: Path, owner_dir: Path, userns_fd: int
) -> None:
    """The clean-up's one unmount of a sandbox's staging: a grant, a tmpfs and a /usr view
    staged in it all leave the mount table with it; their points are then plain folders."""
    staging = base / "stage"
    idmap_mounts.make_staging_dir(staging, gid=SANDBOX)
    idmap_mounts.mount_staging_root(staging)
    assert str(staging) in _mount_points()
    info = os.stat(staging)  # the bind is the very folder: still root's, 0710, the sandbox's
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (0, SANDBOX, 0o710)
    grant = staging / "g0"
    idmap_mounts.stage_idmapped(owner_dir, grant, userns_fd=userns_fd, read_only=False, noexec=True)
    idmap_mounts.stage_tmpfs(staging / "tmp", uid=SANDBOX, gid=SANDBOX, size_bytes=1 << 20)
    idmap_mounts.stage_noexec_tree("/usr", staging / "usr")
    inside = [p for p in _mount_points() if p.startswith(f"{staging}/")]
    assert {str(grant), f"{staging}/tmp", f"{staging}/usr"} <= set(inside)
    idmap_mounts.detach(staging)
    assert [p for p in _mount_points() if p == str(staging) or p.startswith(f"{staging}/")] == []
    for name in ("g0", "tmp", "usr"):
        idmap_mounts.unmount(staging / name)  # nothing mounted: only the point is removed
        assert not os.path.lexists(staging / name)
    idmap_mounts.detach(staging)  # again: nothing there is no error
    staging.rmdir()
