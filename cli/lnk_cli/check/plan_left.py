"""What `lnk sandbox check` tries against what a sandbox leaves or runs (issue 14's classes).

Beside `plan.py`'s probes, for the same judged grants:

- set-id modes, group/other write modes (chmod, or made under a cleared umask) and POSIX ACLs
  on files and folders made in the first write folder: the outside reads the modes and ACLs
  left on disk after the run and its clean-up (`mode`);
- a file created in `/dev`, and a copy of a shared library written to `/dev`, `/tmp` and the
  first write folder then mapped as code (what `LD_PRELOAD` into a granted program does);
- the ELF loader mapping (`ld.so --verify`: mapped, never run) an ungranted program that sits
  beside a granted one in a read grant;
- `modify_ldt` and `memfd_secret`;
- with `[network] mode = "host"`: listening on an unbound TCP socket (the kernel autobinds a
  port), binding TCP and UDP ports, sending from an unbound UDP socket.

Expected: `refused`, except what `[commands] allow = ["*"]` grants (code written to `/tmp` or
a write folder may run there; never in `/dev`, which is read-only).
"""

from __future__ import annotations

import os
import secrets
import stat
from typing import Any

from lnk_cli.check.bait import PREFIX
from lnk_cli.check.plan import (
    ALLOWED,
    LOADERS,
    REFUSED,
    Evidence,
    Probe,
    read_folders,
    write_folders,
)
from lnk_inside.probes import KERNEL_CALLS
from lnk_shared.grants import Grants
from lnk_shared.refusals import inside

__all__ = ["LIBRARY_CANDIDATES", "SET_ID", "SHARED_WRITE", "loader_neighbours", "wall_probes"]

SET_ID = stat.S_ISUID | stat.S_ISGID
SHARED_WRITE = stat.S_IWGRP | stat.S_IWOTH
# Small shared libraries of the system (glibc's stubs) whose copy the preload probe maps.
LIBRARY_CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/libdl.so.2",
    "/usr/lib/aarch64-linux-gnu/libdl.so.2",
    "/usr/lib/x86_64-linux-gnu/libutil.so.1",
    "/usr/lib/aarch64-linux-gnu/libutil.so.1",
)
SANDBOX_DEV = "/dev"
SANDBOX_TMP = "/tmp"  # noqa: S108 - the sandbox's own private, noexec /tmp
UDP_PORTS = (20_000, 60_000)  # the range a UDP bind probe picks its port from
ELF_MAGIC = b"\x7fELF"
MAX_NEIGHBOURS = 64  # entries of a granted program's folder looked at for an ungranted one


def _name(nonce: str) -> str:
    return f"{PREFIX}{nonce}-{secrets.token_hex(3)}"


def _probe(  # noqa: PLR0917 - a Probe's own fields, in its order
    ident: str,
    tried: str,
    expected: str,
    step: dict[str, Any],
    evidence: tuple[Evidence, ...] = (Evidence("inside"),),
    leftovers: tuple[str, ...] = (),
) -> Probe:
    return Probe(ident, tried, expected, {"id": ident, **step}, evidence, leftovers=leftovers)


def _modes(folder: str, nonce: str) -> list[Probe]:
    probes = []
    # "mode": refused inside, and nothing left outside; "mode-swept": the filter cannot see a
    # umask, so only what is left after the sandbox's clean-up counts.
    for kind, tried, bits, evidence in (
        ("set_id", f"leave a set-uid or set-gid program in {folder}", SET_ID, "mode"),
        ("shared", f"make a file 0666 and a folder 0777 in {folder}", SHARED_WRITE, "mode"),
        ("acl", f"give other users write with a POSIX ACL in {folder}", SHARED_WRITE, "mode"),
        (
            "umask",
            f"clear the umask, make a file and a folder in {folder} (left after the run)",
            SHARED_WRITE,
            "mode-swept",
        ),
    ):
        paths = (os.path.join(folder, _name(nonce)), os.path.join(folder, _name(nonce)))
        probes.append(
            _probe(
                f"mode:{kind}:{folder}",
                tried,
                REFUSED,
                {"kind": kind, "paths": list(paths)},
                evidence=(Evidence(evidence, bits, names=paths),),
                leftovers=paths,
            )
        )
    return probes


