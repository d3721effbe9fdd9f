"""The wall's /etc: one bind per entry (as before) against copies of the regular files plus
directory binds (as now), with the wall's own command line, interleaved in one run.

    sudo /opt/lnk/venv/bin/python bench/wall_etc.py [--runs 60]

Runs bwrap as nobody (unprivileged, in a user namespace, as a sandbox's bwrap runs) with the
real `bwrap_argv` of layouts that differ only in their /etc, running /bin/true: no controller,
no confiner, no fresh user.
Each bind costs bwrap a mount and a parse of /proc/self/mountinfo, so the gap grows with the
host's mounts; the number of mounts is reported with the figures. Reports figures only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable

from lnk_controller.spawn import open_etc_entries
from lnk_controller.wall import ETC_FILES, MERGED_USR_LINKS, Bind, SandboxLayout, bwrap_argv

Variant = Callable[[], tuple[list[str], list[int]]]


def _layout(home: str, **etc: object) -> SandboxLayout:
    links = {p: os.readlink(p) for p in MERGED_USR_LINKS if os.path.islink(p)}
    return SandboxLayout(
        uid=1000,
        gid=1000,
        user_name="lnk-bench",
        home=Bind(home, "/home/lnk-bench", write=True),
        prefix="/opt/lnk",
        command=("/bin/true",),
        cwd="/",
        env={},
        terminal=False,
        system_links=links,
        system_dirs=("/usr",),
        **etc,  # type: ignore[arg-type]
    )


def _data_fds() -> list[int]:
    fds = []
    for text in ("root:x:0:0::/:/bin/sh\n", "root:x:0:\n", "policy\n"):
        fd = os.memfd_create("lnk-bench", os.MFD_CLOEXEC)
        os.write(fd, text.encode())
        os.lseek(fd, 0, os.SEEK_SET)
        fds.append(fd)
    return fds


def binds(home: str) -> tuple[list[str], list[int]]:
    """Before: every existing entry bound, the generated files bound from data (--ro-bind-data,
    which bwrap makes as a file in a tmpfs and binds)."""
    fds = _data_fds()
    argv = bwrap_argv(
        _layout(
            home,
            etc_binds=tuple(p for p in ETC_FILES if os.path.exists(p)),
            passwd_fd=fds[0],
            group_fd=fds[1],
            policy_fd=fds[2],
        )
    )
    return [a if a != "--file" else "--ro-bind-data" for a in argv], fds


def copies(home: str) -> tuple[list[str], list[int]]:
    """Now: regular files copied from descriptors, directories bound."""
    fds = _data_fds()
    etc_binds, etc_copies = open_etc_entries(ETC_FILES)
    argv = bwrap_argv(
        _layout(
            home,
            etc_binds=etc_binds,
            etc_copies=tuple(etc_copies),
            passwd_fd=fds[0],
            group_fd=fds[1],
            policy_fd=fds[2],
        )
    )
    return argv, fds + [fd for fd, _ in etc_copies]


# As the sandbox's user would: no groups, its own uid (nobody here).
AS_NOBODY = ["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]


def _once(variant: Variant) -> float:
    argv, fds = variant()
    try:
        started = time.perf_counter()
        subprocess.run([*AS_NOBODY, *argv], check=True, pass_fds=fds)
        return (time.perf_counter() - started) * 1e3
    finally:
        for fd in fds:
            os.close(fd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=60)
    args = parser.parse_args()
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        mounts = sum(1 for _ in f)
    with tempfile.TemporaryDirectory() as home:
        os.chmod(home, 0o755)  # nobody's bwrap must reach it to bind it
        variants: dict[str, Variant] = {
            "one bind per /etc entry": lambda: binds(home),
            "copies + directory binds": lambda: copies(home),
        }
        times: dict[str, list[float]] = {name: [] for name in variants}
        for variant in variants.values():  # warm the page cache and bwrap once
            _once(variant)
        for _ in range(args.runs):  # interleaved, so the machine's noise hits both alike
            for name, variant in variants.items():
                times[name].append(_once(variant))
    print(f"runs: {args.runs}, host mounts: {mounts}")
    for name, found in times.items():
        found.sort()
        p95 = found[int(len(found) * 0.95) - 1]
        print(f"{name:26s}: median {statistics.median(found):6.2f} ms  p95 {p95:6.2f} ms")


if __name__ == "__main__":
    main()
