"""The probe program that runs INSIDE the sandbox `lnk sandbox check` makes.

The controller starts it as the box's own Python (`-I -S`, standard library only, like the
confiner) with one argument: the plan, a JSON list of steps built outside (`plan.py`). The plan
holds paths, ports, names and nonces, never a bait's secret: what the sandbox reads back is
compared with the secrets outside. Each step is tried once and its outcome printed; the whole
result is one JSON document on stdout, `{"results": {step id: {"outcome", "detail", "data"}}}`.

`outcome` is "through" when the attempt got through from where the probe stands (the file was
read, the connection made, the syscall returned success), "stopped" when the system refused it
(`detail` names the error), "error" when the probe itself failed (a bug, not a refusal). This
module decides nothing: the verdicts are made outside (`verdicts.py`), on these outcomes, the
data, and what the outside saw. Everything here is read back as hostile.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import os
import resource
import select
import signal
import socket
import stat
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable
from typing import Any

from lnk_inside import probes_caps, probes_env, probes_left, probes_models

__all__ = ["KERNEL_CALLS", "hosts_file_names", "main", "run_step"]

READ_LIMIT = 4096  # bytes of a bait file sent back: a secret is 64 hex characters
LIST_LIMIT = 200  # names of a listed folder sent back
ENVIRON_LIMIT = 65536  # bytes of other processes' environments sent back
NET_TIMEOUT_S = 3.0  # loopback answers at once; the proxy refuses at once
EXEC_TIMEOUT_S = 5.0  # an ungranted program that does run prints one line and ends
PROXY_HEAD_LIMIT = 1024  # a refusal is a status line, a few headers and one short body line
MARKER_TIME = 86_400  # the mtime a write-open sets (1970-01-02): seen outside if it got through
# How long the last steps hold the sandbox open while the check looks at it from outside (as
# another user would): the look takes well under a second; a check whose caller died must not
# keep its sandbox past this.
HOLD_S = 30.0

# Syscalls by number (no libc wrapper in Python), per architecture the box supports.
KERNEL_CALLS: dict[str, dict[str, tuple[int, tuple[int, ...]]]] = {
    # keyctl(KEYCTL_GET_KEYRING_ID, KEY_SPEC_USER_KEYRING, create=1): makes a keyring
    "keyctl": {"x86_64": (250, (0, -4, 1)), "aarch64": (219, (0, -4, 1))},
    # bpf(BPF_PROG_LOAD, NULL, 0)
    "bpf": {"x86_64": (321, (5, 0, 0)), "aarch64": (280, (5, 0, 0))},
    # perf_event_open(NULL, 0, -1, -1, 0)
    "perf_event_open": {"x86_64": (298, (0, 0, -1, -1, 0)), "aarch64": (241, (0, 0, -1, -1, 0))},
    # userfaultfd(0)
    "userfaultfd": {"x86_64": (323, (0,)), "aarch64": (282, (0,))},
    # modify_ldt(read, NULL, 0): x86 only
    "modify_ldt": {"x86_64": (154, (0, 0, 0))},
    # memfd_secret(0)
    "memfd_secret": {"x86_64": (447, (0,)), "aarch64": (447, (0,))},
}
IO_URING_SETUP = 425  # the same number on every architecture (generic table)
IO_URING_PARAMS = 120  # bytes of struct io_uring_params
CLONE_NEWUSER = 0x10000000
CLONE_NEWNS = 0x00020000
PTRACE_ATTACH = 16
THREAD_STACK = 64 * 1024  # the limits probe's threads only wait: the smallest usual stack


def _errno_name(exc: OSError) -> str:
    return errno.errorcode.get(exc.errno or 0, str(exc.errno)) if exc.errno else str(exc)


def _through(detail: str = "", data: object = "") -> dict[str, Any]:
    return {"outcome": "through", "detail": detail, "data": data}


def _stopped(detail: str, data: object = "") -> dict[str, Any]:
    return {"outcome": "stopped", "detail": detail, "data": data}


# -- files ------------------------------------------------------------------------------------


def _read(step: dict[str, Any]) -> dict[str, Any]:
    fd = os.open(step["path"], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        data = os.read(fd, READ_LIMIT)
    finally:
        os.close(fd)
    return _through("read", data.decode("latin-1"))


def _list(step: dict[str, Any]) -> dict[str, Any]:
    names = sorted(os.listdir(step["path"]))[:LIST_LIMIT]
    return _through(f"{len(names)} entries", names)


def _create(step: dict[str, Any]) -> dict[str, Any]:
    path = step["path"]
    for folder in step.get("dirs", []):  # missing folders on the way, outermost first
        os.mkdir(folder, 0o755)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, 0o644)
    try:
        os.write(fd, step["content"].encode())
    finally:
        os.close(fd)
    return _through("created")


def _open_write(step: dict[str, Any]) -> dict[str, Any]:
    """Open an existing file for writing, and mark its mtime: nothing of its content changes,
    yet the outside sees the mark if the wall let it through."""
    fd = os.open(step["path"], os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.utime(fd, (MARKER_TIME, MARKER_TIME))
    finally:
        os.close(fd)
    return _through("opened for writing")


def _confiner(step: dict[str, Any]) -> dict[str, Any]:
    """Write into the folder the confiner runs from, or beside it (where the folder itself could
    be swapped). Nothing is destroyed if it works: a file made is removed at once, the
    confiner is opened for writing but not written; the outside sees the folders' times."""
    folder, file, name = step["dir"], step["file"], step["name"]
    got: list[str] = []
    errors: list[str] = []

    def make(path: str) -> None:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644))
        with contextlib.suppress(OSError):
            os.unlink(path)

    attempts: list[tuple[str, Callable[[], object]]] = [
        ("create a file in it", lambda: make(os.path.join(folder, name))),
        (
            "open the confiner for writing",
            lambda: os.close(os.open(file, os.O_WRONLY | os.O_APPEND)),
        ),
        ("create a file beside it", lambda: make(os.path.join(os.path.dirname(folder), name))),
    ]
    for what, attempt in attempts:
        try:
            attempt()
            got.append(what)
        except OSError as exc:
            errors.append(f"{what}: {_errno_name(exc)}")
    if got:
        return _through(", ".join(got))
    return _stopped("; ".join(errors))


