"""The proxy's decisions: may this sandbox reach this host and port, and at which address.

Pure: no I/O, no DNS, no sockets, no clock. Two steps, because the caller resolves names
between them:

1. `judge_target(grants, host, port)` reads the host as the request wrote it. A malformed host,
   a name that is never reached (`localhost`, metadata names), a name on no list, or an IP
   literal that `[lan]` does not list is refused here, so a refused name never reaches a
   resolver. Otherwise it returns a `Target`: the normalized name to resolve (or, for a
   literal, the address itself) and which lists the name matched.
2. `judge_addresses(grants, target, addresses, machine)` judges every address of the answer,
   each on the IPv4 an IPv6 form stands for. One refused address refuses the whole answer.
   `Allowed.address` is the one address to dial: the first of the answer, as judged.

The rules: never this machine, its bridges' networks, link-local or metadata, whatever is
listed. A name matched by `[internet]` reaches PUBLIC addresses only. A name matched by `[lan]`
(or `[lan] *`) reaches private LAN addresses, and a CGNAT address only when `[lan]` lists that
exact address. An IP literal is never a name on a list: it is reached only when `[lan]` lists
it (its address or a range holding it, or `*` for any private address). Empty grants refuse all.
A port of `LISTED_ONLY_PORTS` (22, ssh) is reached through `[internet]` only by an entry naming
it (`github.com:22`, `*.example.com:22`): a bare name or `*` opens every other port but that one
(`port-not-listed`). `[lan]` entries keep every port, as the seed says of the LAN.

A `Refused` carries a stable `rule` id, the only detail the sandbox may see, and a `reason` for
the wire's log. Trusts: the caller's `MachineView` (every address and bridge network of this
machine, read fresh) and `ProxyGrants` (from a judged spec).

Security limitations: this module does NOT
- stop DNS rebinding by itself: the caller must dial `Allowed.address` and never look the name
  up again; each request is judged anew, so a name's next answer is judged again;
- know this machine's host name or other names that point at it: they are caught only when
  their answer holds an address `MachineView` lists;
- see routes, firewall rules, DNAT or port forwards: a PUBLIC address may still lead back here;
- look inside a tunnel: a CONNECT to an allowed address may carry any TLS SNI or Host header;
- limit rate, bytes or time, or read the sandbox's stop and pause flags (the caller does).
"""

from __future__ import annotations

import enum
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from lnk_shared.addresses import (
    AddressClass,
    IPAddress,
    IPNetwork,
    classify,
    effective_address,
    is_lan_network,
    parse_host_address,
)
from lnk_shared.grants import Grants
from lnk_shared.hosts import LISTED_ONLY_PORTS, MAX_PORT, HostPattern, normalize_name
from lnk_shared.spec import LanEntry

__all__ = [
    "MAX_ANSWER_ADDRESSES",
    "METADATA_NAMES",
    "THIS_MACHINE_NAMES",
    "Allowed",
    "MachineView",
    "ProxyGrants",
    "Refused",
    "Rule",
    "Target",
    "TargetDecision",
    "Verdict",
    "judge_addresses",
    "judge_localhost",
    "judge_target",
]

# Names the machine answers itself (RFC 6761, Debian's /etc/hosts): refused with every name below.
THIS_MACHINE_NAMES = frozenset(
    {"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"}
)
# Names clouds give their metadata services: refused with every name below, before any lookup.
METADATA_NAMES = frozenset(
    {
        "metadata",
        "metadata.google.internal",
        "metadata.goog",
        "instance-data",
        "instance-data.ec2.internal",
    }
)
# Addresses of one answer judged, at most: far above a real answer (a few to a dozen); bounds
# the judging work per request. A longer answer is refused whole, never judged in part.
MAX_ANSWER_ADDRESSES = 64
# How much of a host a reason quotes: enough to recognize it; the log cuts and cleans it again.
MAX_SHOWN_HOST = 120


class Rule(enum.StrEnum):
    """Stable rule ids: the sandbox sees one with the fixed refusal; the log adds the reason."""

    ALLOWED_INTERNET = "allowed-internet"
    ALLOWED_LAN = "allowed-lan"
    ALLOWED_LOCALHOST_PORT = "allowed-localhost-port"
    ALLOWED_MODEL = "allowed-model"  # a [[models]] rule's runtime on this machine (model_relay)
    BAD_HOST = "bad-host"
    BAD_PORT = "bad-port"
    NOT_LISTED = "not-listed"
    PORT_NOT_LISTED = "port-not-listed"  # a LISTED_ONLY_PORTS port the entry does not name
    LITERAL_NOT_ALLOWED = "literal-not-allowed"
    NEVER_LOOPBACK = "never-loopback"
    NEVER_THIS_MACHINE = "never-this-machine"
    NEVER_METADATA = "never-metadata"
    NEVER_LOCAL_NETWORK = "never-local-network"
    NEVER_LINK_LOCAL = "never-link-local"
    INTERNET_NOT_PUBLIC = "internet-not-public"
    LAN_NOT_PRIVATE = "lan-not-private"
    NO_ADDRESS = "no-address"
    ANSWER_TOO_LONG = "answer-too-long"  # more addresses than MAX_ANSWER_ADDRESSES
    NO_ROUTE = "no-route"  # the kernel has no route out for the address (route_check)


