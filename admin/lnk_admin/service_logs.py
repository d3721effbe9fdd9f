"""The services' logs under `lnk box up`: each service's stdout and stderr are a pipe to a log
keeper of its own (`lnk_admin.log_keeper`, as root), which writes `<state>/logs/<name>.log`
rotated by size: `log_max_bytes` and `log_keep_count` in `controller.toml`. The keeper's pid
is in `<run>/<name>.log.pid`; it ends when every writer of its pipe has, and `lnk box down`
waits for that after stopping the service.

What this does NOT do: keep a child the service left running from losing its output once the
service is started again (its old keeper is stopped first, so one file never has two writers;
the child then writes into a pipe nobody reads, which fails).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from lnk_shared.paths import BoxPaths

__all__ = [
    "LogSettings",
    "Since",
    "end_keeper",
    "keeper_pid",
    "log_settings",
    "since",
    "start_keeper",
    "tail",
]

KEEPER_MODULE = "lnk_admin.log_keeper"
KEEPER_END_S = 5.0  # a keeper writes what its pipe holds (64 KiB at most) and ends: milliseconds
KEEPER_DRAIN_S = 2.0  # after SIGTERM: what it holds, then it ends
KEEPER_EXEC_S = 2.0  # a spawned keeper shows its own command line in microseconds; loaded, more


@dataclass(frozen=True)
class LogSettings:
    max_bytes: int
    keep_count: int


@dataclass(frozen=True)
class Since:
    """Where a log stood when a service was started: its file's inode and size."""

    inode: int
    size: int


def log_settings(env: dict[str, str] | None = None) -> LogSettings:
    """The two settings from `controller.toml`, validated with the rest of it (a bad file is
    the ConfigError the controller would give, before any service starts). Its warnings about
    test switches are the controller's to log, at its own start: not said twice here."""
    from lnk_controller.config import load_config

    said = logging.getLogger("lnk_controller.config")
    was = said.disabled
    said.disabled = True
    try:
        cfg = load_config(os.environ if env is None else env)
    finally:
        said.disabled = was
    return LogSettings(cfg.log_max_bytes, cfg.log_keep_count)


def _pidfile(box: BoxPaths, name: str) -> Path:
    return box.run_dir / f"{name}.log.pid"


def keeper_pid(box: BoxPaths, name: str, log_path: Path) -> int | None:
    """The pid of the keeper of `log_path`, if it runs (its command line names both)."""
    try:
        pid = int(_pidfile(box, name).read_text().strip())
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read().split(b"\0")
    except (OSError, ValueError):
        return None
    return pid if KEEPER_MODULE.encode() in cmdline and os.fsencode(log_path) in cmdline else None


def start_keeper(box: BoxPaths, name: str, log_path: Path, settings: LogSettings) -> int:
    """Start `name`'s keeper of `log_path` (ending one left from before); return the write end
    of its pipe, for the service's stdout and stderr (the caller closes it once passed)."""
    end_keeper(box, name, log_path, wait_s=0.0)
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    argv = [sys.executable, "-I", "-m", KEEPER_MODULE, str(log_path)]
    argv += [str(settings.max_bytes), str(settings.keep_count)]
    devnull = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    try:  # not a Popen: it outlives this command, which never waits for it
        pid = os.posix_spawn(
            sys.executable,
            argv,
            os.environ,
            file_actions=[
                (os.POSIX_SPAWN_DUP2, read_end, 0),
                (os.POSIX_SPAWN_DUP2, devnull, 1),
                (os.POSIX_SPAWN_DUP2, devnull, 2),
            ],
            setsid=True,  # no terminal's signal reaches it
            setsigmask={signal.SIGTERM},  # until its handler is there: a stop never loses the pipe
        )
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
        os.close(devnull)
    _pidfile(box, name).write_text(f"{pid}\n")
    deadline = time.monotonic() + KEEPER_EXEC_S
    while keeper_pid(box, name, log_path) is None and time.monotonic() < deadline:
        time.sleep(0.001)  # its exec, so a stop right after this finds it by its command line
    return write_end


def end_keeper(box: BoxPaths, name: str, log_path: Path, wait_s: float = KEEPER_END_S) -> None:
    """Wait up to `wait_s` for `name`'s keeper to end by itself (its pipe's writers gone), then
    SIGTERM it: it writes what its pipe holds and ends."""
    pid = keeper_pid(box, name, log_path)
    if pid is not None and not _ended(pid, wait_s):
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        else:
            _ended(pid, KEEPER_DRAIN_S)
    _pidfile(box, name).unlink(missing_ok=True)


def _ended(pid: int, wait_s: float) -> bool:
    """Whether `pid` ends within `wait_s` (a pidfd: the kernel says when)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        ended = bool(select.select([fd], [], [], wait_s)[0])
    finally:
        os.close(fd)
    if ended:
        with contextlib.suppress(ChildProcessError):  # not ours: another command started it
            os.waitpid(pid, os.WNOHANG)  # ours when this command started it
    return ended


def since(log_path: Path) -> Since | None:
    """Where `log_path` stands now (None: not there yet)."""
    try:
        st = os.stat(log_path)
    except OSError:
        return None
    return Since(st.st_ino, st.st_size)


def tail(log_path: Path, start: Since | None, lines: int) -> str:
    """The last `lines` lines written since `start`: from its offset when the file is the same
    one, else (rotated meanwhile) the current file's, whose lines are all newer."""
    try:
        with open(log_path, "rb") as f:
            offset = 0
            if start is not None and os.fstat(f.fileno()).st_ino == start.inode:
                offset = start.size
            f.seek(offset)
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    said = [line.strip() for line in text.splitlines() if line.strip()]
    return " | ".join(said[-lines:])