# -- network ----------------------------------------------------------------------------------


def _tcp(step: dict[str, Any]) -> dict[str, Any]:
    address = (step["host"], step["port"])
    with (
        socket.create_connection(address, timeout=NET_TIMEOUT_S) as s,
        contextlib.suppress(OSError),
    ):
        s.sendall(f"lnk-check {step['id']}\n".encode())
    return _through("connected")


def _route(step: dict[str, Any]) -> dict[str, Any]:
    """Is there a way to `host`? A UDP connect only looks up the route (no packet leaves); only
    when there is none is a TCP connect tried, which then fails before sending anything."""
    host, port = step["host"], step["port"]
    try:
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    except OSError as exc:  # no datagram sockets (host mode): the kernel's table, no dial
        return _route_table(_errno_name(exc))
    with udp:
        try:
            udp.connect((host, port))
        except OSError as exc:
            route_error = _errno_name(exc)
        else:
            return _through("a route exists (not dialed: it would leave this machine)")
    try:
        with socket.create_connection((host, port), timeout=NET_TIMEOUT_S):
            return _through("connected")
    except OSError as exc:
        return _stopped(f"no route ({route_error}); connect: {_errno_name(exc)}")


def _route_table(why: str) -> dict[str, Any]:
    """Is there a default route in this network namespace's IPv4 table? (No packet.)"""
    with open("/proc/net/route", encoding="ascii") as f:
        rows = [line.split() for line in f.readlines()[1:]]
    if any(len(row) > 1 and row[1] == "00000000" for row in rows):
        return _through(f"a default route exists (read from /proc/net/route; UDP: {why})")
    return _stopped(f"no default route (UDP: {why})")


