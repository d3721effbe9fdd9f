"""Granted folders for a fresh sandbox uid: idmapped mounts, and noexec tmpfs for /tmp and /dev/shm.

Why idmapped mounts (and not POSIX ACLs): the controller clones a granted folder's mount
(`open_tree`), marks the clone with a user namespace that maps owner uid/gid -> sandbox uid/gid
(`mount_setattr(MOUNT_ATTR_IDMAP)`) and attaches it in a staging dir (`move_mount`) that bwrap,
running as the sandbox uid, binds from. Through that mount the owner's `0600` files are the
sandbox's own, and files the sandbox creates land on disk owned by the owner. Nothing is
written to the owner's files: no ACL to add, to forget to remove, or to leak to a later
sandbox; when the mount goes, the access goes with it.

Trusts: the kernel; the caller for the maps, the paths (already checked against the spec's
refusals, links resolved) and for running as root in the initial namespaces.

What it does: `make_userns_fd` makes a user namespace with the given maps (a short-lived
`unshare --user` child: the controller is multi-threaded, so no fork and no unshare of its own);
`stage_idmapped` clones one mount, never its submounts, makes the clone private, idmapped,
nosuid, nodev, read-only and noexec on request, and attaches it at a fresh mount point in a
root-owned staging dir only the sandbox may traverse (`make_staging_dir`: `0710`, its group the
sandbox's; no other user reaches a granted folder through it), which `mount_staging_root` binds
onto itself so that one `detach` of it unmounts everything staged in it; `stage_tmpfs` attaches
a fresh nosuid/nodev/noexec tmpfs there; `unmount` detaches and removes the mount point.

Security limitations: this module does NOT
- show submounts of a granted folder: the clone is not recursive, so the sandbox sees the
  directories under them (what they hide on the granted filesystem), never another filesystem;
- make files of any other uid or gid writable: ids the map lacks read as 65534 and the kernel
  refuses every write to such a file, even one of the owner's whose group is not mapped;
- stop the sandbox from reading what "other" bits allow of third-party files in the grant;
- let an unmapped uid (root here) create files through the mount: that fails with EOVERFLOW;
- work on filesystems without idmap support (e.g. NFS): `check_support(path)` says so;
- remove the copies bwrap made inside a sandbox's own mount namespace: they go with it;
- keep a staged mount out of other namespaces if the staging dir sits on a shared mount (as
  `/` is under systemd): its peers receive it. Put the staging root on a private mount.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import stat
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from lnk_shared.errors import LaunchRefused, StateError

__all__ = [
    "StagedMount",
    "check_support",
    "detach",
    "make_staging_dir",
    "make_userns_fd",
    "mount_staging_root",
    "stage_bind",
    "stage_idmapped",
    "stage_noexec_tree",
    "stage_tmpfs",
    "unmount",
]

# Syscall numbers: the same on x86_64 and aarch64 (every syscall from 424 on has one number on
# all architectures but alpha).
_SYS_OPEN_TREE = 428
_SYS_MOVE_MOUNT = 429
_SYS_FSOPEN = 430
_SYS_FSCONFIG = 431
_SYS_FSMOUNT = 432
_SYS_MOUNT_SETATTR = 442

_OPEN_TREE_CLONE = 1  # a detached copy of the mount, not the mount itself
_OPEN_TREE_CLOEXEC = os.O_CLOEXEC  # no leak into children
_AT_FDCWD = -100  # a path relative to the current folder (absolute here)
_AT_EMPTY_PATH = 0x1000  # act on the fd itself (no path lookup, so no TOCTOU)
_AT_RECURSIVE = 0x8000  # the whole tree of mounts: clone submounts, set attributes on all
_MOVE_MOUNT_F_EMPTY_PATH = 0x4  # the mount to move is the fd; the target is never followed
_FSOPEN_CLOEXEC = 1  # no leak into children
_FSMOUNT_CLOEXEC = 1  # no leak into children
_FSCONFIG_SET_STRING = 1  # a "key=value" option
_FSCONFIG_CMD_CREATE = 6  # make the superblock from the options given
_MNT_DETACH = 2  # lazy unmount: works while a sandbox still has files open
_UMOUNT_NOFOLLOW = 8  # never unmount what a link at the target points to
_MS_PRIVATE = 1 << 18  # the clone neither sends nor receives mount events

MOUNT_ATTR_RDONLY = 0x1  # read grants: writes fail with EROFS
MOUNT_ATTR_NOSUID = 0x2  # always: no setuid or file capabilities from a grant
MOUNT_ATTR_NODEV = 0x4  # always: no device nodes from a grant
MOUNT_ATTR_NOEXEC = 0x8  # no execve and no mmap(PROT_EXEC), so no `ld.so ./prog` either
MOUNT_ATTR_IDMAP = 0x100000  # ids seen through the mount go through the userns_fd's maps
_MOUNT_ATTR_SIZE_VER0 = 32  # sizeof(struct mount_attr), first version

_MAX_MAP_LINES = 340  # the kernel's limit on lines in uid_map/gid_map since 4.15
_MAX_ID = 2**32 - 2  # (uid_t)-1 is "no id" and can never be mapped
_USERNS_WAIT_S = 2.0  # bound on waiting for the child to enter its new namespace
_USERNS_POLL_S = 0.0001  # between looks at /proc/<pid>/ns/user (it takes ~1 ms)
_MAX_STACKED = 16  # mounts `unmount` peels off one target before giving up
# A sandbox's staging dir: root's, its group the sandbox's, so the sandbox (bwrap, as its uid)
# traverses it and no other user reaches the granted folders (or the sandbox's /tmp) through it.
_STAGING_MODE = 0o710
_NEW_STAGING_MODE = 0o700  # one made on the way, for a caller that did not make it: root's alone
_MOUNT_POINT_MODE = 0o700  # hidden by the mount; only matters before and after
_UNSHARE = "/usr/bin/unshare"  # util-linux, root-owned; absolute so PATH plays no part
_SLEEP = "/bin/sleep"  # what the namespace child waits in until killed
_CHILD_LIFETIME_S = 10  # outlives the wait; if the controller dies first, the child ends alone

IdMap = tuple[tuple[int, int, int], ...]


class _MountAttr(ctypes.Structure):
    """struct mount_attr (include/uapi/linux/mount.h)."""

    _fields_ = (
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    )


@dataclass(frozen=True)
class StagedMount:
    """A mount attached at `target` for bwrap to bind; `source` is where it came from."""

    source: str
    target: str
    read_only: bool
    noexec: bool


@functools.cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    libc.umount2.argtypes = (ctypes.c_char_p, ctypes.c_int)
    return libc


def _errname(number: int) -> str:
    return errno.errorcode.get(number, f"errno {number}")


def _c(value: object) -> object:
    """A syscall argument as C sees it: ints as long (full register), bytes as char *."""
    if isinstance(value, int):
        return ctypes.c_long(value)
    return ctypes.c_char_p(value) if value is None or isinstance(value, bytes) else value


def _syscall(name: str, number: int, *args: object) -> int:
    """Make a raw syscall; ENOSYS is a missing capability, any other failure an OSError."""
    ctypes.set_errno(0)
    result = int(_libc().syscall(ctypes.c_long(number), *(_c(arg) for arg in args)))
    if result < 0:
        err = ctypes.get_errno()
        if err == errno.ENOSYS:
            raise LaunchRefused(name, f"the kernel has no {name} syscall (needs Linux >= 5.12)")
        raise OSError(err, f"{name}: {os.strerror(err)}")
    return result


def _check_map(name: str, lines: IdMap) -> str:
    if not lines:
        raise LaunchRefused("user namespace map", f"{name} is empty: it would map nobody")
    if len(lines) > _MAX_MAP_LINES:
        raise LaunchRefused("user namespace map", f"{name} has over {_MAX_MAP_LINES} lines")
    for inside, outside, count in lines:
        if count < 1 or min(inside, outside) < 0 or max(inside, outside) + count - 1 > _MAX_ID:
            raise LaunchRefused("user namespace map", f"{name} line {inside} {outside} {count}")
    return "".join(f"{inside} {outside} {count}\n" for inside, outside, count in lines)


def make_userns_fd(uid_map: IdMap, gid_map: IdMap) -> int:
    """An fd (O_CLOEXEC) of a new user namespace with these "inside outside count" maps.

    For an idmapped mount, "inside" is the id on disk and "outside" the id seen through the
    mount: owner -> sandbox is `((owner, sandbox, 1),)`. Close the fd once the mounts are
    staged (each idmapped mount keeps its own reference); one fd serves all of a sandbox's
    grants. Root writes gid_map without "deny" in setgroups: it has CAP_SETGID above it.
    """
    uid_text, gid_text = _check_map("uid_map", uid_map), _check_map("gid_map", gid_map)
    ours = os.stat("/proc/self/ns/user").st_ino
    argv = [_UNSHARE, "--user", "--", _SLEEP, str(_CHILD_LIFETIME_S)]
    quiet = subprocess.DEVNULL
    try:
        child = subprocess.Popen(argv, stdin=quiet, stdout=quiet, stderr=quiet, env={})
    except OSError as exc:
        raise LaunchRefused("user namespaces", f"cannot run {_UNSHARE}: {exc}") from exc
    try:
        ns_path = f"/proc/{child.pid}/ns/user"
        deadline = time.monotonic() + _USERNS_WAIT_S
        while os.stat(ns_path).st_ino == ours:
            if child.poll() is not None:
                raise LaunchRefused("user namespaces", f"{_UNSHARE} --user exited {child.poll()}")
            if time.monotonic() > deadline:
                raise StateError(f"no new user namespace after {_USERNS_WAIT_S}s from {_UNSHARE}")
            time.sleep(_USERNS_POLL_S)
        for name, text in (("uid_map", uid_text), ("gid_map", gid_text)):
            map_fd = os.open(f"/proc/{child.pid}/{name}", os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.write(map_fd, text.encode())
            finally:
                os.close(map_fd)
        return os.open(ns_path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise StateError(f"cannot make a user namespace: {exc}") from exc
    finally:
        child.kill()
        child.wait()


def make_staging_dir(path: Path, *, gid: int) -> None:
    """Make a sandbox's staging dir (or take over one made on the way): root's, group `gid`,
    mode 0710, so only that sandbox's user (and root) may traverse it."""
    try:
        os.mkdir(path, _NEW_STAGING_MODE)
    except FileExistsError:
        pass
    except OSError as exc:
        raise StateError(f"cannot make staging dir {path}: {exc}") from exc
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise StateError(f"staging dir {path} cannot be opened as a real dir: {exc}") from exc
    try:
        if os.fstat(fd).st_uid != 0:
            raise StateError(f"staging dir {path} is not root's: remove it")
        os.fchown(fd, 0, gid)
        os.fchmod(fd, _STAGING_MODE)
    finally:
        os.close(fd)


