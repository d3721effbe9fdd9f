"""Grants: the canonical set of what a spec opens on this machine, and its hash.

Only `refusals.judge` makes a `Grants` (after every rule passed); everything before it is a
`ResolvedSpec`, which nothing may run with. The hash covers what is opened (real paths, real
programs, normalized hosts), never how it was written, so a comment, a reordering, a duplicate or
a renamed path that resolves the same keeps it, and a link retargeted anywhere on a granted path
changes it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from lnk_shared.hosts import HostPattern
from lnk_shared.spec import LanEntry
from lnk_shared.spec_models import ModelRule
from lnk_shared.spec_services import ServiceRule

__all__ = [
    "GRANTS_VERSION",
    "Grants",
    "Holder",
    "Identity",
    "LinkHop",
    "ResolvedFd",
    "ResolvedPath",
    "ResolvedSpec",
]

GRANTS_VERSION = 1  # bump when the canonical form changes: every spec is then asked again


@dataclass(frozen=True, order=True)
class Holder:
    """A folder on the way to an object, or the object itself: its owner and mode, which say
    who may change what is there."""

    path: str
    owner_uid: int
    mode: int


@dataclass(frozen=True, order=True)
class LinkHop:
    """One symbolic link met while resolving a path: where it is, what it says, who owns it.

    `folders`: the folders the link is in, "/" first (who may replace the link besides its
    owner); empty when not known. Not part of equality: where a path leads and through which
    links is what is compared, not who could change them.
    """

    link: str
    target: str
    owner_uid: int
    folders: tuple[Holder, ...] = field(default=(), compare=False)


@dataclass(frozen=True, order=True)
class Identity:
    """Which object a walk ended on: its device, inode and file type (`stat.S_IFMT`). What is
    bound must be this very object, whatever its path says by then."""

    dev: int
    ino: int
    kind: int


@dataclass(frozen=True, order=True)
class ResolvedPath:
    """A path as written and where it really is, with the links on the way.

    `identity`: the object the walk ended on (None for one resolved elsewhere, e.g. in a test).
    It is not part of equality or the hash: an approval is of places, and the identity binds
    one launch to what it judged.
    `found_on_path`: for a `[commands]` name looked up on PATH, the entry it was found as (the
    PATH folder joined with the name, often a package manager's link); None for a path written.
    `holders`: each folder on the way to `real` ("/" first) and the object itself, as the walk
    saw them (empty for one resolved elsewhere).
    """

    real: str
    written: str
    links: tuple[LinkHop, ...] = ()
    is_dir: bool = True
    is_socket: bool = False
    identity: Identity | None = field(default=None, compare=False)
    found_on_path: str | None = None
    holders: tuple[Holder, ...] = field(default=(), compare=False)


@dataclass(frozen=True, order=True)
class ResolvedFd:
    fd: int
    write: bool
    path: ResolvedPath


@dataclass(frozen=True)
class ResolvedSpec:
    """A spec with every path and program resolved on this machine, not yet judged."""

    source: str | None
    read: tuple[ResolvedPath, ...]
    write: tuple[ResolvedPath, ...]
    commands: tuple[ResolvedPath, ...]
    commands_any: bool
    internet_any: bool
    internet: tuple[HostPattern, ...]
    network_host: bool
    lan_any: bool
    lan: tuple[LanEntry, ...]
    browser: tuple[HostPattern, ...]
    ports: tuple[int, ...]
    with_fds: tuple[ResolvedFd, ...]
    store_driver: str | None = None
    services: tuple[ServiceRule, ...] = ()
    models: tuple[ModelRule, ...] = ()

    @property
    def has_proxy(self) -> bool:
        """Whether the sandbox reaches anything through the filtering proxy."""
        return not self.network_host and bool(
            self.internet_any
            or self.internet
            or self.lan_any
            or self.lan
            or self.ports
            or self.services
            or self.models
        )


@dataclass(frozen=True)
class Grants:
    """What a sandbox may use, after every rule passed.

    `hidden`: protected folders inside a granted folder; the wall covers them with nothing.
    `read_only_inside`: dot entries at the top of a write grant that tools run outside; the wall
    keeps them read-only.
    """

    spec: ResolvedSpec
    hidden: tuple[str, ...]
    read_only_inside: tuple[str, ...]

    @property
    def read(self) -> tuple[ResolvedPath, ...]:
        return self.spec.read

    @property
    def write(self) -> tuple[ResolvedPath, ...]:
        return self.spec.write

    @property
    def commands(self) -> tuple[ResolvedPath, ...]:
        return self.spec.commands

    def canonical(self) -> dict[str, Any]:
        """The document the hash covers: sorted, deduplicated, resolved; no written forms."""
        s = self.spec
        return {
            "version": GRANTS_VERSION,
            "read": sorted({p.real for p in s.read}),
            "write": sorted({p.real for p in s.write}),
            "hidden": sorted(set(self.hidden)),
            "read_only_inside": sorted(set(self.read_only_inside)),
            "commands": "*" if s.commands_any else sorted({p.real for p in s.commands}),
            # `*` alone hashes as before; with `host:22` beside it, both (spec.py keeps those)
            "internet": (
                ["*", *sorted({str(h) for h in s.internet})]
                if s.internet_any and s.internet
                else "*"
                if s.internet_any
                else sorted({str(h) for h in s.internet})
            ),
            "network": "host" if s.network_host else None,
            "lan": "*" if s.lan_any else sorted({str(e) for e in s.lan}),
            "browser": sorted({str(h) for h in s.browser}),
            "localhost_ports": sorted(set(s.ports)),
            "with_fds": sorted({(f.path.real, "write" if f.write else "read") for f in s.with_fds}),
            # Only when kept: specs without a store hash as they did before [store] existed.
            **({"store": s.store_driver} if s.store_driver else {}),
            # Likewise only when named: each rule's kind, host, secret (by name) and allow.
            **({"services": [r.canonical() for r in s.services]} if s.services else {}),
            # And each model rule: kind, upstream, models, secret (by name), port, variable.
            **({"models": [r.canonical() for r in s.models]} if s.models else {}),
        }

    def canonical_json(self) -> str:
        return json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"))

    def digest(self) -> str:
        """SHA-256 (hex) of the canonical document."""
        return hashlib.sha256(self.canonical_json().encode("utf-8")).hexdigest()