def _proxy(step: dict[str, Any]) -> dict[str, Any]:
    address = probes_caps.proxy_address()
    if address is None:
        return _stopped("no proxy in this sandbox (HTTP_PROXY unset)")
    target = step["target"]
    sent = b""
    if step["method"] == "CONNECT":
        head = f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n"
    else:  # a rule's probe names its verb, path, headers and body (`plan_services`, ...)
        verb, path = step.get("verb", "GET"), step.get("path", "/")
        extra = "".join(f"{line}\r\n" for line in step.get("headers", []))
        # latin-1: a probe's body whose characters are its bytes (bad UTF-8 sent as such)
        encoding = "latin-1" if step.get("encoding") == "latin-1" else "utf-8"
        sent = step.get("body", "").encode(encoding)
        if sent:
            extra += f"Content-Type: application/json\r\nContent-Length: {len(sent)}\r\n"
        head = (
            f"{verb} http://{target}{path} HTTP/1.1\r\nHost: {target}\r\n{extra}"
            "Connection: close\r\n\r\n"
        )
    with socket.create_connection(address, timeout=NET_TIMEOUT_S) as s:
        s.sendall(head.encode() + sent)
        answer = b""
        while b"\r\n\r\n" not in answer and len(answer) < PROXY_HEAD_LIMIT:
            chunk = s.recv(PROXY_HEAD_LIMIT)
            if not chunk:
                break
            answer += chunk
        status = answer.split(b"\r\n", 1)[0].decode("latin-1")
        parts = status.split()
        code = parts[1] if len(parts) > 1 and parts[1].isdigit() else "none"
        if code == "200" and step["method"] == "CONNECT":
            with contextlib.suppress(OSError):
                s.sendall(f"lnk-check {step['id']}\n".encode())
        else:
            with contextlib.suppress(OSError, TimeoutError):
                s.settimeout(0.5)
                answer += s.recv(PROXY_HEAD_LIMIT)
    body = answer.split(b"\r\n\r\n", 1)[-1][:200].decode("latin-1").strip()
    detail = f"{code} {body}".strip() if code != "none" else "no answer (not the proxy's refusal)"
    if code == "403":
        return _stopped(detail, code)
    return _through(detail, code)


def _abstract(step: dict[str, Any]) -> dict[str, Any]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(NET_TIMEOUT_S)
        s.connect("\0" + step["name"])
    return _through("connected")


# -- processes --------------------------------------------------------------------------------


def _environ(step: dict[str, Any]) -> dict[str, Any]:
    """The outside program's environment: its /proc entry by its pid outside, every process
    the sandbox can see, and `ps e` when it may run."""
    found: list[str] = []
    errors: list[str] = []
    own = {str(os.getpid()), "self", "thread-self"}
    candidates = [str(step["pid"])] + [p for p in os.listdir("/proc") if p.isdigit()]
    for pid in dict.fromkeys(candidates):
        if pid in own:
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                found.append(f.read(ENVIRON_LIMIT).decode("latin-1"))
        except OSError as exc:
            errors.append(f"{pid}: {_errno_name(exc)}")
    try:
        ps = subprocess.run(
            ["/usr/bin/ps", "axe"],
            capture_output=True,
            timeout=EXEC_TIMEOUT_S,
            check=False,
        )
        found.append(ps.stdout[:ENVIRON_LIMIT].decode("latin-1"))
    except (OSError, subprocess.SubprocessError) as exc:
        errors.append(f"ps: {exc}")
    data = "\n".join(found)[:ENVIRON_LIMIT]
    return _through("read " + (", ".join(errors[:3]) or "all"), data)


def _exec(step: dict[str, Any]) -> dict[str, Any]:
    argv = list(step["argv"])
    if step.get("copy_to"):  # a copy of a program in a place the sandbox may write
        with open(step["copy_from"], "rb") as f:
            data = f.read()
        fd = os.open(step["copy_to"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o755)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
    if step.get("memfd"):
        with open(step["copy_from"], "rb") as f:
            data = f.read()
        mfd = os.memfd_create("lnk-check", 0)
        os.write(mfd, data)
        argv[0] = f"/proc/self/fd/{mfd}"
        result = subprocess.run(
            argv, capture_output=True, timeout=EXEC_TIMEOUT_S, check=False, pass_fds=(mfd,)
        )
        os.close(mfd)
    else:
        result = subprocess.run(argv, capture_output=True, timeout=EXEC_TIMEOUT_S, check=False)
    out = result.stdout.decode("latin-1")
    if step["marker"] in out:
        return _through("it ran")
    err = result.stderr.decode("latin-1").strip().splitlines()
    return _stopped(f"status {result.returncode}: {err[-1][:120] if err else ''}".strip())


def _identity(step: dict[str, Any]) -> dict[str, Any]:
    """The device, inode and type of what is bound at a granted path, as the sandbox sees it
    (a bind or idmapped mount keeps both: they are the filesystem's)."""
    try:
        info = os.lstat(step["path"])
    except OSError as exc:
        return _stopped(_errno_name(exc))
    return _through("looked", [info.st_dev, info.st_ino, info.st_mode & 0o170000])


def _privilege(step: dict[str, Any]) -> dict[str, Any]:
    with open("/proc/self/status", encoding="ascii") as f:
        fields = dict(line.split(":\t", 1) for line in f if ":\t" in line)
    keep = ("Uid", "Gid", "Groups", "NoNewPrivs", "Seccomp", "CapInh", "CapPrm", "CapEff")
    data = {k: fields.get(k, "").strip() for k in (*keep, "CapBnd", "CapAmb")}
    return _through("read its own status", data)


def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def _errno_result(result: int) -> dict[str, Any]:
    if result == -1:
        return _stopped(errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno())))
    return _through(f"returned {result}")