def _open_staging(target: Path) -> int:
    """An O_PATH fd of target's parent: made root's alone (0700) if missing, refused unless
    root-owned with no access for other users (0700, or 0710 from `make_staging_dir`)."""
    if not target.is_absolute() or target.name in ("", ".", ".."):
        raise StateError(f"staging target {target} must be an absolute path to a new entry")
    parent = target.parent
    try:
        os.mkdir(parent, _NEW_STAGING_MODE)
        os.chmod(parent, _NEW_STAGING_MODE)  # mkdir's mode passed through the umask
    except FileExistsError:
        pass
    try:
        fd = os.open(parent, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise StateError(f"staging dir {parent} cannot be opened as a real dir: {exc}") from exc
    info = os.fstat(fd)
    if info.st_uid != 0 or stat.S_IMODE(info.st_mode) not in (_STAGING_MODE, _NEW_STAGING_MODE):
        os.close(fd)
        raise StateError(
            f"staging dir {parent} is owned by uid {info.st_uid} with mode "
            f"{stat.S_IMODE(info.st_mode):o}; it must be root's with mode {_STAGING_MODE:o}"
        )
    return fd


def _make_mount_point(parent_fd: int, target: Path, *, is_dir: bool) -> None:
    try:
        if is_dir:
            os.mkdir(target.name, _MOUNT_POINT_MODE, dir_fd=parent_fd)
        else:
            flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC
            os.close(os.open(target.name, flags, _MOUNT_POINT_MODE, dir_fd=parent_fd))
    except FileExistsError as exc:
        what = "a link" if os.path.islink(target) else "already there"
        raise StateError(f"mount point {target} is {what}: unmount() it first") from exc
    except OSError as exc:
        raise StateError(f"cannot make mount point {target}: {exc}") from exc


def _attach(mount_fd: int, parent_fd: int, target: Path, *, is_dir: bool) -> None:
    """Move the detached mount onto a new mount point; removes the point if that fails."""
    _make_mount_point(parent_fd, target, is_dir=is_dir)
    try:
        name = os.fsencode(target.name)
        flags = _MOVE_MOUNT_F_EMPTY_PATH
        _syscall("move_mount", _SYS_MOVE_MOUNT, mount_fd, b"", parent_fd, name, flags)
    except OSError as exc:
        (os.rmdir if is_dir else os.unlink)(target.name, dir_fd=parent_fd)
        raise StateError(f"cannot attach a mount at {target}: {exc}") from exc


def _clone_idmapped(source_fd: int, userns_fd: int, attrs: int) -> int:
    """A detached, private, idmapped clone of the mount at source_fd (submounts left out)."""
    flags = _OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC | _AT_EMPTY_PATH
    tree_fd = _syscall("open_tree", _SYS_OPEN_TREE, source_fd, b"", flags)
    attr = _MountAttr(attrs | MOUNT_ATTR_IDMAP, 0, _MS_PRIVATE, userns_fd)
    try:
        size = _MOUNT_ATTR_SIZE_VER0
        _syscall(
            "mount_setattr",
            _SYS_MOUNT_SETATTR,
            tree_fd,
            b"",
            _AT_EMPTY_PATH,
            ctypes.byref(attr),
            size,
        )
    except OSError as exc:
        os.close(tree_fd)
        raise LaunchRefused(
            "idmapped mounts",
            "idmapped mounts (mount_setattr MOUNT_ATTR_IDMAP) are not supported on this "
            f"kernel/filesystem: {_errname(exc.errno or 0)}",
        ) from exc
    return tree_fd


def _open_source(path: str | os.PathLike[str]) -> int:
    """O_PATH fd of path; a link as its last component is refused, never followed."""
    return os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)


