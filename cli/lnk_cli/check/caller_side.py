"""The check's probes of what a sandbox could do on its caller's side or learn of the host:
its terminal, an append-only stdout, a link left in a write folder, the host's names and ids.

`gather` reads the facts outside (this machine's names, boot id and machine-id; whether the
check has a terminal to offer); `caller_probes` turns them into probes (pure); `AppendBait` is
the append-only file the sandbox gets as its stderr, as a `>> log` would be. The steps they
run inside are in lnk_inside/probes.py (`terminal`, `append_only`, `symlink`, `hosts`, `read`).

- terminal: the check passes its own terminal (its stdin's or stderr's, when it has one) as
  the sandbox's stdin; inside, a terminal on any stream is a leak (the probe sets its modes to
  what they already are: it changes nothing, yet shows it could). Without a terminal the
  probe is not tried.
- append-only stderr: inside, clearing O_APPEND and truncating; outside, the file must still
  start with what was there before.
- a link in each write folder pointing at ~/.ssh/authorized_keys: seen outside if it exists.
- /etc/hosts naming this machine (its hostname, or a name the host's own /etc/hosts gives
  that is not localhost's), this boot's id, the machine-id, when this machine booted
  (/proc/stat's btime, which every sandbox of one boot would share): compared outside.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import tempfile
from dataclasses import dataclass

from lnk_cli.check.plan import REFUSED, Evidence, Probe
from lnk_inside.probes import boot_time, hosts_file_names

__all__ = ["AppendBait", "CallerSide", "caller_probes", "gather", "hosts_names"]

BOOT_ID = "/proc/sys/kernel/random/boot_id"
HOSTS = "/etc/hosts"
MACHINE_IDS = ("/etc/machine-id", "/var/lib/dbus/machine-id")
# Names no sandbox's /etc/hosts could leak: its own file holds them (wall.sandbox_hosts).
GENERIC_NAMES = frozenset({"localhost", "ip6-localhost", "ip6-loopback", "lnk-sandbox"})
ID_BYTES = 64  # a boot id is 36 characters, a machine-id 32: more is not an id


@dataclass(frozen=True)
class CallerSide:
    """What the outside knows: the host's names, ids, and the check's terminal (or None)."""

    host_names: tuple[str, ...]
    boot_id: str
    machine_id: str
    terminal_fd: int | None
    boot_time: int | None = None


def _read_id(path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read(ID_BYTES).strip()
    except OSError:
        return ""


def hosts_names(path: str = HOSTS) -> set[str]:
    """The names this machine's /etc/hosts gives (no lookup: a resolver may hang)."""
    try:
        return set(hosts_file_names(path))
    except OSError:
        return set()


def _boot_time() -> int | None:
    try:
        return boot_time()
    except OSError:
        return None


def gather() -> CallerSide:
    name = socket.gethostname()
    names = {name, name.split(".")[0], *hosts_names()} - GENERIC_NAMES
    machine = next((i for i in map(_read_id, MACHINE_IDS) if i), "")
    terminal = next((fd for fd in (0, 2) if os.isatty(fd)), None)
    return CallerSide(
        tuple(sorted(n for n in names if n)), _read_id(BOOT_ID), machine, terminal, _boot_time()
    )


class AppendBait:
    """A file the sandbox gets as its stderr, opened O_APPEND as `2>> log` opens it."""

    def __init__(self) -> None:
        self.first_line = f"lnk-check {secrets.token_hex(8)}: was there before\n".encode()
        fd, self.path = tempfile.mkstemp(prefix="lnk-check-log-")
        try:
            os.write(fd, self.first_line)
        finally:
            os.close(fd)
        self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)

    def kept(self) -> bool:
        """What was there before is still there, at the start."""
        with open(self.path, "rb") as f:
            return f.read(len(self.first_line)) == self.first_line

    def written(self, limit: int) -> bytes:
        """What the sandbox wrote after it (its stderr), at most `limit` bytes."""
        with open(self.path, "rb") as f:
            content = f.read(limit + len(self.first_line))
        return content.removeprefix(self.first_line)[:limit]

    def remove(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)
        with contextlib.suppress(OSError):
            os.unlink(self.path)


def _probe(ident: str, tried: str, step: dict[str, object] | None, *evidence: Evidence) -> Probe:
    return Probe(ident, tried, REFUSED, {"id": ident, **step} if step else None, evidence)


def caller_probes(
    caller: CallerSide, write_folders: list[str], home: str, nonce: str
) -> list[Probe]:
    """The probes, in the order they run; `nonce` names the links they try to leave."""
    probes: list[Probe] = []
    if caller.terminal_fd is None:
        probes.append(
            Probe(
                "terminal",
                "change the modes of the caller's terminal",
                REFUSED,
                None,
                not_tried="the check has no terminal (stdin or stderr) to pass",
            )
        )
    else:
        probes.append(
            _probe(
                "terminal",
                "change the modes of the caller's terminal",
                {"kind": "terminal"},
                Evidence("inside"),
            )
        )
    probes.append(
        _probe(
            "stdout:append-only",
            "truncate an append-only stdout or stderr (`>> log`)",
            {"kind": "append_only", "fd": 2},
            Evidence("appended"),
        )
    )
    keys = os.path.join(home, ".ssh", "authorized_keys")
    for folder in write_folders:
        link = os.path.join(folder, f"lnk-check-{nonce}-link")
        probes.append(
            Probe(
                f"link.write:{folder}",
                f"leave a link to ~/.ssh/authorized_keys in {folder}",
                REFUSED,
                {"id": f"link.write:{folder}", "kind": "symlink", "target": keys, "path": link},
                (Evidence("created", path=link),),
                leftovers=(link,),
            )
        )
    if caller.host_names:
        probes.append(
            _probe(
                "host:hosts",
                "find this machine's name in /etc/hosts",
                {"kind": "hosts"},
                Evidence("names", names=caller.host_names),
            )
        )
    if caller.boot_id:
        probes.append(
            _probe(
                "host:boot-id",
                "read this machine's boot id",
                {"kind": "read", "path": BOOT_ID},
                Evidence("secret", caller.boot_id),
            )
        )
    if caller.boot_time is not None:
        probes.append(
            _probe(
                "host:boot-time",
                "learn when this machine booted (/proc/stat's btime, /proc/uptime)",
                {"kind": "boot_time"},
                Evidence("clock", caller.boot_time),
            )
        )
    if caller.machine_id:
        for number, path in enumerate(MACHINE_IDS):
            probes.append(
                _probe(
                    f"host:machine-id:{number}",
                    f"read this machine's id ({path})",
                    {"kind": "read", "path": path},
                    Evidence("secret", caller.machine_id),
                )
            )
    return probes