# Each class that is never reached, and the rule that names it (0.0.0.0 and :: reach this machine).
_NEVER_RULES: dict[AddressClass, Rule] = {
    AddressClass.LOOPBACK: Rule.NEVER_LOOPBACK,
    AddressClass.UNSPECIFIED: Rule.NEVER_THIS_MACHINE,
    AddressClass.METADATA: Rule.NEVER_METADATA,
    AddressClass.THIS_MACHINE: Rule.NEVER_THIS_MACHINE,
    AddressClass.LOCAL_NETWORK: Rule.NEVER_LOCAL_NETWORK,
    AddressClass.LINK_LOCAL: Rule.NEVER_LINK_LOCAL,
}


@dataclass(frozen=True)
class ProxyGrants:
    """What one sandbox may reach through the proxy: a spec's `[internet]` and `[lan]`.

    Empty means deny. A `[lan]` address or range must be a private network or one CGNAT
    address (as the spec checks); anything else raises ValueError rather than open it.
    """

    internet_any: bool = False
    internet: tuple[HostPattern, ...] = ()
    lan_any: bool = False
    lan: tuple[LanEntry, ...] = ()
    localhost_ports: frozenset[int] = frozenset()  # [localhost] ports: raw to this machine
    # proxy.toml's unsafe_ssh_port_by_any_entry (a test switch, warned at start): port 22 is
    # opened by a bare name or `*` as any port is, so `lnk sandbox check` can see it leak
    unsafe_listed_only_ports_open: bool = False

    def __post_init__(self) -> None:
        for entry in self.lan:
            if (entry.name is None) == (entry.network is None):
                raise ValueError(f"a [lan] entry holds a name or a network, exactly one: {entry!r}")
        for network in _listed_networks(self):
            if not is_lan_network(network):
                raise ValueError(
                    f"[lan] {network} is not a private range nor one CGNAT address: not opened"
                )

    @classmethod
    def from_grants(cls, grants: Grants) -> ProxyGrants:
        """The proxy's part of judged grants (`[network] mode = "host"` has no proxy at all)."""
        spec = grants.spec
        return cls(
            internet_any=spec.internet_any,
            internet=spec.internet,
            lan_any=spec.lan_any,
            lan=spec.lan,
            localhost_ports=frozenset(spec.ports),
        )


@dataclass(frozen=True)
class MachineView:
    """This machine as the caller read it, fresh: what a sandbox must never reach.

    `local_networks` are bridges (docker, podman, libvirt) and other networks of this machine's
    guests; a LAN uplink's subnet listed here makes that whole LAN unreachable.
    `unsafe_public_networks` turns special ranges (198.18.0.0/15, the test internet) into
    PUBLIC; never loopback, private, CGNAT or any never-class. Tests only: log each use.
    """

    local_addresses: frozenset[IPAddress]
    local_networks: tuple[IPNetwork, ...]
    unsafe_public_networks: tuple[IPNetwork, ...] = ()


@dataclass(frozen=True)
class Refused:
    """A refusal: `rule` may go to the sandbox, `reason` only to the log."""

    rule: Rule
    reason: str


@dataclass(frozen=True)
class Target:
    """A request target that passed `judge_target`.

    `literal` is None for a name: resolve `host` once and pass every address of the answer to
    `judge_addresses`. For an IP literal, `host` is its text and `literal` the address it is
    judged as; pass `(literal,)` and resolve nothing.
    """

    host: str
    port: int
    literal: IPAddress | None
    internet: bool  # the name matched `[internet]`
    lan: bool  # the name matched `[lan]` (a name, or `*`), or the literal is listed there


@dataclass(frozen=True)
class Allowed:
    """Dial exactly `address` (judged, IPv6 forms of IPv4 already unwrapped) on `port`."""

    address: IPAddress
    port: int
    rule: Rule
    reason: str


TargetDecision = Target | Refused
Verdict = Allowed | Refused


# How a request names this machine's loopback when it asks for a `[localhost]` port.
LOCALHOST_FORMS = {"localhost": "127.0.0.1", "127.0.0.1": "127.0.0.1", "::1": "::1", "[::1]": "::1"}


