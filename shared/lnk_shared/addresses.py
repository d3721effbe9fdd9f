"""Classify IP addresses for the egress proxy and for spec validation: pure, no I/O.

`parse_host_address` reads a host the way browsers (WHATWG URL) and `inet_aton` read it, so
`127.1`, `0x7f000001` and `0177.0.0.1` are addresses, not names; a host that looks numeric but
is not a valid address raises `ValueError`, to be refused. `classify` puts an address in one
`AddressClass`, always judged on the IPv4 an IPv6 form stands for (`effective_address`).

Trusts: the caller's `local_addresses` and `local_networks` (every address and every bridge
network of this machine, read fresh), and its `unsafe_public_networks` (which only turn SPECIAL
into PUBLIC; the caller logs a warning on each use).

Security limitations: this module does NOT
- resolve names: `None` from `parse_host_address` means "a name"; the caller must classify
  every address the name resolves to, and connect to that checked address (no re-resolving);
- see routes, firewall rules or DNAT: a PUBLIC address may still be routed somewhere local;
- unwrap translation prefixes other than the well-known ones (a network-specific NAT64 prefix,
  ISATAP, a 64:ff9b:1::/48 prefix shorter than /96: the last is judged on its last 32 bits and
  is never PUBLIC, since where it leads depends on the local translator);
- know every cloud's metadata address: METADATA_ADDRESSES lists the known ones; the rest of
  169.254/16 and fe80::/10 is refused as link-local, but e.g. AWS's other fd00:ec2:: service
  addresses are plain unique-local (PRIVATE_LAN);
- accept non-ASCII hosts: IDNA-encode a name before calling (full-width digits are refused).
"""

from __future__ import annotations

import enum
import ipaddress
import re

