"""Fresh host users for sandboxes: a passwd and a group line each, a private home, and the end
of every process of the uid.

Trusts: the kernel's /proc, root's /etc (lines split on ':'), and its callers: the uids and
`HostUser`s it is given come from the controller's own records, never from a sandbox.

What it does: `create_user` appends `lnk-sbx-<uid>:*:<uid>:<uid>::<home>:/usr/sbin/nologin` to
/etc/passwd and `lnk-sbx-<uid>:*:<uid>:` to /etc/group (group first, so passwd never names a
missing group; removal goes the other way), then makes the home 0700. /etc/shadow and
/etc/gshadow get NO line: the `*` password field matches no password, so nothing logs in as the
user. It is a member of no group. The files are edited directly (the shadow tools take ~150 ms):
each is rewritten to a temp file in /etc with the original's mode and owner, fsynced, renamed
over it, and /etc fsynced; other lines keep their bytes and order. Edits re-read the files under
a process lock and the lock every shadow-utils tool takes: a write lock on /etc/.pwd.lock, as
glibc's `lckpwdf()` takes, but polled to a deadline, because `lckpwdf()` times out by SIGALRM,
which reaches the main thread only: called from another thread it waits forever (checked here).

Security limitations: does NOT
- exclude a program that edits /etc/passwd or /etc/group without that lock (a text editor);
- consult NSS sources other than the files when creating (LDAP, systemd): only
  `check_range_is_free` asks NSS, at start; group memberships such sources add are the
  launcher's `setgroups([])` to drop;
- copy xattrs or SELinux labels to the rewritten files, or flush nscd/sssd caches;
- find processes in another pid namespace than the controller's, or match the fs uid; nor stop
  root from starting a process of the uid while `remove_user` runs;
- remove a home that is, or holds, a link to elsewhere or a mount point: links inside are
  unlinked, never followed; a home that is a link, or has a mount under it, is refused.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import grp
import os
import pwd
import re
import select
import shutil
import signal
import stat
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from lnk_controller.uid_range import (
    BAD_IN_PASSWD,
    NAME_PREFIX,
    HostUser,
    UidRange,
    allocate_uid,
    check_uid,
    range_conflicts,
    user_name,
)
from lnk_shared.errors import StateError

__all__ = [
    "LOCK_TIMEOUT",
    "NAME_PREFIX",
    "HostUser",
    "UidRange",
    "allocate_uid",
    "check_range_is_free",
    "create_user",
    "ids_in_use",
    "kill_recorded_process",
    "kill_uid_processes",
    "list_lnk_users",
    "range_conflicts",
    "remove_user",
    "sandbox_user",
    "user_name",
]

SHELL = "/usr/sbin/nologin"  # refuses every login, even with a key
USERS_FILE = "/etc/passwd"
GROUPS_FILE = "/etc/group"
LOCK_FILE = "/etc/.pwd.lock"  # what glibc's lckpwdf, and so every shadow-utils tool, locks
LOCK_TIMEOUT = 15.0  # seconds: lckpwdf's own wait, so we give up no sooner than useradd does
_LOCK_POLL = 0.001  # seconds between tries: an edit holds the lock for about a millisecond
_HOMES_DIR_MODES = (0o711, 0o755)  # others may traverse homes_dir, only root may change it
_HOME_MODE = 0o700  # the home is the sandbox's alone
# (file, fields holding an id, fields listing members): a user is added only if none names it.
_TABLES = (
    (USERS_FILE, (2, 3), ()),
    (GROUPS_FILE, (2,), (3,)),
    ("/etc/shadow", (), ()),
    ("/etc/gshadow", (), (2, 3)),
)
_process_lock = threading.Lock()  # one waiter per process on the file lock, the rest wait here


def _fields(data: bytes) -> Iterator[list[bytes]]:
    return (line.split(b":") for line in data.split(b"\n") if line)


def _id(field: bytes) -> int:
    return int(field) if field.isdigit() else -1


def _read(path: str, *, missing_ok: bool = False) -> tuple[bytes, os.stat_result | None]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        if missing_ok:
            return b"", None
        raise
    with open(fd, "rb") as f:
        return f.read(), os.fstat(fd)


def _replace(path: str, data: bytes, like: os.stat_result) -> None:
    """Atomically replace `path` (in /etc) with `data`, keeping its mode and owner.

    The new file's data reaches the disk before the rename, so after a crash the file is the
    old one or the new one, never empty or torn. The folder is not fsynced (as useradd does
    not): a crash may then forget the rename itself, which leaves the file as it was before
    this edit: a sandbox user never made (its processes died with the machine), or one not yet
    removed, which the controller's reconcile removes at its next start. It halves the fsyncs
    of every launch's user edits, the largest part of making and removing its user."""
    folder, base = os.path.split(path)
    tmp = f"{folder}/.{base}.lnk-new"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)  # a crash's leftover: we hold the lock, nobody else writes it
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with open(fd, "wb") as f:
            os.fchown(fd, like.st_uid, like.st_gid)
            os.fchmod(fd, stat.S_IMODE(like.st_mode))
            f.write(data)
            f.flush()
            os.fsync(fd)
        os.rename(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def _etc_locked() -> Iterator[None]:
    deadline = time.monotonic() + LOCK_TIMEOUT
    busy = StateError(
        f"{LOCK_FILE} stayed locked for {LOCK_TIMEOUT:g} s: another tool (useradd, vipw, ...)"
        " is editing users; try again when it is done"
    )
    if not _process_lock.acquire(timeout=LOCK_TIMEOUT):
        raise busy
    try:
        fd = os.open(LOCK_FILE, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            whole_file = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
            while True:
                try:
                    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, whole_file)
                    break
                except OSError as e:
                    if e.errno not in (errno.EAGAIN, errno.EACCES):
                        raise
                if time.monotonic() >= deadline:
                    raise busy
                time.sleep(_LOCK_POLL)
            yield
        finally:
            os.close(fd)  # closing the description's only fd releases the lock
    finally:
        _process_lock.release()


def _edit(change: Callable[[str, bytes], bytes], order: tuple[str, ...]) -> None:
    """Under the lock, re-read each file of `order`, and replace it if `change` changes it."""
    with _etc_locked():
        for path in order:
            data, st = _read(path)
            new = change(path, data)
            if new != data and st is not None:
                _replace(path, new, st)


def _refuse_taken(uid: int) -> None:
    name, idb = user_name(uid).encode(), str(uid).encode()
    for path, id_fields, member_fields in _TABLES:
        for f in _fields(_read(path, missing_ok=True)[0]):
            ids = [f[i] for i in id_fields if i < len(f)]
            members = b",".join(f[i] for i in member_fields if i < len(f)).split(b",")
            if f[0] == name or idb in ids or name in members:
                owner = f[0].decode(errors="replace")
                raise StateError(f"uid {uid} is taken by {owner} in {path}; pick another uid")


def _with_user(user: HostUser) -> Callable[[str, bytes], bytes]:
    lines = {
        GROUPS_FILE: f"{user.name}:*:{user.gid}:",
        USERS_FILE: f"{user.name}:*:{user.uid}:{user.gid}::{user.home}:{SHELL}",
    }

    def change(path: str, data: bytes) -> bytes:
        if path == GROUPS_FILE:
            _refuse_taken(user.uid)  # before anything is written, with the lock held
        if data and not data.endswith(b"\n"):
            data += b"\n"
        return data + lines[path].encode() + b"\n"

    return change


def _without_user(user: HostUser) -> Callable[[str, bytes], bytes]:
    def change(path: str, data: bytes) -> bytes:
        kept = []
        for line in data.split(b"\n"):
            f = line.split(b":")
            if f[0] != user.name.encode():
                kept.append(line)
            elif len(f) < 4 or _id(f[2]) != user.uid:
                raise StateError(f"{path}: a {user.name} line not for uid {user.uid}: fix by hand")
        out = b"\n".join(kept)
        return out + b"\n" if out and not out.endswith(b"\n") else out

    return change


def _open_homes_dir(homes_dir: Path) -> int:
    bad = StateError(
        f"homes dir {homes_dir} must be an absolute path to a root-owned directory with mode"
        " 0711 or 0755, not a link, with no ':' or control character in its name"
    )
    if not homes_dir.is_absolute() or BAD_IN_PASSWD.search(str(homes_dir)):
        raise bad
    try:
        fd = os.open(homes_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise bad from e
    st = os.fstat(fd)
    if st.st_uid != 0 or stat.S_IMODE(st.st_mode) not in _HOMES_DIR_MODES:
        os.close(fd)
        raise bad
    return fd


def sandbox_user(uid: int, *, homes_dir: Path) -> HostUser:
    """The host user of a sandbox on `uid`, as `create_user` makes it: its name, gid == uid, and
    its home in `homes_dir` (nothing is read or made here)."""
    name = user_name(uid)
    return HostUser(name, uid, uid, str(homes_dir / name))


def create_user(uid: int, *, homes_dir: Path) -> HostUser:
    """Add the host user for `uid` (gid == uid) and its 0700 home `homes_dir/<name>`.

    Raises StateError if the name, uid or gid is in any passwd, group, shadow or gshadow line,
    or the home exists; nothing is left behind then.
    """
    user = sandbox_user(uid, homes_dir=homes_dir)
    name = user.name
    parent = _open_homes_dir(homes_dir)
    try:
        _edit(_with_user(user), (GROUPS_FILE, USERS_FILE))
        try:
            os.mkdir(name, _HOME_MODE, dir_fd=parent)
            home = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent)
            try:
                os.fchown(home, uid, uid)
                os.fchmod(home, _HOME_MODE)
            finally:
                os.close(home)
        except BaseException:
            _edit(_without_user(user), (USERS_FILE, GROUPS_FILE))
            raise
    except FileExistsError as e:
        raise StateError(
            f"home {homes_dir / name} already exists: remove it, or pick another uid"
        ) from e
    except OSError as e:
        raise StateError(f"cannot create host user {name}: {e}") from e
    finally:
        os.close(parent)
    return user


def _mount_points() -> Iterator[bytes]:
    for line in _read("/proc/self/mountinfo")[0].splitlines():
        yield re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m[1], 8)]), line.split(b" ")[4])


