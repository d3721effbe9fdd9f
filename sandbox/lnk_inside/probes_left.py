"""Probe steps for what a sandbox leaves or runs: modes, ACLs, `/dev`, written libraries, ports,
and another process's descriptors.

Part of the probe program (`probes.py`, which merges `STEPS` into its own table), run INSIDE
the sandbox with the box's Python (standard library only). As there, each step reports
"through" when its attempt worked and decides nothing: the outside reads the modes left on
disk (`verdicts.py`). Files a step makes in a write folder are the plan's leftovers, removed
after the run.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import socket
import struct
import subprocess
from collections.abc import Callable
from typing import Any

__all__ = ["ACL_OTHER_WRITE", "STEPS"]

# A minimal POSIX ACL (user::rw-, group::r--, other::rw-) as the kernel's xattr format: it would
# give other users write, and set the mode's other-write bit as it does.
_ACL_VERSION = 2
_ACL_UNDEFINED_ID = 0xFFFFFFFF
ACL_OTHER_WRITE = struct.pack("<I", _ACL_VERSION) + b"".join(
    struct.pack("<HHI", tag, perm, _ACL_UNDEFINED_ID) for tag, perm in ((1, 6), (4, 4), (0x20, 6))
)
MAPS_TIMEOUT_S = 10  # the loader maps one program and exits: far under this on a loaded box
_ACL_ACCESS = "system.posix_acl_access"
_ACL_DEFAULT = "system.posix_acl_default"


def _result(got: list[str], errors: list[str]) -> dict[str, Any]:
    if got:
        return {"outcome": "through", "detail": ", ".join(got)[:200], "data": ""}
    return {"outcome": "stopped", "detail": "; ".join(errors)[:200], "data": ""}


def _errno_name(exc: OSError) -> str:
    return errno.errorcode.get(exc.errno or 0, str(exc)) if exc.errno else str(exc)


def _try_all(attempts: list[tuple[str, Callable[[], object]]]) -> dict[str, Any]:
    got: list[str] = []
    errors: list[str] = []
    for what, attempt in attempts:
        try:
            attempt()
            got.append(what)
        except OSError as exc:
            errors.append(f"{what}: {_errno_name(exc)}")
    return _result(got, errors)


def _new_file(path: str, mode: int = 0o644) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    os.close(os.open(path, flags, mode))


def _fchmod(path: str, mode: int) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def _file_and_folder(step: dict[str, Any]) -> tuple[str, str]:
    """The step's two paths, made as a plain file and a plain folder (if they can be)."""
    file, folder = step["paths"]
    with contextlib.suppress(OSError):
        _new_file(file)
    with contextlib.suppress(OSError):
        os.mkdir(folder, 0o755)
    return file, folder


def _set_id(step: dict[str, Any]) -> dict[str, Any]:
    """Leave a set-uid or set-gid program of the owner's: chmod, fchmod, or created so."""
    first, second = step["paths"]
    with contextlib.suppress(OSError):
        _new_file(first, 0o755)
    return _try_all(
        [
            ("chmod 04755", lambda: os.chmod(first, 0o4755)),  # noqa: S103 - the attack
            ("fchmod 02755", lambda: _fchmod(first, 0o2755)),
            ("create with mode 06755", lambda: _new_file(second, 0o6755)),
        ]
    )


def _shared(step: dict[str, Any]) -> dict[str, Any]:
    """Open the owner's data to other users: a file 0666, a folder 0777."""
    file, folder = _file_and_folder(step)
    return _try_all(
        [
            ("chmod 0666 a file", lambda: os.chmod(file, 0o666)),  # noqa: S103 - the attack
            ("chmod 0777 a folder", lambda: os.chmod(folder, 0o777)),  # noqa: S103 - the attack
        ]
    )


def _umask(step: dict[str, Any]) -> dict[str, Any]:
    """Clear the umask, then make a file 0666 and a folder 0777 (the filter cannot see the
    umask: the end-of-sandbox sweep must strip what this leaves)."""
    file, folder = step["paths"]
    old = os.umask(0)
    try:
        return _try_all(
            [
                ("create a file 0666", lambda: _new_file(file, 0o666)),
                ("make a folder 0777", lambda: os.mkdir(folder, 0o777)),
            ]
        )
    finally:
        os.umask(old)