__all__ = [
    "CGNAT_NETWORK",
    "METADATA_ADDRESSES",
    "NEVER_CLASSES",
    "PRIVATE_LAN_NETWORKS",
    "SPECIAL_NETWORKS",
    "AddressClass",
    "IPAddress",
    "IPNetwork",
    "classify",
    "effective_address",
    "embedded_ipv4",
    "is_cgnat",
    "is_lan_network",
    "is_private_lan",
    "parse_host_address",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_v4 = ipaddress.IPv4Network
_v6 = ipaddress.IPv6Network

# RFC 1918 and unique-local IPv6: the only ranges a box may be granted as "LAN".
PRIVATE_LAN_NETWORKS: tuple[IPNetwork, ...] = (
    _v4("10.0.0.0/8"),
    _v4("172.16.0.0/12"),
    _v4("192.168.0.0/16"),
    _v6("fc00::/7"),
)

# Shared address space (RFC 6598): also a provider's and Tailscale's, so granted by exact address.
CGNAT_NETWORK = _v4("100.64.0.0/10")

# Cloud instance metadata and platform endpoints: they hand out credentials to whoever asks.
METADATA_ADDRESSES: frozenset[IPAddress] = frozenset(
    ipaddress.ip_address(text)
    for text in (
        "169.254.169.254",  # AWS, GCP, Azure, Oracle, OpenStack, DigitalOcean, Hetzner ...
        "169.254.170.2",  # AWS ECS task metadata and credentials
        "169.254.170.23",  # AWS EKS Pod Identity agent
        "169.254.42.42",  # Scaleway
        "169.254.0.23",  # Tencent Cloud
        "100.100.100.200",  # Alibaba Cloud (inside CGNAT, so it must be named here)
        "168.63.129.16",  # Azure WireServer (looks public)
        "192.0.0.192",  # Oracle Cloud Classic / Cloud at Customer
        "fd00:ec2::254",  # AWS IMDS over IPv6 (unique-local, not link-local)
        "fd00:ec2::23",  # AWS EKS Pod Identity agent over IPv6
        "fd20:ce::254",  # GCP over IPv6
        "fd00:c1::a9fe:a9fe",  # Oracle OCI over IPv6
        "fd00:42::42",  # Scaleway over IPv6
        "fd00:a9fe:a9fe::1",  # Akamai / Linode over IPv6
        "fd00:100::100:200",  # Alibaba Cloud over IPv6
        "fe80::a9fe:a9fe",  # OpenStack over IPv6
    )
)

# Special-purpose ranges (IANA registries) that are not the public internet.
SPECIAL_NETWORKS: tuple[IPNetwork, ...] = (
    _v4("0.0.0.0/8"),  # "this network"; 0.0.0.0 itself is UNSPECIFIED
    _v4("192.0.0.0/24"),  # IETF protocol assignments (DS-Lite, NAT64 discovery ...)
    _v4("192.0.2.0/24"),  # TEST-NET-1 documentation
    _v4("192.88.99.0/24"),  # deprecated 6to4 relay anycast (RFC 7526)
    _v4("198.18.0.0/15"),  # benchmarking; test boxes pass it as an unsafe public network
    _v4("198.51.100.0/24"),  # TEST-NET-2 documentation
    _v4("203.0.113.0/24"),  # TEST-NET-3 documentation
    _v4("224.0.0.0/4"),  # multicast
    _v4("240.0.0.0/4"),  # reserved, including 255.255.255.255 limited broadcast
    _v6("2001::/23"),  # IETF protocol assignments (Teredo is unwrapped before this check)
    _v6("2001:db8::/32"),  # documentation
    _v6("3fff::/20"),  # documentation (RFC 9637)
)

# The only IPv6 space allocated for global unicast: anything outside it is never PUBLIC.
_GLOBAL_UNICAST_V6 = _v6("2000::/3")

# IPv6 forms that carry an IPv4 address in their last 32 bits.
_IPV4_MAPPED = _v6("::ffff:0:0/96")  # ::ffff:a.b.c.d, what dual-stack sockets use
_IPV4_TRANSLATED = _v6("::ffff:0:0:0/96")  # SIIT (RFC 2765) ::ffff:0:a.b.c.d
_IPV4_COMPATIBLE = _v6("::/96")  # deprecated ::a.b.c.d; :: and ::1 excluded
_NAT64_WELL_KNOWN = _v6("64:ff9b::/96")  # RFC 6052 well-known NAT64 prefix
_NAT64_LOCAL_USE = _v6("64:ff9b:1::/48")  # RFC 8215 local-use NAT64: layout unknown here
# IPv6 forms that carry an IPv4 address elsewhere.
_SIX_TO_FOUR = _v6("2002::/16")  # RFC 3056: IPv4 in bits 16-47
_TEREDO = _v6("2001::/32")  # RFC 4380: client IPv4 inverted in the last 32 bits

# A DNS name is at most 253 characters (254 with the root dot); longer is not a host.
_MAX_HOST_LENGTH = 254
# One DNS label: letters, digits, hyphen, underscore (seen in the wild), 1 to 63 characters.
_NAME = re.compile(r"(?:[A-Za-z0-9_-]{1,63}\.)*[A-Za-z0-9_-]{1,63}\.?")
# The digits an IPv4 part may use in each radix WHATWG and inet_aton accept.
_RADIX_DIGITS = {
    8: frozenset("01234567"),
    10: frozenset("0123456789"),
    16: frozenset("0123456789abcdefABCDEF"),
}


class AddressClass(enum.StrEnum):
    """What an address is, for a rule to allow or refuse. `classify` tries them in this order."""

    LOOPBACK = "loopback"
    UNSPECIFIED = "unspecified"
    METADATA = "metadata"
    THIS_MACHINE = "this-machine"
    LOCAL_NETWORK = "local-network"
    LINK_LOCAL = "link-local"
    PRIVATE_LAN = "private-lan"
    CGNAT = "cgnat"
    SPECIAL = "special"
    PUBLIC = "public"


# This machine, its containers and VMs, link-local and metadata: refused whatever is listed.
NEVER_CLASSES: frozenset[AddressClass] = frozenset(
    {
        AddressClass.LOOPBACK,
        AddressClass.UNSPECIFIED,
        AddressClass.METADATA,
        AddressClass.THIS_MACHINE,
        AddressClass.LOCAL_NETWORK,
        AddressClass.LINK_LOCAL,
    }
)


def _parse_ipv4_part(part: str) -> int | None:
    """One dotted part as WHATWG reads it: decimal, 0x hex, or 0-prefixed octal; None if not."""
    if not part:
        return None
    radix = 10
    if part[:2] in ("0x", "0X"):
        part, radix = part[2:], 16
    elif len(part) > 1 and part[0] == "0":
        part, radix = part[1:], 8
    if not part:
        return 0  # "0x" is zero to WHATWG; glibc refuses it; either way it is no name
    if not _RADIX_DIGITS[radix].issuperset(part):
        return None
    return int(part, radix)


def _parse_ipv4(text: str, parts: list[str]) -> ipaddress.IPv4Address:
    numbers = [_parse_ipv4_part(part) for part in parts]
    if len(parts) > 4 or None in numbers:
        raise ValueError(f"host {text!r} ends in a number but is not an IPv4 address")
    checked = [number for number in numbers if number is not None]
    *leading, last = checked
    if any(number > 255 for number in leading) or last >= 256 ** (5 - len(checked)):
        raise ValueError(f"host {text!r} has an IPv4 part out of range")
    value = last + sum(number << (8 * (3 - index)) for index, number in enumerate(leading))
    return ipaddress.IPv4Address(value)


def _parse_ipv6(text: str, body: str) -> ipaddress.IPv6Address:
    address, percent, zone = body.partition("%")
    if percent and not zone:
        raise ValueError(f"host {text!r} has an empty IPv6 zone")
    try:
        return ipaddress.IPv6Address(address)
    except ValueError:
        raise ValueError(f"host {text!r} is neither a name nor an IPv6 address") from None


def parse_host_address(text: str) -> IPAddress | None:
    """The address `text` names as a URL host, None if it is a DNS name.

    Raises ValueError for a host that is neither: an invalid numeric form (`256.0.0.1`,
    `1.2.3.4.5`, `08`), a bad IPv6 literal, non-ASCII, or characters no name may hold. An
    IPv6 zone (`fe80::1%eth0`) is dropped: the address is what is judged.
    """
    if not text.isascii():
        raise ValueError(f"host {text!r} is not ASCII: IDNA-encode a name first")
    if len(text) > _MAX_HOST_LENGTH:
        raise ValueError(f"host {text[:40]!r}... is longer than {_MAX_HOST_LENGTH} characters")
    if text.startswith("[") or text.endswith("]"):
        if not (text.startswith("[") and text.endswith("]")):
            raise ValueError(f"host {text!r} has unbalanced brackets")
        return _parse_ipv6(text, text[1:-1])
    if ":" in text:
        return _parse_ipv6(text, text)
    parts = text.split(".")
    if len(parts) > 1 and not parts[-1]:
        parts.pop()  # a trailing root dot: "127.0.0.1." is still 127.0.0.1
    last = parts[-1]
    if last and (last.isdigit() or _parse_ipv4_part(last) is not None):
        return _parse_ipv4(text, parts)  # WHATWG: a host ending in a number is IPv4 or invalid
    if not _NAME.fullmatch(text):
        raise ValueError(f"host {text!r} is not a valid name or address")
    return None


def embedded_ipv4(addr: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 form carries (mapped, translated, compatible, NAT64, 6to4,
    Teredo client), None for any other IPv6 address."""
    if addr in _SIX_TO_FOUR:
        return ipaddress.IPv4Address((int(addr) >> 80) & 0xFFFFFFFF)
    if addr in _TEREDO:
        return ipaddress.IPv4Address(~int(addr) & 0xFFFFFFFF)
    low32 = ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    if any(addr in net for net in (_IPV4_MAPPED, _IPV4_TRANSLATED, _NAT64_WELL_KNOWN)):
        return low32
    if addr in _NAT64_LOCAL_USE:
        return low32  # the /96 layout; classify never calls these PUBLIC (see module docstring)
    if addr in _IPV4_COMPATIBLE and int(addr) > 1:
        return low32
    return None


def effective_address(addr: IPAddress) -> IPAddress:
    """The IPv4 address an IPv6 form stands for, else `addr` (an IPv6 zone dropped)."""
    bare = _without_zone(addr)
    if isinstance(bare, ipaddress.IPv4Address):
        return bare
    return embedded_ipv4(bare) or bare


def _without_zone(addr: IPAddress) -> IPAddress:
    """`fe80::1%eth0` as `fe80::1`: a zone changes equality and hashing, not where it leads."""
    if isinstance(addr, ipaddress.IPv6Address) and addr.scope_id is not None:
        return ipaddress.IPv6Address(int(addr))
    return addr


def _in_any(addr: IPAddress, networks: tuple[IPNetwork, ...]) -> bool:
    return any(addr in net for net in networks)  # a v4 address is never in a v6 network


def is_private_lan(addr: IPAddress) -> bool:
    """In one of PRIVATE_LAN_NETWORKS, judged on the effective address."""
    return _in_any(effective_address(addr), PRIVATE_LAN_NETWORKS)


def is_cgnat(addr: IPAddress) -> bool:
    """In 100.64.0.0/10, judged on the effective address."""
    return effective_address(addr) in CGNAT_NETWORK


def is_lan_network(net: IPNetwork) -> bool:
    """Whether a spec may grant `net` as LAN: wholly inside one private LAN network, or one
    CGNAT address (/32). A metadata address is never LAN; IPv6 forms of IPv4 ranges are not
    unwrapped (write them as IPv4). Each address is still classified when connected to."""
    if net.num_addresses == 1 and net.network_address in METADATA_ADDRESSES:
        return False
    if net.prefixlen == 32 and net.network_address in CGNAT_NETWORK:
        return True  # carrier-grade NAT space is granted one address at a time
    return any(_subnet_of(net, lan) for lan in PRIVATE_LAN_NETWORKS)


def _subnet_of(net: IPNetwork, other: IPNetwork) -> bool:
    if isinstance(net, ipaddress.IPv4Network) and isinstance(other, ipaddress.IPv4Network):
        return net.subnet_of(other)
    if isinstance(net, ipaddress.IPv6Network) and isinstance(other, ipaddress.IPv6Network):
        return net.subnet_of(other)
    return False


def classify(
    addr: IPAddress,
    *,
    local_addresses: frozenset[IPAddress],
    local_networks: tuple[IPNetwork, ...],
    unsafe_public_networks: tuple[IPNetwork, ...] = (),
) -> AddressClass:
    """The class of `addr`, judged on its effective address, first match in AddressClass order.

    The NEVER_CLASSES come first, so a bridge inside 172.16/12 is LOCAL_NETWORK, not
    PRIVATE_LAN, and 169.254.169.254 is METADATA, not LINK_LOCAL. `local_addresses` and
    `local_networks` are matched on both the effective and the literal IPv6 address.
    `unsafe_public_networks` only turn SPECIAL into PUBLIC; a NEVER class, PRIVATE_LAN or CGNAT
    address stays what it is.
    """
    bare = _without_zone(addr)
    eff = effective_address(bare)
    forms = (eff, bare)
    result = _classify_effective(eff, forms, local_addresses, local_networks)
    if result is AddressClass.SPECIAL and any(_in_any(f, unsafe_public_networks) for f in forms):
        result = AddressClass.PUBLIC
    if result is AddressClass.PUBLIC and bare in _NAT64_LOCAL_USE:
        result = AddressClass.SPECIAL  # the translator decides where it leads
    return result


def _classify_effective(
    eff: IPAddress,
    forms: tuple[IPAddress, IPAddress],
    local_addresses: frozenset[IPAddress],
    local_networks: tuple[IPNetwork, ...],
) -> AddressClass:
    ordered = (  # first true wins: the NEVER classes, then the most specific
        (AddressClass.LOOPBACK, eff.is_loopback),
        (AddressClass.UNSPECIFIED, eff.is_unspecified),
        (AddressClass.METADATA, any(f in METADATA_ADDRESSES for f in forms)),
        (AddressClass.THIS_MACHINE, any(f in local_addresses for f in forms)),
        (AddressClass.LOCAL_NETWORK, any(_in_any(f, local_networks) for f in forms)),
        (AddressClass.LINK_LOCAL, eff.is_link_local),
        (AddressClass.PRIVATE_LAN, _in_any(eff, PRIVATE_LAN_NETWORKS)),
        (AddressClass.CGNAT, eff in CGNAT_NETWORK),
        (AddressClass.SPECIAL, _in_any(eff, SPECIAL_NETWORKS)),
        (AddressClass.SPECIAL, eff.version == 6 and eff not in _GLOBAL_UNICAST_V6),
    )
    return next((cls for cls, hit in ordered if hit), AddressClass.PUBLIC)