def _kernel(step: dict[str, Any]) -> dict[str, Any]:
    libc = _libc()
    call = step["call"]
    if call == "unshare_user":
        return _errno_result(libc.unshare(CLONE_NEWUSER))
    if call == "unshare_mount":
        return _errno_result(libc.unshare(CLONE_NEWNS))
    if call == "mount":
        return _errno_result(libc.mount(b"none", b"/tmp", b"tmpfs", 0, None))
    if call == "ptrace":  # attach to a child of its own: seccomp refuses ptrace outright
        child = os.fork()
        if child == 0:  # pragma: no cover - the child only waits to be attached to
            time.sleep(EXEC_TIMEOUT_S)
            os._exit(0)
        try:
            return _errno_result(
                libc.ptrace(ctypes.c_long(PTRACE_ATTACH), ctypes.c_long(child), None, None)
            )
        finally:
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
    if call == "io_uring_setup":
        params = ctypes.create_string_buffer(IO_URING_PARAMS)
        return _errno_result(
            libc.syscall(ctypes.c_long(IO_URING_SETUP), ctypes.c_long(4), ctypes.byref(params))
        )
    number, args = KERNEL_CALLS[call][os.uname().machine]
    return _errno_result(libc.syscall(*(ctypes.c_long(a) for a in (number, *args))))


# -- the caller's side and the host (caller_side.py) ---------------------------------------


def _terminal(_step: dict[str, Any]) -> dict[str, Any]:
    """A terminal on stdin, stdout or stderr is the caller's: its modes are set to what they
    are (nothing changes), which shows they could have been changed."""
    held = []
    for fd in (0, 1, 2):
        if os.isatty(fd):
            termios.tcsetattr(fd, termios.TCSANOW, termios.tcgetattr(fd))
            held.append(fd)
    if held:
        return _through(f"the caller's terminal on {held}, its modes settable")
    return _stopped("no terminal on stdin, stdout or stderr")


def _append_only(step: dict[str, Any]) -> dict[str, Any]:
    """Clear O_APPEND on the descriptor, then truncate it: an append-only file loses what was
    there (the outside sees that); a pipe refuses."""
    fd = int(step["fd"])
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_APPEND)
    os.ftruncate(fd, 0)
    return _through("truncated")


def _symlink(step: dict[str, Any]) -> dict[str, Any]:
    os.symlink(step["target"], step["path"])
    return _through("made")


def hosts_file_names(path: str = "/etc/hosts") -> list[str]:
    """The names a hosts file gives, in order (comments left out). Outside, the check reads
    this machine's own with it (caller_side.py)."""
    names: list[str] = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            names += line.partition("#")[0].split()[1:]
    return names


def _hosts(_step: dict[str, Any]) -> dict[str, Any]:
    """The names /etc/hosts gives (what the outside compares with this machine's)."""
    names = hosts_file_names()
    return _through(f"{len(names)} names", names[:LIST_LIMIT])


def boot_time(path: str = "/proc/stat") -> int | None:
    """When the kernel says this boot began (btime, seconds since the epoch), or None. Outside,
    the check reads this machine's with it (caller_side.py); inside, a time namespace of the
    sandbox's own moves it to the sandbox's birth."""
    with open(path, encoding="ascii", errors="replace") as f:
        for line in f:
            key, _, value = line.partition(" ")
            if key == "btime" and value.strip().isdigit():
                return int(value)
    return None


def _boot_time(_step: dict[str, Any]) -> dict[str, Any]:
    """The boot time /proc/stat gives (what the outside compares with this machine's)."""
    return _through("read /proc/stat", {"btime": boot_time()})


def _git_visible(step: dict[str, Any]) -> dict[str, Any]:
    """Which of the names missing outside before the run show at the top of a write folder as
    git sees entries: a regular file or a link is listed by `git status` and committed by
    `git add -A`; an empty folder never is (nor a device, a FIFO or a socket)."""
    shown = []
    for name in step["names"]:
        with contextlib.suppress(OSError):
            mode = os.lstat(os.path.join(step["path"], name)).st_mode
            if stat.S_ISREG(mode) or stat.S_ISLNK(mode):
                shown.append(name)
            elif stat.S_ISDIR(mode) and os.listdir(os.path.join(step["path"], name)):
                shown.append(name + "/")
    if shown:
        return _through(f"git would list {', '.join(shown[:5])}", shown[:LIST_LIMIT])
    return _stopped("nothing git lists")