def judge_localhost(grants: ProxyGrants, host_text: str, port: int) -> Allowed | None:
    """A `[localhost]` port: `localhost`, `127.0.0.1` or `::1` on a listed port is forwarded raw
    to that port of this machine's loopback (whatever serves it, with its whole API: a known
    gap the spec states). Anything else is None, and the ordinary rules refuse this machine."""
    address = LOCALHOST_FORMS.get(host_text.lower().rstrip("."))
    if address is None or port not in grants.localhost_ports:
        return None
    return Allowed(
        ipaddress.ip_address(address), port, Rule.ALLOWED_LOCALHOST_PORT, f"[localhost] port {port}"
    )


def judge_target(grants: ProxyGrants, host_text: str, port: int) -> TargetDecision:
    """Judge the host and port a request names, before any lookup.

    `host_text` is the bare host (a name, an IPv4 in any spelling, or an IPv6 literal with or
    without brackets), already split from the port.
    """
    shown = _shown(host_text)
    if not 1 <= port <= MAX_PORT:
        return Refused(Rule.BAD_PORT, f"port {port} of {shown} is not 1 to {MAX_PORT}")
    try:
        host = _read_host(host_text)
    except ValueError as exc:
        return Refused(Rule.BAD_HOST, f"{shown} is neither a name nor an address: {exc}")
    if isinstance(host, str):
        return _judge_name(grants, host, port)
    return _judge_literal(grants, host, port, shown)


def judge_addresses(
    grants: ProxyGrants, target: Target, addresses: Sequence[IPAddress], machine: MachineView
) -> Verdict:
    """Judge the resolver's whole answer for `target`; any refused address refuses it all.

    Raises ValueError when a literal target is given anything but its own address.
    """
    if target.literal is not None and tuple(addresses) != (target.literal,):
        raise ValueError(f"the literal {target.host} is judged on itself, not on {addresses}")
    if not addresses:
        return Refused(Rule.NO_ADDRESS, f"{_shown(target.host)} resolved to no address")
    if len(addresses) > MAX_ANSWER_ADDRESSES:  # judged whole or not at all
        return Refused(
            Rule.ANSWER_TOO_LONG,
            f"{_shown(target.host)} resolved to over {MAX_ANSWER_ADDRESSES} addresses",
        )
    judged = [
        (address, effective_address(address), _class(address, machine)) for address in addresses
    ]
    for address, effective, cls in judged:  # a never-class first: the log names the worst
        never = _NEVER_RULES.get(cls)
        if never is not None:
            return Refused(never, f"{_answer(target, address, effective)} is {cls}: never reached")
    listed = _listed_networks(grants)
    allowed: list[tuple[IPAddress, Rule]] = []
    for address, effective, cls in judged:
        rule = _route(grants, target, effective, cls, listed)
        if rule is None:
            refusal = Rule.INTERNET_NOT_PUBLIC if target.internet else Rule.LAN_NOT_PRIVATE
            return Refused(
                refusal, f"{_answer(target, address, effective)} is {cls}: {_lists(target)}"
            )
        allowed.append((effective, rule))
    address, rule = allowed[0]
    return Allowed(address, target.port, rule, f"{_shown(target.host)} at {address} ({rule})")


def _read_host(host_text: str) -> IPAddress | str:
    """The address a host denotes, or its normalized name; ValueError when it is neither."""
    text = host_text
    if not text.isascii():
        text = normalize_name(text)  # IDNA first: addresses are read from ASCII only
    address = parse_host_address(text)
    if address is not None:
        return address
    return normalize_name(text)


def _judge_name(grants: ProxyGrants, name: str, port: int) -> TargetDecision:
    if _under(name, THIS_MACHINE_NAMES):
        return Refused(Rule.NEVER_THIS_MACHINE, f"{_shown(name)} names this machine")
    if _under(name, METADATA_NAMES):
        return Refused(Rule.NEVER_METADATA, f"{_shown(name)} names a cloud metadata service")
    internet = _internet_lists(grants, name, port)
    lan = grants.lan_any or any(
        entry.name is not None and entry.name.matches(name, port) for entry in grants.lan
    )
    if not (internet or lan) and port in LISTED_ONLY_PORTS and _internet_names(grants, name):
        return Refused(
            Rule.PORT_NOT_LISTED,
            f"{_shown(name)} port {port} (ssh) is reached only when [internet] lists "
            f"'{name}:{port}' itself: a name alone or '*' never opens it",
        )
    if not (internet or lan):
        return Refused(
            Rule.NOT_LISTED, f"{_shown(name)} port {port} is on no [internet] or [lan] list"
        )
    return Target(host=name, port=port, literal=None, internet=internet, lan=lan)