def stage_idmapped(
    source: int | str | os.PathLike[str],
    target: Path,
    *,
    userns_fd: int,
    read_only: bool,
    noexec: bool,
) -> StagedMount:
    """Attach an idmapped clone of `source` (an open O_PATH/O_DIRECTORY fd, or a path whose
    last component must not be a link) at `target`, a new entry in a staging dir
    (`make_staging_dir`). A file source gets a file mount point. Raises `LaunchRefused` or
    `StateError`."""
    attrs = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV
    attrs |= MOUNT_ATTR_RDONLY if read_only else 0
    attrs |= MOUNT_ATTR_NOEXEC if noexec else 0
    own_fd = not isinstance(source, int)
    source_fd = parent_fd = tree_fd = -1
    try:
        try:
            source_fd = source if isinstance(source, int) else _open_source(source)
            source_name = os.readlink(f"/proc/self/fd/{source_fd}")
            source_mode = os.fstat(source_fd).st_mode
        except OSError as exc:
            raise StateError(f"cannot open grant source {source!r}: {exc}") from exc
        if stat.S_ISLNK(source_mode):
            raise StateError(f"grant source {source_name} is a link: pass where it points")
        if not (stat.S_ISDIR(source_mode) or stat.S_ISREG(source_mode)):
            raise StateError(f"grant source {source_name} is not a directory or regular file")
        parent_fd = _open_staging(target)
        try:
            tree_fd = _clone_idmapped(source_fd, userns_fd, attrs)
        except OSError as exc:
            raise StateError(f"cannot clone the mount of {source_name}: {exc}") from exc
        _attach(tree_fd, parent_fd, target, is_dir=stat.S_ISDIR(source_mode))
    finally:
        for fd in (tree_fd, parent_fd, source_fd if own_fd else -1):
            if fd >= 0:
                os.close(fd)
    return StagedMount(source_name, str(target), read_only, noexec)


