"""What `lnk sandbox check` tries, and what each try should come to under the spec's grants.

`build_plan` turns the judged grants (as the caller sees them, `lnk spec show`'s view) and the
bait set up outside into a list of `Probe`s. Each probe has the step the sandbox runs
(`lnk_inside/probes.py`; paths, ports and nonces only, never a secret), what a person reads as
"tried", the expected verdict and the outside evidence `verdicts.py` weighs with the sandbox's
answer.

Expected: `allowed` when a grant opens it, `known gap` for what the wall documents it does not
stop (a `[localhost]` port's server, dot entries below the top of a written folder),
`refused` for everything else (the ELF loader running an ungranted program included).

Off this machine, only hosts the spec names are reached: each listed `[internet]` or `[lan]`
host gets one CONNECT through the proxy, closed at once. 1.1.1.1 directly is a route lookup
(a UDP connect, no packet), dialed only when there is no route, so it fails before a packet;
through the proxy it is asked for by address, which `[internet]` never opens. A probe a grant
would let leave the machine without naming a host (`*`, a wildcard, a `[lan]` range) is not
tried: it is reported `allowed` with "not tried".
"""

from __future__ import annotations

import secrets

from lnk_cli.check.bait import Bait
from lnk_cli.check.plan_files import (
    confiner_probe,
    file_probes,
    folder_state,
    identity_probes,
    placeholder_probes,
    write_probes,
)
from lnk_cli.check.plan_network import INTERNET_PROBE, network_probes, server_probes
from lnk_cli.check.plan_processes import (
    LOADERS,
    UNGRANTED_CANDIDATES,
    exec_probes,
    limit_probes,
    other_user_probes,
    process_probes,
)
from lnk_cli.check.probe import (
    ALLOWED,
    KNOWN_GAP,
    LEAKED,
    REFUSED,
    Evidence,
    PlanContext,
    Probe,
    read_folders,
    write_folders,
)
from lnk_shared.grants import Grants

__all__ = [
    "ALLOWED",
    "INTERNET_PROBE",
    "KNOWN_GAP",
    "LEAKED",
    "LOADERS",
    "REFUSED",
    "UNGRANTED_CANDIDATES",
    "Evidence",
    "Probe",
    "build_plan",
    "folder_state",
    "read_folders",
    "write_folders",
]


def build_plan(grants: Grants, bait: Bait, confiner_dir: str) -> list[Probe]:
    """Every probe for this spec and this bait, in the order they run and are reported."""
    spec = grants.spec
    c = PlanContext(grants, bait, secrets.token_hex(6))
    c.readable = [p.real for p in (*spec.read, *spec.write)]
    c.readable += [f.path.real for f in spec.with_fds]
    c.hidden = list(grants.hidden)
    placeholder_probes(c)
    file_probes(c)
    write_probes(c)
    identity_probes(c)
    confiner_probe(c, confiner_dir)
    server_probes(c)
    network_probes(c)
    process_probes(c)
    limit_probes(c)
    exec_probes(c)
    other_user_probes(c)
    return c.probes
