"""What a probe of `lnk sandbox check` is: the step the sandbox runs, what a person reads as
"tried", the verdict the spec's grants lead to expect and the outside evidence `verdicts.py`
weighs with the sandbox's answer; and the context the plan's sections (`plan_files`,
`plan_network`, `plan_processes`) add their probes to, in the order they run.

The verdicts: `allowed` when a grant opens it, `known gap` for what the wall documents it does
not stop, `refused` for everything else; `leaked` is what a check finds when a refused probe
got through.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field
from typing import Any

from lnk_cli.check.bait import PREFIX, Bait
from lnk_shared.grants import Grants
from lnk_shared.refusals import inside

__all__ = [
    "ALLOWED",
    "KNOWN_GAP",
    "LEAKED",
    "REFUSED",
    "Evidence",
    "PlanContext",
    "Probe",
    "expect",
    "read_folders",
    "write_folders",
]

REFUSED, ALLOWED, KNOWN_GAP, LEAKED = "refused", "allowed", "known gap", "leaked"


@dataclass(frozen=True)
class Evidence:
    """What the outside checks for one probe. `kind` says which fact:

    secret     the bait's secret appears in what the sandbox sent back (`value`)
    names      the sandbox's listing holds a name the real folder holds (`names`)
    created    `path` exists after the run (it did not before)
    marked     `path`'s mtime is the probe's mark (`value` = the mtime before, to restore)
    server     the bait server accepted a connection carrying the probe's id (or none)
    wire       the proxy's wire log holds an allowed decision for `value` (a target)
    wire-refusals  the wire log holds more refusal lines for `value` than `names[0]`
    wire-said  no refusal in the wire log for `value[0]` (a target) says `value[1]`: the
               request was not judged as it must be (a hosted model's body, `plan_hosted`)
    cost       the times the sandbox measured (`data`: a deep body's and a flat one's) differ by
               more than the ratio `value` (`plan_bodies`' nesting probe)
    abstract   the abstract socket accepted a connection
    confiner   the confiner's folder changed (`value` = its state before)
    privilege  the status the probe read shows privilege, or the owner's uid (`value`)
    identity   the object the sandbox finds at `path` is not the one judged (`value`: device,
               inode and type as discovery recorded them)
    staging    the check, as a user other than the sandbox's, reached its staging folder
    cmdline    a command line of the sandbox's chain (lnk-spawn, bwrap, the confiner) showed
               a staging path or a granted folder to every local user
    clock      the boot time the sandbox read is this machine's (`value`, within CLOCK_SLACK)
    listing    the model listing the sandbox got at `path` names a model the rule (`value`)
               does not allow (`plan_models.not_allowed`)
    inside     nothing outside can see it: the sandbox's answer only
    """

    kind: str
    value: Any = None
    path: str = ""
    names: tuple[str, ...] = ()


@dataclass(frozen=True)
class Probe:
    id: str
    tried: str
    expected: str
    step: dict[str, Any] | None  # None: not tried (see `not_tried`)
    evidence: tuple[Evidence, ...] = ()
    not_tried: str = ""  # why it was not tried
    leftovers: tuple[str, ...] = ()  # paths the step may make, removed after the run


@dataclass
class PlanContext:
    grants: Grants
    bait: Bait
    nonce: str
    readable: list[str] = field(default_factory=list)
    hidden: list[str] = field(default_factory=list)
    probes: list[Probe] = field(default_factory=list)

    def add(self, probe: Probe) -> None:
        step = probe.step
        if step is not None:
            step = {"id": probe.id, **step}
        self.probes.append(
            Probe(
                probe.id,
                probe.tried,
                probe.expected,
                step,
                probe.evidence,
                probe.not_tried,
                probe.leftovers,
            )
        )

    def visible(self, path: str) -> bool:
        real = os.path.realpath(path)
        return any(inside(real, r) for r in self.readable) and not any(
            inside(real, h) for h in self.hidden
        )

    def name(self) -> str:
        return f"{PREFIX}{self.nonce}-{secrets.token_hex(3)}"


def write_folders(grants: Grants) -> list[str]:
    """Every folder the sandbox may write: the spec's, and those passed with `--with-fd`
    (bound where they really are)."""
    spec = grants.spec
    folders = {w.real for w in spec.write if w.is_dir}
    folders |= {f.path.real for f in spec.with_fds if f.write and f.path.is_dir}
    return sorted(folders)


def read_folders(grants: Grants) -> list[str]:
    """Every folder granted for reading only (the spec's, and `--with-fd N:read`)."""
    spec = grants.spec
    folders = {r.real for r in spec.read if r.is_dir}
    folders |= {f.path.real for f in spec.with_fds if not f.write and f.path.is_dir}
    return sorted(folders)


def expect(granted: bool) -> str:
    return ALLOWED if granted else REFUSED
