"""What `lnk sandbox check` tries against the proxy's port-22 rule (issue 19, git over ssh): a
sandbox's ssh goes out only through the proxy's CONNECT (the box's `lnk-connect`), and port 22
only to a host the spec's `[internet]` lists with `:22` (`lnk_proxy.policy`, LISTED_ONLY_PORTS).

- **An unlisted host's port 22** (`proxy:ssh-unlisted`): CONNECT to a name no list holds (under
  `.invalid`, so nothing resolves it), port 22: refused. With `[internet] *` the proxy must say
  why, `port-not-listed`: the wire's log shows it (a name that resolves nowhere would fail
  later, on its lookup, and a refusal then would prove nothing).
- **A listed name's port 22** (`proxy:ssh-bare:<host>`): the first `[internet]` name the spec
  lists without a port (a bare name opens every other port), on 22: refused, and the wire's
  log says `port-not-listed`. Only a host the spec names is asked for, as every check probe.

A host listed with `:22` is the spec's own `internet-host:` probe (expected allowed). The
proxy's `unsafe_ssh_port_by_any_entry` setting (test boxes only) reopens the class: both
probes are then `leaked`.

Does NOT try: ssh itself (a CONNECT is what the proxy judges; the tunnel's bytes are the
server's business), nor `[lan]` hosts on 22 (the LAN keeps every port, as the seed says).
"""

from __future__ import annotations

import secrets

from lnk_cli.check.bait import PREFIX
from lnk_cli.check.plan import REFUSED, Evidence, Probe
from lnk_shared.grants import Grants

__all__ = ["SSH_PORT", "ssh_probes"]

SSH_PORT = 22  # the one port of lnk_shared.hosts.LISTED_ONLY_PORTS
PORT_RULE = "port-not-listed"  # lnk_proxy.policy.Rule.PORT_NOT_LISTED, as the wire's log says it


def _probe(ident: str, target: str, why: str, rule: str | None) -> Probe:
    evidence = [Evidence("wire", target), Evidence("server")]
    if rule is not None:  # the refusal must be this rule's, not a lookup's that came later
        evidence.append(Evidence("wire-said", (target, rule)))
    return Probe(
        ident,
        f"CONNECT {target} through the proxy ({why})",
        REFUSED,
        {"id": ident, "kind": "proxy", "method": "CONNECT", "target": target},
        tuple(evidence),
    )


def ssh_probes(grants: Grants) -> list[Probe]:
    """The probes above for a spec with a proxy; none for one without."""
    spec = grants.spec
    if not spec.has_proxy or spec.network_host:
        return []
    unlisted = f"{PREFIX}{secrets.token_hex(6)}.invalid:{SSH_PORT}"
    probes = [
        _probe(
            "proxy:ssh-unlisted",
            unlisted,
            "ssh to a host not listed",
            PORT_RULE if spec.internet_any else None,
        )
    ]
    bare = next((h for h in spec.internet if h.port is None and not h.wildcard), None)
    if bare is not None:
        target = f"{bare.name}:{SSH_PORT}"
        why = "ssh to a host listed without :22"
        probes.append(_probe(f"proxy:ssh-bare:{bare.name}", target, why, PORT_RULE))
    return probes