def stage_bind(source: Path, target: Path, *, is_dir: bool = False) -> StagedMount:
    """Attach a plain (not idmapped) clone of the file (or folder) at `source` at `target`: how
    a proxy listener in the proxy's 0700 folder (or an agent's bridge folder) becomes reachable
    for the sandbox's bwrap to bind."""
    parent_fd = _open_staging(target)
    tree_fd = -1
    try:
        try:
            flags = _OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC
            tree_fd = _syscall("open_tree", _SYS_OPEN_TREE, _AT_FDCWD, os.fsencode(source), flags)
        except OSError as exc:
            raise StateError(f"cannot clone the mount of {source}: {exc}") from exc
        _attach(tree_fd, parent_fd, target, is_dir=is_dir)
    finally:
        for fd in (tree_fd, parent_fd):
            if fd >= 0:
                os.close(fd)
    return StagedMount(str(source), str(target), False, True)


def _clone_with(path: str, attrs: int, *, recursive: bool) -> int:
    """A detached, private clone of the mount at `path` with `attrs` set (on every mount of
    the tree when `recursive`)."""
    flags = _OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC | (_AT_RECURSIVE if recursive else 0)
    tree_fd = _syscall("open_tree", _SYS_OPEN_TREE, _AT_FDCWD, os.fsencode(path), flags)
    try:
        attr = _MountAttr(attrs, 0, _MS_PRIVATE, 0)
        where = _AT_EMPTY_PATH | (_AT_RECURSIVE if recursive else 0)
        size = _MOUNT_ATTR_SIZE_VER0
        _syscall("mount_setattr", _SYS_MOUNT_SETATTR, tree_fd, b"", where, ctypes.byref(attr), size)
    except BaseException:
        os.close(tree_fd)
        raise
    return tree_fd