def _remove_home(user: HostUser) -> None:
    home = Path(user.home)
    parent = _open_homes_dir(home.parent)
    try:
        try:
            st = os.stat(user.name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            return
        if not stat.S_ISDIR(st.st_mode) or st.st_uid not in (0, user.uid):
            raise StateError(f"{home} is a link, not a directory, or another user's: not removed")
        real = os.fsencode(os.path.realpath(home.parent) + "/" + user.name)
        if any(m == real or m.startswith(real + b"/") for m in _mount_points()):
            raise StateError(f"something is mounted at or under {home}: unmount it, then retry")
        shutil.rmtree(user.name, dir_fd=parent)  # fd-based: links inside are never followed
    finally:
        os.close(parent)


def remove_user(user: HostUser, *, processes_killed: bool = False) -> None:
    """Kill the uid's processes, remove the home (never through a link), then the lines.

    Removing a user that is already (partly) gone is fine. The caller must not start processes
    of the uid meanwhile; one that has just killed them (a scan found none left) says so with
    `processes_killed`, saving a second scan of /proc.
    """
    if not processes_killed:
        kill_uid_processes(user.uid)
    try:
        if user.home:
            _remove_home(user)
        _edit(_without_user(user), (USERS_FILE, GROUPS_FILE))
    except OSError as e:
        raise StateError(f"cannot remove host user {user.name}: {e}") from e


def _alive_with_uid(pid: int, uid: bytes) -> bool:
    """Whether `pid` is a live (not zombie) process whose real, effective or saved uid is `uid`."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            status = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return False
    uids, state = [], b"Z"
    for line in status.split(b"\n"):
        if line.startswith(b"Uid:"):
            uids = line.split()[1:4]
        elif line.startswith(b"State:"):
            state = line.split()[1]
    return state not in (b"Z", b"X") and uid in uids


def _uid_pidfds(uid_b: bytes) -> Iterator[tuple[int, int]]:
    """(pid, pidfd) for each live process of the uid; the uid is checked again after the pidfd
    is open, so a pid reused in between is never signalled. The caller closes each pidfd."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or not _alive_with_uid(pid := int(entry.name), uid_b):
            continue
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        if not _alive_with_uid(pid, uid_b):  # ended, or the pid was reused before the open
            os.close(pidfd)
            continue
        yield pid, pidfd


def kill_recorded_process(pid: int | None, start: int | None) -> bool:
    """SIGKILL the process recorded as (`pid`, its start time in clock ticks) if it is still
    that process, through a pidfd opened before the check, so a reused pid is never hit.
    Returns whether it was signalled."""
    if pid is None or start is None or pid <= 1:
        return False
    try:
        pidfd = os.pidfd_open(pid)
    except (ProcessLookupError, OSError):
        return False
    try:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            return False
        if int(fields[19]) != start:
            return False  # the pid is someone else's now
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        return True
    except ProcessLookupError:
        return False
    finally:
        os.close(pidfd)


def kill_uid_processes(uid: int, *, timeout: float = 5.0) -> int:
    """SIGKILL every process whose real, effective or saved uid is `uid`, through pidfds, until
    a scan of /proc finds none; return how many were signalled. StateError after `timeout`."""
    check_uid(uid)
    deadline, uid_b = time.monotonic() + timeout, str(uid).encode()
    killed: set[int] = set()
    while True:
        found: dict[int, int] = {}
        try:
            for pid, pidfd in _uid_pidfds(uid_b):
                found[pid] = pidfd
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                    killed.add(pid)
            if not found:
                return len(killed)
            if time.monotonic() >= deadline:
                pids = ", ".join(map(str, sorted(found)))
                raise StateError(
                    f"processes of uid {uid} still alive after {timeout:g} s: pids {pids};"
                    " see their state in /proc/<pid>/status"
                )
            for fd in found.values():  # a pidfd turns readable when its process has ended
                select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        except OSError as e:
            raise StateError(f"cannot kill the processes of uid {uid}: {e}") from e
        finally:
            for fd in found.values():
                os.close(fd)


def list_lnk_users() -> list[HostUser]:
    """Every lnk-sbx- user in /etc/passwd, and any group line left without one (home "").

    Raises StateError on an lnk-sbx- line that lnk box did not write (name and ids disagree).
    """
    users: dict[str, HostUser] = {}
    for path, gid_field, home_field in ((USERS_FILE, 3, 5), (GROUPS_FILE, 2, None)):
        for f in _fields(_read(path)[0]):
            name = f[0].decode(errors="replace")
            if name.startswith(NAME_PREFIX) and name not in users and len(f) > 3:
                home = os.fsdecode(f[home_field]) if home_field and len(f) > home_field else ""
                users[name] = HostUser(name, _id(f[2]), _id(f[gid_field]), home)
    return sorted(users.values(), key=lambda u: u.uid)


def _entries() -> Iterator[tuple[str, str, int]]:
    """(source, name, id) for every uid and gid of the files, then of NSS where it lists."""
    for path, id_fields in ((USERS_FILE, (2, 3)), (GROUPS_FILE, (2,))):
        for f in _fields(_read(path)[0]):
            yield from ((path, f[0].decode(errors="replace"), _id(f[i])) for i in id_fields)
    for p in pwd.getpwall():
        yield from (("passwd (NSS)", p.pw_name, p.pw_uid), ("passwd (NSS)", p.pw_name, p.pw_gid))
    yield from (("group (NSS)", g.gr_name, g.gr_gid) for g in grp.getgrall())


def ids_in_use() -> set[int]:
    """Every uid and gid that /etc/passwd, /etc/group or NSS lists: for `allocate_uid`."""
    return {i for _, _, i in _entries()}


def check_range_is_free(uid_range: UidRange) -> list[str]:
    """Conflicts of the range with /etc/passwd, /etc/group and NSS; empty when it is free."""
    return range_conflicts(uid_range, _entries())