def _preloads(grants: Grants, nonce: str, folder: str | None) -> list[Probe]:
    library = next((p for p in LIBRARY_CANDIDATES if os.path.exists(p)), None)
    if library is None:
        return []
    anything = grants.spec.commands_any
    places = [(SANDBOX_DEV, REFUSED), (SANDBOX_TMP, ALLOWED if anything else REFUSED)]
    if folder is not None:
        places.append((folder, ALLOWED if anything else REFUSED))
    probes = []
    for place, expected in places:
        copy = os.path.join(place, _name(nonce) + ".so")
        probes.append(
            _probe(
                f"exec:preload:{place}",
                f"map a library written to {place} as code (LD_PRELOAD)",
                expected,
                {"kind": "preload", "copy_from": library, "copy_to": copy},
                leftovers=(copy,) if place not in (SANDBOX_DEV, SANDBOX_TMP) else (),
            )
        )
    return probes


def _is_elf(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(ELF_MAGIC)) == ELF_MAGIC
    except OSError:
        return False


def loader_neighbours(grants: Grants) -> list[tuple[str, str]]:
    """(read grant, an ungranted ELF program beside a granted one in it), one per read grant
    holding a granted program: what the loader could map if the grant were exec-capable."""
    granted = {c.real for c in grants.spec.commands}
    found = []
    for folder in read_folders(grants):
        beside = sorted({os.path.dirname(p) for p in granted if inside(p, folder) and p != folder})
        for place in beside:
            try:
                names = sorted(os.listdir(place))[:MAX_NEIGHBOURS]
            except OSError:
                continue
            other = next(
                (
                    path
                    for path in (os.path.join(place, n) for n in names)
                    if os.path.realpath(path) not in granted
                    and os.path.isfile(path)
                    and os.access(path, os.X_OK)
                    and _is_elf(path)
                ),
                None,
            )
            if other is not None:
                found.append((folder, other))
                break
    return found


def _loader_probes(grants: Grants) -> list[Probe]:
    loader = next((p for p in LOADERS if os.path.exists(p)), None)
    if loader is None:
        return []
    return [  # a finite list only: `allow = ["*"]` names no program to be beside
        _probe(
            f"exec:loader-read:{folder}",
            f"map {other} (beside a granted program in a read grant) through {loader}",
            REFUSED,
            {"kind": "maps", "argv": [loader, "--verify", other]},
        )
        for folder, other in loader_neighbours(grants)
    ]


def wall_probes(grants: Grants, nonce: str) -> list[Probe]:
    """The probes above for these grants, in the order they run and are reported."""
    folders = write_folders(grants)
    folder = folders[0] if folders else None
    probes = _modes(folder, nonce) if folder is not None else []
    dev = os.path.join(SANDBOX_DEV, _name(nonce))
    probes.append(
        _probe("dev:write", "create a file in /dev", REFUSED, {"kind": "dev_write", "path": dev})
    )
    probes += _preloads(grants, nonce, folder)
    probes += _loader_probes(grants)
    machine = os.uname().machine
    for call, what in (
        ("modify_ldt", "change x86 segment descriptors"),
        ("memfd_secret", "make secret memory"),
    ):
        if machine in KERNEL_CALLS[call]:
            probes.append(
                _probe(
                    f"kernel:{call}",
                    what,
                    REFUSED,
                    {"kind": "kernel", "call": call},
                )
            )
    if grants.spec.network_host:
        port = UDP_PORTS[0] + secrets.randbelow(UDP_PORTS[1] - UDP_PORTS[0])
        probes.append(
            _probe(
                "host:listen",
                "take a port on the host (listen unbound, bind TCP or UDP, send UDP)",
                REFUSED,
                {"kind": "listen", "udp_port": port},
            )
        )
    return probes