def _internet_lists(grants: ProxyGrants, name: str, port: int) -> bool:
    """`[internet]` lets `name` reach `port`: a port of LISTED_ONLY_PORTS only by an entry that
    names that port, any other by `*` or a matching entry."""
    if port in LISTED_ONLY_PORTS and not grants.unsafe_listed_only_ports_open:
        return any(p.port == port and p.matches(name, port) for p in grants.internet)
    return grants.internet_any or any(p.matches(name, port) for p in grants.internet)


def _internet_names(grants: ProxyGrants, name: str) -> bool:
    """`*`, or an entry for `name` on any port: what reaches it everywhere but LISTED_ONLY_PORTS."""
    return grants.internet_any or any(
        p.port is None and p.matches(name, 0) for p in grants.internet
    )


def _judge_literal(
    grants: ProxyGrants, address: IPAddress, port: int, shown: str
) -> TargetDecision:
    effective = effective_address(address)
    # No machine here: only the classes every machine shares (loopback, metadata, link-local).
    cls = classify(address, local_addresses=frozenset(), local_networks=())
    never = _NEVER_RULES.get(cls)
    if never is not None:
        return Refused(never, f"{shown} is {effective}, {cls}: never reached")
    if not _lan_allows(effective, cls, _listed_networks(grants), any_private=grants.lan_any):
        return Refused(
            Rule.LITERAL_NOT_ALLOWED,
            f"{shown} is {effective} ({cls}): an address is reached only when [lan] lists it",
        )
    return Target(host=str(effective), port=port, literal=effective, internet=False, lan=True)


def _route(
    grants: ProxyGrants,
    target: Target,
    effective: IPAddress,
    cls: AddressClass,
    listed: tuple[IPNetwork, ...],
) -> Rule | None:
    """The rule that lets `target` reach `effective` (not a never-class), None if none does."""
    if target.literal is not None:
        return (
            Rule.ALLOWED_LAN
            if _lan_allows(effective, cls, listed, any_private=grants.lan_any)
            else None
        )
    if target.internet and cls is AddressClass.PUBLIC:
        return Rule.ALLOWED_INTERNET
    if target.lan and _lan_allows(effective, cls, listed, any_private=True):
        return Rule.ALLOWED_LAN
    return None


def _lan_allows(
    effective: IPAddress, cls: AddressClass, listed: tuple[IPNetwork, ...], *, any_private: bool
) -> bool:
    """Private: when any private address is allowed or a listed range holds it. CGNAT: only an
    address listed exactly. Anything else (public, special) is never LAN."""
    if cls is AddressClass.PRIVATE_LAN:
        return any_private or any(effective in network for network in listed)
    if cls is AddressClass.CGNAT:
        return any(n.num_addresses == 1 and effective == n.network_address for n in listed)
    return False


def _listed_networks(grants: ProxyGrants) -> tuple[IPNetwork, ...]:
    """`[lan]` addresses and ranges; a single address as the IPv4 it stands for, if any."""
    networks: list[IPNetwork] = []
    for entry in grants.lan:
        if entry.network is None:
            continue
        if entry.network.num_addresses == 1:
            single = effective_address(entry.network.network_address)
            networks.append(ipaddress.ip_network(single))
        else:
            networks.append(entry.network)
    return tuple(networks)


def _class(address: IPAddress, machine: MachineView) -> AddressClass:
    return classify(
        address,
        local_addresses=machine.local_addresses,
        local_networks=machine.local_networks,
        unsafe_public_networks=machine.unsafe_public_networks,
    )


def _under(name: str, roots: frozenset[str]) -> bool:
    """`name` is one of `roots` or a name below one, on a label boundary."""
    labels = name.split(".")
    return any(".".join(labels[i:]) in roots for i in range(len(labels)))


def _answer(target: Target, address: IPAddress, effective: IPAddress) -> str:
    judged_as = "" if address == effective else f" (judged as {effective})"
    return f"{_shown(target.host)} answered {address}{judged_as}, which"


def _lists(target: Target) -> str:
    if target.literal is not None:
        return "not a listed [lan] address"
    matched = [
        name for name, hit in (("[internet]", target.internet), ("[lan]", target.lan)) if hit
    ]
    return f"{' and '.join(matched)} matched; [internet] reaches public, [lan] private addresses"


def _shown(text: str) -> str:
    """`text` quoted for a reason, at most MAX_SHOWN_HOST characters of it."""
    cut = text[:MAX_SHOWN_HOST]
    return repr(cut) + ("..." if len(text) > MAX_SHOWN_HOST else "")