def _acl(step: dict[str, Any]) -> dict[str, Any]:
    """Give other users write through a POSIX ACL (access on a file, default on a folder)."""
    file, folder = _file_and_folder(step)
    return _try_all(
        [
            (
                "setxattr system.posix_acl_access",
                lambda: os.setxattr(file, _ACL_ACCESS, ACL_OTHER_WRITE, follow_symlinks=False),
            ),
            (
                "setxattr system.posix_acl_default",
                lambda: os.setxattr(folder, _ACL_DEFAULT, ACL_OTHER_WRITE, follow_symlinks=False),
            ),
        ]
    )


def _dev_write(step: dict[str, Any]) -> dict[str, Any]:
    path = step["path"]
    _new_file(path)
    with contextlib.suppress(OSError):
        os.unlink(path)
    return {"outcome": "through", "detail": f"created {path}", "data": ""}


def _preload(step: dict[str, Any]) -> dict[str, Any]:
    """Write a copy of a shared library where the sandbox may write, then map it as code
    (what LD_PRELOAD into a granted program does): only a noexec mount or no write stops it."""
    with open(step["copy_from"], "rb") as f:
        data = f.read()
    fd = os.open(step["copy_to"], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o755)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    try:
        ctypes.CDLL(step["copy_to"])
    except OSError as exc:
        return {"outcome": "stopped", "detail": str(exc)[-120:], "data": ""}
    finally:
        with contextlib.suppress(OSError):
            os.unlink(step["copy_to"])
    return {"outcome": "through", "detail": "mapped as code", "data": ""}


def _maps(step: dict[str, Any]) -> dict[str, Any]:
    """The loader maps a program without running it (`ld.so --verify`): status 0 when its
    segments could be mapped as code, non-zero when a noexec mount refused them."""
    done = subprocess.run(step["argv"], capture_output=True, timeout=MAPS_TIMEOUT_S, check=False)
    if done.returncode == 0:
        return {"outcome": "through", "detail": "mapped as code", "data": ""}
    return {"outcome": "stopped", "detail": f"status {done.returncode}", "data": ""}


def _listen(step: dict[str, Any]) -> dict[str, Any]:
    """Take a port on the host: listen unbound (autobind), bind TCP, bind UDP, send UDP."""

    def autobind() -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.listen()

    def tcp_bind() -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("0.0.0.0", 0))  # noqa: S104 - the attack: a port on every address

    def udp_bind() -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind(("0.0.0.0", step["udp_port"]))  # noqa: S104 - the attack

    def udp_send() -> None:  # autobinds a port that receives from anyone
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.sendto(b"", ("127.0.0.1", step["udp_port"]))

    return _try_all(
        [
            ("listen on an unbound TCP socket", autobind),
            ("bind a TCP port", tcp_bind),
            (f"bind UDP port {step['udp_port']}", udp_bind),
            ("send from an unbound UDP socket", udp_send),
        ]
    )


# pidfd_getfd and kcmp by number (no libc wrapper): the generic table's, and x86_64's kcmp.
_PIDFD_GETFD = 438
_KCMP = {"x86_64": 312, "aarch64": 272}
_KCMP_FILE = 0


def _descriptor(step: dict[str, Any]) -> dict[str, Any]:
    """Take (`pidfd_getfd`) or compare (`kcmp`) a descriptor of a child of its own, which the
    kernel allows a parent of the same uid: only the filter refuses it (the relay, which is not
    dumpable, refuses it besides)."""
    libc = ctypes.CDLL(None, use_errno=True)
    call = step["call"]
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child only holds its pipe until told
        os.close(write_end)
        os.read(read_end, 1)
        os._exit(0)
    try:
        if call == "pidfd_getfd":
            pidfd = os.pidfd_open(child)
            try:
                got = libc.syscall(ctypes.c_long(_PIDFD_GETFD), pidfd, read_end, 0)
            finally:
                os.close(pidfd)
            if got >= 0:
                os.close(got)
        else:
            number = _KCMP[os.uname().machine]
            args = (os.getpid(), child, _KCMP_FILE, read_end, read_end)
            got = libc.syscall(ctypes.c_long(number), *(ctypes.c_long(a) for a in args))
    finally:
        os.write(write_end, b"x")
        os.waitpid(child, 0)
        os.close(read_end)
        os.close(write_end)
    if got < 0:
        return _result([], [f"{call}: {errno.errorcode.get(ctypes.get_errno(), '?')}"])
    return _result([f"{call} of a child of its own returned {got}"], [])


STEPS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "set_id": _set_id,
    "shared": _shared,
    "acl": _acl,
    "umask": _umask,
    "dev_write": _dev_write,
    "preload": _preload,
    "maps": _maps,
    "listen": _listen,
    "descriptor": _descriptor,
}
