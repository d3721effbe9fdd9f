"""What the check sees of its sandbox from outside while it runs, as a user other than the
sandbox's own (the caller is one: the kernel judges it as it would any other local user).

Two looks, each the answer for one probe (plan_processes.other_user_probes; verdicts weigh them):
- staging: can the caller reach anything under the sandbox's staging folder (its granted
  folders, its /tmp, its home)? A `stat` needs only the right to traverse the folders above.
- cmdline: does a command line of the sandbox's chain (lnk-spawn, bwrap, the confiner), which
  /proc shows to every local user, name the staging folder or a granted folder?

What this does NOT look at: the program's own command line (the kernel shows every process's
to everyone; here it is the probe program with its plan), and other users' view through
means the caller lacks (a member of the sandbox's group: none is ever made).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

__all__ = ["CHAIN", "STAGED_NAMES", "look"]

CHAIN = frozenset({"lnk-spawn", "bwrap", "lnk-sandbox"})
CHAIN_WAIT_S = 20.0  # a sandbox start on a loaded machine, with margin
CHAIN_POLL_S = 0.05
MAX_CHAIN = 64  # processes below lnk-spawn looked at: the chain is four, the probes a few
# Entries of a staging folder: grants g0.. (the first MAX_GRANTS_LOOKED tried), the tmpfs.
STAGED_NAMES = ("home", "tmp", "shm")
MAX_GRANTS_LOOKED = 16  # a spec's grants are staged as g0, g1, ...: the first few are enough
NOBODY = 65534  # the uid and gid a root caller looks as: no sandbox's, no owner's
MAX_CMDLINE_BYTES = 1 << 20  # a command line is at most ARG_MAX; more is not a chain's


def _reach(staging: str) -> str | None:
    names = (*STAGED_NAMES, *(f"g{n}" for n in range(MAX_GRANTS_LOOKED)))
    for name in names:
        path = os.path.join(staging, name)
        try:
            os.stat(path)
        except OSError:
            continue
        return f"{path} is reachable by uid {os.getuid()}"
    return None


def _staging(staging: str) -> str | None:
    """`_reach` as the caller, or, when the caller is root (who reaches everything), in a child
    that has become `nobody` first: what any other local user would reach."""
    if os.geteuid() != 0:
        return _reach(staging)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop to nobody, look, say what it saw, end
        try:
            os.close(read_end)
            os.setgroups([])
            os.setresgid(NOBODY, NOBODY, NOBODY)
            os.setresuid(NOBODY, NOBODY, NOBODY)
            os.write(write_end, (_reach(staging) or "").encode())
        finally:
            os._exit(0)
    os.close(write_end)
    try:
        said = os.read(read_end, 4096).decode(errors="replace")
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)
    return said or None


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read(MAX_CMDLINE_BYTES)
    except OSError:
        return []
    return [os.fsdecode(a) for a in raw.split(b"\0") if a]


def _children(pid: int) -> list[int]:
    found = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children", encoding="ascii") as f:
                found += [int(c) for c in f.read().split()]
        except (OSError, ValueError):
            continue
    return found


def _chain(sandbox_id: str) -> list[tuple[int, list[str]]] | None:
    """The sandbox's chain (lnk-spawn, named by its --cgroup, and every process below it) once
    its program runs (a process below it that is none of the chain's), or None before that."""
    spawner = None
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            argv = _cmdline(int(entry))
            if argv and os.path.basename(argv[0]) == "lnk-spawn" and sandbox_id in " ".join(argv):
                spawner = (int(entry), argv)
                break
    if spawner is None:
        return None
    found, todo = [spawner], _children(spawner[0])
    while todo and len(found) < MAX_CHAIN:
        pid = todo.pop()
        found.append((pid, _cmdline(pid)))
        todo += _children(pid)
    programs = [argv for _, argv in found if argv and os.path.basename(argv[0]) not in CHAIN]
    return found if programs else None


def _shown(sandbox_id: str, staging: str, granted: Sequence[str]) -> str | None:
    deadline = time.monotonic() + CHAIN_WAIT_S
    while (chain := _chain(sandbox_id)) is None:
        if time.monotonic() > deadline:
            return f"the sandbox's chain was not found running within {CHAIN_WAIT_S:g} s"
        time.sleep(CHAIN_POLL_S)  # the sandbox is held open; this waits for its exec only
    marks = [("its staging folder", staging), *(("a grant", g) for g in granted if g != "/")]
    for pid, argv in chain:
        program = os.path.basename(argv[0]) if argv else ""
        if program not in CHAIN:
            continue  # the program's own command line: shown for every process (a known gap)
        text = "\0".join(argv)
        for what, mark in marks:
            if mark in text:
                return f"{program} (pid {pid}) shows {what} ({mark}) in its command line"
    return None


def look(run_dir: str, sandbox_id: str, granted: Sequence[str]) -> dict[str, str | None]:
    """{"staging": what got through or None, "cmdline": the same}."""
    staging = os.path.join(run_dir, "sandboxes", sandbox_id)
    return {"staging": _staging(staging), "cmdline": _shown(sandbox_id, staging, granted)}