def _hold(step: dict[str, Any]) -> dict[str, Any]:
    """Keep the sandbox running until the check outside has looked (it closes our stdin), or
    HOLD_S at most. What is judged is what the outside saw (verdicts.py). A stdin that is not
    the check's pipe (the caller's terminal, passed for its own probe) holds nothing."""
    if not stat.S_ISFIFO(os.fstat(sys.stdin.fileno()).st_mode):
        return _stopped("not held: stdin is not the check's hold pipe")
    deadline = time.monotonic() + HOLD_S
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([sys.stdin.fileno()], [], [], left)
        if ready and not os.read(sys.stdin.fileno(), 4096):
            return _stopped("held until the outside looked")
    return _stopped("the outside did not look in time")


OOM_SCORE_ADJ = "/proc/self/oom_score_adj"


def _oom_score(floor: int) -> dict[str, Any]:
    """Through when the sandbox's OOM score adjustment is below `floor` (the host's OOM killer
    would take a box service before it) or it can lower its own; stopped when it stands at or
    above the floor and the kernel refuses to lower it."""
    with open(OOM_SCORE_ADJ, encoding="ascii") as f:
        value = int(f.read().strip())
    if value < floor:
        return _through(f"its OOM score adjustment is {value}, below {floor}")
    try:
        fd = os.open(OOM_SCORE_ADJ, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, str(value - 1).encode())  # a step down: any lowering at all
        finally:
            os.close(fd)
    except OSError as exc:
        return _stopped(f"it stands at {value}; lowering it was refused ({_errno_name(exc)})")
    return _through(f"it lowered its OOM score adjustment from {value}")


def _limits(step: dict[str, Any]) -> dict[str, Any]:
    """Start `count` threads, or open `count` files after raising the soft limit to the hard
    one; stopped when the kernel refuses one first. Everything is released before it returns.
    (`oom_score`: `count` is the floor, see _oom_score.)"""
    count = int(step["count"])
    if step["what"] == "oom_score":
        return _oom_score(count)
    if step["what"] == "processes":
        release = threading.Event()
        started: list[threading.Thread] = []
        threading.stack_size(THREAD_STACK)
        try:
            for _ in range(count):
                thread = threading.Thread(target=release.wait, daemon=True)
                try:
                    thread.start()
                except RuntimeError:
                    return _stopped(f"refused after {len(started)} threads")
                started.append(thread)
            return _through(f"started {count} threads")
        finally:
            release.set()
            for thread in started:
                thread.join()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    opened: list[int] = []
    try:
        for _ in range(count):
            try:
                opened.append(os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC))
            except OSError as exc:
                return _stopped(f"refused after {len(opened)} files ({_errno_name(exc)})")
        return _through(f"opened {count} files")
    finally:
        for fd in opened:
            os.close(fd)


STEPS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "git_visible": _git_visible,
    "hold": _hold,
    "read": _read,
    "list": _list,
    "create": _create,
    "open_write": _open_write,
    "confiner": _confiner,
    "tcp": _tcp,
    "route": _route,
    "proxy": _proxy,
    "abstract": _abstract,
    "environ": _environ,
    "exec": _exec,
    "privilege": _privilege,
    "identity": _identity,
    "kernel": _kernel,
    "terminal": _terminal,
    "append_only": _append_only,
    "symlink": _symlink,
    "hosts": _hosts,
    "boot_time": _boot_time,
    **probes_left.STEPS,
    **probes_env.STEPS,
    **probes_caps.STEPS,
    **probes_models.STEPS,
    "limits": _limits,
}


def run_step(step: dict[str, Any]) -> dict[str, Any]:
    """Try one step; an error is the outcome, never the end of the run."""
    try:
        return STEPS[step["kind"]](step)
    except OSError as exc:
        return _stopped(_errno_name(exc))
    except subprocess.TimeoutExpired:
        return _stopped("timed out")
    except Exception as exc:  # the probe itself failed: not a refusal (the check says so)
        return {"outcome": "error", "detail": f"{type(exc).__name__}: {exc}"[:200], "data": ""}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("lnk-check probes: expected one argument, the plan", file=sys.stderr)
        return 2
    steps = json.loads(argv[0])
    results = {step["id"]: run_step(step) for step in steps}
    sys.stdout.write(json.dumps({"results": results}) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