def stage_noexec_tree(source: str, target: Path, exec_over: tuple[str, ...] = ()) -> StagedMount:
    """Attach a read-only, nosuid, nodev, noexec, private clone of the mount tree at `source`
    (a root-owned system folder such as /usr, submounts included) at `target`, then mount an
    exec-capable (read-only, nosuid, nodev) clone of each path of `exec_over` (real paths under
    `source`, outer first) over its place in it: bwrap binds the whole view with one bind.
    Nothing else under it can be run or mapped as code (`exec_mounts.py`). Raises
    `LaunchRefused` (no new mount API) or `StateError`; a half-made view is unmounted by the
    caller's clean-up through `target`, recorded before this runs."""
    base = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV
    parent_fd = _open_staging(target)
    tree_fd = -1
    try:
        try:
            tree_fd = _clone_with(source, base | MOUNT_ATTR_NOEXEC, recursive=True)
        except OSError as exc:
            raise StateError(f"cannot make a noexec clone of {source}: {exc}") from exc
        _attach(tree_fd, parent_fd, target, is_dir=True)
    finally:
        for fd in (tree_fd, parent_fd):
            if fd >= 0:
                os.close(fd)
    for path in exec_over:
        relative = os.path.relpath(path, source)
        if relative.startswith("..") or os.path.isabs(relative):
            raise StateError(f"{path} is not under {source}: it cannot be made exec-capable")
        over = os.fsencode(target / relative)
        over_fd = -1
        try:
            over_fd = _clone_with(path, base, recursive=False)
            flags = _MOVE_MOUNT_F_EMPTY_PATH  # the last component of `over` is never followed
            _syscall("move_mount", _SYS_MOVE_MOUNT, over_fd, b"", _AT_FDCWD, over, flags)
        except OSError as exc:
            raise StateError(f"cannot make {path} exec-capable in {target}: {exc}") from exc
        finally:
            if over_fd >= 0:
                os.close(over_fd)
    return StagedMount(source, str(target), True, True)


