"""What `lnk sandbox check` tries against a hosted `[[models]]` rule's provider by address: a
tunnel there would carry a key of the sandbox's own past the rule, whatever name it gave.

Per hosted rule (kinds `anthropic`, `openai`), through the proxy, each expected refused:
- **its host's address** (`:connect-address`): CONNECT to the first address this machine's
  resolver gives the rule's host, as a literal (`[internet]` never opens an address: the
  policy's own refusal);
- **another name for it** (`:connect-other-name`): CONNECT to a name the address's reverse
  lookup gives that resolves to the same address again (a CNAME, a CDN's name for the front):
  the proxy's judgement of the dial address (`lnk_proxy.hosted_tunnels`) must refuse it, and
  under an `[internet]` that reaches the name (`*`, or a pattern it matches) the wire's log must say
  the hosted rule's refusal (`model-plain-http-only`), not a later one. The proxy's test-only
  `unsafe_hosted_tunnel_by_address` reopens the class: the probe is then `leaked`.
The evidence is the wire log (an allowed decision for the target is the leak). A probe whose
name or address this machine does not know is reported not tried, with why.

`look_up_providers` asks this machine's resolver (the one the proxy uses on a box) outside the
sandbox, as the caller; `hosted_tunnel_probes` is pure over what it found.

Does NOT try every address of the provider, nor find names the reverse lookup does not give
(a name of the same CDN front chosen by the sandbox's program): the proxy refuses those by the
same judgement, which these probes show working.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from lnk_cli.check.plan import REFUSED, Evidence, Probe
from lnk_shared.grants import Grants
from lnk_shared.spec_models import HOSTED_KINDS

__all__ = [
    "TUNNEL_RULE",
    "ProviderNames",
    "hosted_tunnel_probes",
    "look_up_names",
    "look_up_providers",
]

HTTPS_PORT = 443
TUNNEL_RULE = "model-plain-http-only"  # lnk_proxy.hosted_grant.TUNNEL_RULE, as the log says it
MAX_REVERSE_LOOKUPS = 4  # of the host's addresses, how many are asked for their names


@dataclass(frozen=True)
class ProviderNames:
    """What this machine's resolver says of a rule's host: its addresses, and other names that
    resolve to one of them."""

    addresses: tuple[str, ...] = ()
    other_names: tuple[str, ...] = ()


def look_up_providers(grants: Grants) -> dict[str, ProviderNames]:
    """Each hosted rule's host, looked up here (forward, reverse, forward again)."""
    return {r.host: look_up_names(r.host) for r in grants.spec.models if r.kind in HOSTED_KINDS}


def hosted_tunnel_probes(grants: Grants, found: Mapping[str, ProviderNames]) -> list[Probe]:
    """The probes above for every hosted model rule of these grants, in rule order."""
    spec = grants.spec
    probes: list[Probe] = []
    for rule in spec.models:
        if rule.kind not in HOSTED_KINDS:
            continue
        names = found.get(rule.host, ProviderNames())
        ident = f"model:{rule.kind}:{rule.port}"
        address = names.addresses[0] if names.addresses else None
        literal = None if address is None else _literal(address)
        probes.append(
            _connect(
                f"{ident}:connect-address",
                f"CONNECT {literal or 'its address'}:{HTTPS_PORT}, {rule.host}'s address,",
                literal,
                None,
                f"{rule.host} has no address on this machine's resolver",
            )
        )
        other = names.other_names[0] if names.other_names else None
        reached = other is not None and (
            spec.internet_any or any(h.matches(other, HTTPS_PORT) for h in spec.internet)
        )
        probes.append(
            _connect(
                f"{ident}:connect-other-name",
                f"CONNECT {other or 'another name'}:{HTTPS_PORT}, another name for {rule.host},",
                other,
                TUNNEL_RULE if reached else None,
                f"no other name for {rule.host}'s addresses on this machine's resolver",
            )
        )
    return probes


def _connect(ident: str, tried: str, host: str | None, said: str | None, why: str) -> Probe:
    if host is None:
        return Probe(ident, f"{tried} through the proxy", REFUSED, None, not_tried=why)
    target = f"{host}:{HTTPS_PORT}"
    evidence = [Evidence("wire", target)]
    if said is not None:  # the refusal must be the hosted rule's, not the policy's
        evidence.append(Evidence("wire-said", (target, said)))
    step = {"id": ident, "kind": "proxy", "method": "CONNECT", "target": target}
    return Probe(ident, f"{tried} through the proxy", REFUSED, step, tuple(evidence))


def _literal(address: str) -> str:
    return f"[{address}]" if ipaddress.ip_address(address).version == 6 else address


def look_up_names(host: str) -> ProviderNames:
    """`host`'s addresses here, and the names their reverse lookups give that resolve to one
    of them again (forward-confirmed: a reverse name is anyone's to publish)."""
    addresses = _addresses(host)
    others: list[str] = []
    for address in addresses[:MAX_REVERSE_LOOKUPS]:
        try:
            name, aliases, _ = socket.gethostbyaddr(address)
        except (OSError, UnicodeError):
            continue
        for candidate in (name, *aliases):
            other = candidate.rstrip(".").lower()
            if other in (host, *others) or not other or _is_address(other):
                continue
            if set(_addresses(other)) & set(addresses):  # forward-confirmed: the same address
                others.append(other)
    return ProviderNames(tuple(addresses), tuple(others))


def _addresses(name: str) -> list[str]:
    try:
        infos = socket.getaddrinfo(name, HTTPS_PORT, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return []
    found: list[str] = []
    for family, _, _, _, sockaddr in infos:
        if family in (socket.AF_INET, socket.AF_INET6) and sockaddr[0] not in found:
            found.append(str(sockaddr[0]))
    return found


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True