def stage_tmpfs(
    target: Path, *, uid: int, gid: int, size_bytes: int, noexec: bool = True
) -> StagedMount:
    """Attach a fresh tmpfs (mode 0700, owned uid:gid, at most size_bytes) at `target`.

    For the sandbox's /tmp and /dev/shm: noexec there means nothing written can be run or
    mmapped executable. Raises `LaunchRefused` (no new mount API) or `StateError`.
    """
    if size_bytes < 1 or min(uid, gid) < 0 or max(uid, gid) > _MAX_ID:
        raise StateError(f"tmpfs for {target}: bad size {size_bytes} or owner {uid}:{gid}")
    attrs = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | (MOUNT_ATTR_NOEXEC if noexec else 0)
    options = {"mode": "0700", "uid": str(uid), "gid": str(gid), "size": str(size_bytes)}
    parent_fd = _open_staging(target)
    fs_fd = mount_fd = -1
    try:
        fs_fd = _syscall("fsopen", _SYS_FSOPEN, b"tmpfs", _FSOPEN_CLOEXEC)
        for key, value in options.items():
            set_string = _FSCONFIG_SET_STRING
            _syscall("fsconfig", _SYS_FSCONFIG, fs_fd, set_string, key.encode(), value.encode(), 0)
        _syscall("fsconfig", _SYS_FSCONFIG, fs_fd, _FSCONFIG_CMD_CREATE, None, None, 0)
        mount_fd = _syscall("fsmount", _SYS_FSMOUNT, fs_fd, _FSMOUNT_CLOEXEC, attrs)
        _attach(mount_fd, parent_fd, target, is_dir=True)
    except OSError as exc:
        raise StateError(f"cannot make a tmpfs for {target}: {exc}") from exc
    finally:
        for fd in (mount_fd, fs_fd, parent_fd):
            if fd >= 0:
                os.close(fd)
    return StagedMount("tmpfs", str(target), False, noexec)


def mount_staging_root(path: Path) -> None:
    """Bind a sandbox's staging dir (`make_staging_dir`) onto itself, a private mount, so
    every mount staged in it afterwards is a submount of it and `detach(path)` takes them all
    in one unmount: the kernel waits for one RCU grace period per unmount, 3-4 ms on a loaded
    host, and a write grant's sandbox stages five to seven mounts here."""
    tree_fd = -1
    try:
        tree_fd = _clone_with(str(path), 0, recursive=False)
        flags = _MOVE_MOUNT_F_EMPTY_PATH  # the last component of `path` is never followed
        _syscall("move_mount", _SYS_MOVE_MOUNT, tree_fd, b"", _AT_FDCWD, os.fsencode(path), flags)
    except OSError as exc:
        raise StateError(f"cannot mount staging dir {path} onto itself: {exc}") from exc
    finally:
        if tree_fd >= 0:
            os.close(tree_fd)


def detach(target: Path) -> None:
    """Detach every mount on `target` (lazily), with the mounts below it; the mount point
    stays. Idempotent: nothing mounted there is no error."""
    libc = _libc()
    encoded = os.fsencode(target)
    for _ in range(_MAX_STACKED):
        ctypes.set_errno(0)
        if libc.umount2(encoded, _MNT_DETACH | _UMOUNT_NOFOLLOW) == 0:
            continue
        err = ctypes.get_errno()
        if err in (errno.EINVAL, errno.ENOENT):  # not (or no longer) a mount point
            break
        raise StateError(f"cannot unmount {target}: {os.strerror(err)}")
    else:
        raise StateError(f"{target} still has mounts after {_MAX_STACKED} unmounts")


def unmount(target: Path) -> None:
    """Detach every mount on `target` (lazily) and remove the mount point. Idempotent."""
    detach(target)
    try:
        if stat.S_ISDIR(os.lstat(target).st_mode):
            os.rmdir(target)
        else:
            os.unlink(target)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise StateError(f"cannot remove mount point {target}: {exc}") from exc


def check_support(probe: str | os.PathLike[str] = "/") -> None:
    """Raise `LaunchRefused` unless the mount holding `probe` can be idmapped here."""
    userns_fd = make_userns_fd(((0, 65534, 1),), ((0, 65534, 1),))
    try:
        source_fd = os.open(probe, os.O_PATH | os.O_CLOEXEC)
    except OSError as exc:
        os.close(userns_fd)
        raise StateError(f"cannot open {probe} to probe idmapped mounts: {exc}") from exc
    try:
        os.close(_clone_idmapped(source_fd, userns_fd, MOUNT_ATTR_NOSUID))
    except OSError as exc:  # open_tree itself failed
        raise LaunchRefused(
            "idmapped mounts", f"open_tree(OPEN_TREE_CLONE) fails: {_errname(exc.errno or 0)}"
        ) from exc
    finally:
        os.close(source_fd)
        os.close(userns_fd)
