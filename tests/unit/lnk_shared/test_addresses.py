"""Address classification: every hostile spelling of a refused address is judged as that address."""

from __future__ import annotations

import ipaddress
import socket

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lnk_shared import addresses
from lnk_shared.addresses import (
    CGNAT_NETWORK,
    METADATA_ADDRESSES,
    NEVER_CLASSES,
    PRIVATE_LAN_NETWORKS,
    AddressClass,
    IPAddress,
    IPNetwork,
    classify,
    effective_address,
    embedded_ipv4,
    is_cgnat,
    is_lan_network,
    is_private_lan,
    parse_host_address,
)

ip = ipaddress.ip_address
net = ipaddress.ip_network
C = AddressClass

# A machine with a public IPv4 on a /26, a public IPv6, and docker, podman and libvirt bridges.
THIS_MACHINE_ADDRESSES: frozenset[IPAddress] = frozenset(
    {ip("81.2.69.160"), ip("2a01:4f8:c17:1::10"), ip("172.17.0.1"), ip("192.168.122.1")}
)
THIS_MACHINE_NETWORKS: tuple[IPNetwork, ...] = (
    net("81.2.69.128/26"),  # the uplink's own subnet
    net("172.17.0.0/16"),  # docker0
    net("10.88.0.0/16"),  # podman
    net("192.168.122.0/24"),  # libvirt virbr0
    net("fd00:dead:beef::/64"),  # a ULA bridge
)
# What test boxes pass as a fake internet.
FAKE_INTERNET: tuple[IPNetwork, ...] = (net("198.18.0.0/15"),)


def judge(host: str, unsafe_public: tuple[IPNetwork, ...] = ()) -> AddressClass:
    address = parse_host_address(host)
    assert address is not None, f"{host!r} parsed as a name"
    return classify(
        address,
        local_addresses=THIS_MACHINE_ADDRESSES,
        local_networks=THIS_MACHINE_NETWORKS,
        unsafe_public_networks=unsafe_public,
    )


def judge_address(address: IPAddress, unsafe_public: tuple[IPNetwork, ...] = ()) -> AddressClass:
    return classify(
        address,
        local_addresses=THIS_MACHINE_ADDRESSES,
        local_networks=THIS_MACHINE_NETWORKS,
        unsafe_public_networks=unsafe_public,
    )


# host text, the class it must get; ids name the attack.
CLASSIFIED = [
    # Loopback, in every spelling a URL parser or inet_aton accepts.
    pytest.param("127.0.0.1", C.LOOPBACK, id="dotted-loopback"),
    pytest.param("127.1", C.LOOPBACK, id="two-part-loopback"),
    pytest.param("127.0.1", C.LOOPBACK, id="three-part-loopback"),
    pytest.param("0x7f.0.0.1", C.LOOPBACK, id="hex-part-loopback"),
    pytest.param("0X7F.1", C.LOOPBACK, id="upper-hex-two-part-loopback"),
    pytest.param("0177.0.0.1", C.LOOPBACK, id="octal-part-loopback"),
    pytest.param("017700000001", C.LOOPBACK, id="octal-integer-loopback"),
    pytest.param("2130706433", C.LOOPBACK, id="decimal-integer-loopback"),
    pytest.param("0x7f000001", C.LOOPBACK, id="hex-integer-loopback"),
    pytest.param("127.0.0.1.", C.LOOPBACK, id="trailing-dot-loopback"),
    pytest.param("127.255.255.254", C.LOOPBACK, id="whole-127-slash-8"),
    pytest.param("::1", C.LOOPBACK, id="ipv6-loopback"),
    pytest.param("[::1]", C.LOOPBACK, id="bracketed-ipv6-loopback"),
    pytest.param("0:0:0:0:0:0:0:1", C.LOOPBACK, id="long-ipv6-loopback"),
    pytest.param("::ffff:127.0.0.1", C.LOOPBACK, id="ipv4-mapped-loopback"),
    pytest.param("::ffff:7f00:1", C.LOOPBACK, id="ipv4-mapped-hex-loopback"),
    pytest.param("[::ffff:7f00:1]", C.LOOPBACK, id="bracketed-ipv4-mapped-loopback"),
    pytest.param("::ffff:0:7f00:1", C.LOOPBACK, id="ipv4-translated-loopback"),
    pytest.param("::127.0.0.1", C.LOOPBACK, id="ipv4-compatible-loopback"),
    pytest.param("::7f00:1", C.LOOPBACK, id="ipv4-compatible-hex-loopback"),
    pytest.param("64:ff9b::7f00:1", C.LOOPBACK, id="nat64-loopback"),
    pytest.param("64:ff9b::127.0.0.1", C.LOOPBACK, id="nat64-dotted-loopback"),
    pytest.param("64:ff9b:1::7f00:1", C.LOOPBACK, id="local-use-nat64-loopback"),
    pytest.param("2002:7f00:1::", C.LOOPBACK, id="6to4-loopback"),
    pytest.param("2002:7f00:1:1::5", C.LOOPBACK, id="6to4-loopback-any-host"),
    pytest.param("2001:0:4136:e378:8000:63bf:80ff:fffe", C.LOOPBACK, id="teredo-loopback"),
    # Unspecified: connecting to it reaches this machine.
    pytest.param("0", C.UNSPECIFIED, id="zero"),
    pytest.param("0.0.0.0", C.UNSPECIFIED, id="dotted-zero"),
    pytest.param("00", C.UNSPECIFIED, id="octal-zero"),
    pytest.param("0x0", C.UNSPECIFIED, id="hex-zero"),
    pytest.param("0x", C.UNSPECIFIED, id="bare-hex-prefix-is-zero-to-whatwg"),
    pytest.param("0.0", C.UNSPECIFIED, id="two-part-zero"),
    pytest.param("::", C.UNSPECIFIED, id="ipv6-unspecified"),
    pytest.param("[::]", C.UNSPECIFIED, id="bracketed-ipv6-unspecified"),
    pytest.param("::ffff:0.0.0.0", C.UNSPECIFIED, id="ipv4-mapped-zero"),
    pytest.param("64:ff9b::", C.UNSPECIFIED, id="nat64-zero"),
    pytest.param("2002::", C.UNSPECIFIED, id="6to4-zero"),
    # Cloud metadata: before link-local, and whatever it looks like.
    pytest.param("169.254.169.254", C.METADATA, id="imds"),
    pytest.param("0xa9fea9fe", C.METADATA, id="hex-integer-imds"),
    pytest.param("2852039166", C.METADATA, id="decimal-integer-imds"),
    pytest.param("0251.0376.0251.0376", C.METADATA, id="octal-imds"),
    pytest.param("169.254.43518", C.METADATA, id="three-part-imds"),
    pytest.param("::ffff:169.254.169.254", C.METADATA, id="ipv4-mapped-imds"),
    pytest.param("::ffff:a9fe:a9fe", C.METADATA, id="ipv4-mapped-hex-imds"),
    pytest.param("64:ff9b::a9fe:a9fe", C.METADATA, id="nat64-imds"),
    pytest.param("2002:a9fe:a9fe::", C.METADATA, id="6to4-imds"),
    pytest.param("fd00:ec2::254", C.METADATA, id="aws-ipv6-imds-is-not-just-ula"),
    pytest.param("[FD00:EC2:0::254]", C.METADATA, id="upper-case-aws-ipv6-imds"),
    pytest.param("fd20:ce::254", C.METADATA, id="gcp-ipv6-metadata"),
    pytest.param("fe80::a9fe:a9fe%eth0", C.METADATA, id="openstack-ipv6-metadata-with-zone"),
    pytest.param("169.254.170.2", C.METADATA, id="ecs-task-credentials"),
    pytest.param("100.100.100.200", C.METADATA, id="alibaba-metadata-is-not-cgnat"),
    pytest.param("::ffff:100.100.100.200", C.METADATA, id="ipv4-mapped-alibaba-metadata"),
    pytest.param("168.63.129.16", C.METADATA, id="azure-wireserver-is-not-public"),
    # This machine, and the networks of its containers and VMs.
    pytest.param("81.2.69.160", C.THIS_MACHINE, id="own-public-address"),
    pytest.param("::ffff:81.2.69.160", C.THIS_MACHINE, id="ipv4-mapped-own-address"),
    pytest.param("2002:5102:45a0::", C.THIS_MACHINE, id="6to4-own-address"),
    pytest.param("2a01:4f8:c17:1::10", C.THIS_MACHINE, id="own-ipv6-address"),
    pytest.param("172.17.0.1", C.THIS_MACHINE, id="docker0-gateway-is-this-machine"),
    pytest.param("172.17.0.2", C.LOCAL_NETWORK, id="docker-container-is-not-lan"),
    pytest.param("::ffff:172.17.0.2", C.LOCAL_NETWORK, id="ipv4-mapped-docker-container"),
    pytest.param("10.88.0.7", C.LOCAL_NETWORK, id="podman-container-is-not-lan"),
    pytest.param("192.168.122.50", C.LOCAL_NETWORK, id="libvirt-vm-is-not-lan"),
    pytest.param("fd00:dead:beef::5", C.LOCAL_NETWORK, id="ula-bridge-is-not-lan"),
    pytest.param("81.2.69.130", C.LOCAL_NETWORK, id="own-uplink-subnet-is-not-public"),
    # Link-local.
    pytest.param("169.254.1.1", C.LINK_LOCAL, id="ipv4-link-local"),
    pytest.param("::ffff:169.254.1.1", C.LINK_LOCAL, id="ipv4-mapped-link-local"),
    pytest.param("fe80::1", C.LINK_LOCAL, id="ipv6-link-local"),
    pytest.param("fe80::1%eth0", C.LINK_LOCAL, id="ipv6-link-local-with-zone"),
    pytest.param("[fe80::1%25eth0]", C.LINK_LOCAL, id="url-encoded-zone"),
    # Private LAN.
    pytest.param("10.0.0.1", C.PRIVATE_LAN, id="rfc1918-10"),
    pytest.param("012.0.0.1", C.PRIVATE_LAN, id="octal-rfc1918-10"),
    pytest.param("::ffff:10.0.0.1", C.PRIVATE_LAN, id="ipv4-mapped-rfc1918"),
    pytest.param("64:ff9b::a00:1", C.PRIVATE_LAN, id="nat64-rfc1918"),
    pytest.param("172.16.0.1", C.PRIVATE_LAN, id="rfc1918-172-low"),
    pytest.param("172.31.255.255", C.PRIVATE_LAN, id="rfc1918-172-high"),
    pytest.param("192.168.0x1.1", C.PRIVATE_LAN, id="hex-part-rfc1918-192"),
    pytest.param("3232235777", C.PRIVATE_LAN, id="decimal-integer-rfc1918-192"),
    pytest.param("fd12:3456::1", C.PRIVATE_LAN, id="ula"),
    # Carrier-grade NAT.
    pytest.param("100.64.0.1", C.CGNAT, id="cgnat-low"),
    pytest.param("100.127.255.255", C.CGNAT, id="cgnat-high"),
    pytest.param("::ffff:100.64.0.1", C.CGNAT, id="ipv4-mapped-cgnat"),
    # Special purpose: never public unless the caller says so.
    pytest.param("198.18.0.5", C.SPECIAL, id="benchmarking"),
    pytest.param("0.1.2.3", C.SPECIAL, id="this-network"),
    pytest.param("192.0.0.8", C.SPECIAL, id="ietf-protocol-assignments"),
    pytest.param("192.0.2.1", C.SPECIAL, id="test-net-1"),
    pytest.param("192.88.99.1", C.SPECIAL, id="deprecated-6to4-relay"),
    pytest.param("198.51.100.1", C.SPECIAL, id="test-net-2"),
    pytest.param("203.0.113.1", C.SPECIAL, id="test-net-3"),
    pytest.param("224.0.0.1", C.SPECIAL, id="multicast"),
    pytest.param("::ffff:224.0.0.1", C.SPECIAL, id="ipv4-mapped-multicast"),
    pytest.param("240.0.0.1", C.SPECIAL, id="reserved"),
    pytest.param("255.255.255.255", C.SPECIAL, id="broadcast"),
    pytest.param("4294967295", C.SPECIAL, id="decimal-integer-broadcast"),
    pytest.param("2001:db8::1", C.SPECIAL, id="ipv6-documentation"),
    pytest.param("3fff::1", C.SPECIAL, id="ipv6-documentation-rfc9637"),
    pytest.param("2001:2::1", C.SPECIAL, id="ipv6-benchmarking"),
    pytest.param("ff02::1", C.SPECIAL, id="ipv6-multicast"),
    pytest.param("fec0::1", C.SPECIAL, id="ipv6-site-local"),
    pytest.param("100::1", C.SPECIAL, id="ipv6-discard"),
    pytest.param("4000::1", C.SPECIAL, id="ipv6-unallocated"),
    pytest.param("64:ff9b:1::808:808", C.SPECIAL, id="local-use-nat64-is-never-public"),
    # Public.
    pytest.param("8.8.8.8", C.PUBLIC, id="public"),
    pytest.param("134744072", C.PUBLIC, id="decimal-integer-public"),
    pytest.param("::ffff:8.8.8.8", C.PUBLIC, id="ipv4-mapped-public"),
    pytest.param("64:ff9b::808:808", C.PUBLIC, id="nat64-public"),
    pytest.param("2002:808:808::1", C.PUBLIC, id="6to4-public"),
    pytest.param("2001:0:4136:e378:8000:63bf:f7f7:f7f7", C.PUBLIC, id="teredo-public"),
    pytest.param("2606:4700:4700::1111", C.PUBLIC, id="ipv6-public"),
    pytest.param("100.63.255.255", C.PUBLIC, id="just-below-cgnat"),
    pytest.param("100.128.0.0", C.PUBLIC, id="just-above-cgnat"),
    pytest.param("172.32.0.1", C.PUBLIC, id="just-above-rfc1918-172"),
    pytest.param("11.0.0.1", C.PUBLIC, id="just-above-rfc1918-10"),
    pytest.param("198.20.0.1", C.PUBLIC, id="just-above-benchmarking"),
]


@pytest.mark.parametrize(("host", "expected"), CLASSIFIED)
def test_every_spelling_is_judged_as_the_address_it_reaches(
    host: str, expected: AddressClass
) -> None:
    assert judge(host) is expected


def test_ipv4_mapped_loopback_is_loopback() -> None:
    assert judge("::ffff:127.0.0.1") is C.LOOPBACK


def test_metadata_is_judged_before_link_local() -> None:
    assert ip("169.254.169.254").is_link_local
    assert judge("169.254.169.254") is C.METADATA


def test_bridge_inside_private_range_is_local_network_not_lan() -> None:
    assert is_private_lan(ip("172.17.0.2"))
    assert judge("172.17.0.2") is C.LOCAL_NETWORK


def test_empty_local_lists_still_refuse_loopback_and_metadata() -> None:
    for host, expected in [("127.1", C.LOOPBACK), ("0xa9fea9fe", C.METADATA)]:
        found = parse_host_address(host)
        assert found is not None
        assert classify(found, local_addresses=frozenset(), local_networks=()) is expected


def test_never_classes_are_exactly_this_machine_link_local_and_metadata() -> None:
    assert {
        C.LOOPBACK,
        C.UNSPECIFIED,
        C.METADATA,
        C.THIS_MACHINE,
        C.LOCAL_NETWORK,
        C.LINK_LOCAL,
    } == NEVER_CLASSES


@pytest.mark.parametrize("host", ["198.18.0.5", "::ffff:198.18.0.5", "2002:c612:5::"])
def test_fake_internet_is_special_unless_passed_as_unsafe_public(host: str) -> None:
    assert judge(host) is C.SPECIAL
    assert judge(host, FAKE_INTERNET) is C.PUBLIC


EVERYTHING: tuple[IPNetwork, ...] = (net("0.0.0.0/0"), net("::/0"))


@pytest.mark.parametrize(
    ("host", "expected"),
    [(p.values[0], p.values[1]) for p in CLASSIFIED if p.values[1] is not C.SPECIAL],
)
def test_unsafe_public_everything_only_opens_special(host: str, expected: AddressClass) -> None:
    assert judge(host, EVERYTHING) is expected


def test_unsafe_public_does_not_open_local_use_nat64() -> None:
    assert judge("64:ff9b:1::c612:5", FAKE_INTERNET) is C.SPECIAL


NAMES = [
    "example.com",
    "example.com.",
    "localhost",
    "xn--bcher-kva.example",
    "_dmarc.example.com",
    "1.2.3.4.example",
    "a1",
    "0x1g",
    "1e5",
    "0xg.example",
]


@pytest.mark.parametrize("host", NAMES)
def test_a_name_is_not_an_address(host: str) -> None:
    assert parse_host_address(host) is None


INVALID = [
    pytest.param("256.0.0.1", id="octet-over-255"),
    pytest.param("1.2.3.256", id="last-octet-over-255"),
    pytest.param("1.2.65536", id="three-part-last-over-16-bits"),
    pytest.param("4294967296", id="integer-over-32-bits"),
    pytest.param("0x100000000", id="hex-integer-over-32-bits"),
    pytest.param("1.2.3.4.5", id="five-numeric-parts"),
    pytest.param("08", id="octal-with-8"),
    pytest.param("1.2.3.09", id="octal-part-with-9"),
    pytest.param("1..2", id="empty-middle-part"),
    pytest.param("example.123", id="name-ending-in-a-number"),
    pytest.param("example.0x", id="name-ending-in-hex-prefix"),
    pytest.param("1_0.0.0.1", id="python-int-underscore"),
    pytest.param("", id="empty"),
    pytest.param(".", id="only-a-dot"),
    pytest.param("[127.0.0.1]", id="bracketed-ipv4"),
    pytest.param("[example.com]", id="bracketed-name"),
    pytest.param("[::1", id="unclosed-bracket"),
    pytest.param("::1]", id="unopened-bracket"),
    pytest.param("::ffff:127.1", id="short-ipv4-inside-ipv6"),
    pytest.param("::ffff:0177.0.0.1", id="octal-ipv4-inside-ipv6"),
    pytest.param("1::2::3", id="two-double-colons"),
    pytest.param("fe80::1%", id="empty-zone"),
    pytest.param("127.0.0.1:80", id="with-port"),
    pytest.param("localhost:80", id="name-with-port"),
    pytest.param("127.0.0.1 x", id="inet-aton-trailing-garbage"),
    pytest.param("127.0.0.1\n", id="trailing-newline"),
    pytest.param("127.0.0.1\x00.example.com", id="nul-byte"),
    pytest.param("\uff11\uff12\uff17.\uff10.\uff10.\uff11", id="full-width-digits"),
    pytest.param("exam ple.com", id="space-in-name"),
    pytest.param("evil.com@127.0.0.1", id="userinfo"),
    pytest.param("*.example.com", id="wildcard"),
    pytest.param("a" * 64 + ".com", id="label-over-63"),
    pytest.param("0x" + "0" * 300 + "1", id="over-length"),
]


@pytest.mark.parametrize("host", INVALID)
def test_an_invalid_host_raises_so_it_is_refused(host: str) -> None:
    with pytest.raises(ValueError, match="host"):
        parse_host_address(host)


def test_zone_is_dropped_from_the_parsed_address() -> None:
    found = parse_host_address("fe80::1%eth0")
    assert found == ip("fe80::1")
    assert isinstance(found, ipaddress.IPv6Address)
    assert found.scope_id is None


def test_zone_in_a_caller_built_address_does_not_hide_metadata() -> None:
    scoped = ipaddress.IPv6Address("fe80::a9fe:a9fe%eth0")
    assert effective_address(scoped) == ip("fe80::a9fe:a9fe")
    assert judge_address(scoped) is C.METADATA


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("::ffff:10.0.0.1", "10.0.0.1"),
        ("::ffff:0:10.0.0.1", "10.0.0.1"),
        ("::10.0.0.1", "10.0.0.1"),
        ("::2", "0.0.0.2"),
        ("64:ff9b::10.0.0.1", "10.0.0.1"),
        ("64:ff9b:1::10.0.0.1", "10.0.0.1"),
        ("2002:a00:1::", "10.0.0.1"),
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "192.0.2.45"),  # RFC 4380's example
        ("::1", None),
        ("::", None),
        ("fe80::1", None),
        ("2606:4700:4700::1111", None),
        ("64:ff9b:2::a00:1", None),
    ],
)
def test_embedded_ipv4(text: str, expected: str | None) -> None:
    found = embedded_ipv4(ipaddress.IPv6Address(text))
    assert found == (None if expected is None else ip(expected))


@pytest.mark.parametrize(
    ("network", "expected"),
    [
        ("10.0.0.0/8", True),
        ("10.1.2.0/24", True),
        ("172.16.0.0/12", True),
        ("192.168.1.0/24", True),
        ("192.168.1.5/32", True),
        ("fd00::/8", True),
        ("100.64.0.1/32", True),
        ("100.64.0.0/31", False),
        ("100.64.0.0/10", False),
        ("100.100.100.200/32", False),
        ("fd00:ec2::254/128", False),
        ("10.0.0.0/7", False),
        ("172.0.0.0/8", False),
        ("0.0.0.0/0", False),
        ("::/0", False),
        ("127.0.0.0/8", False),
        ("169.254.0.0/16", False),
        ("8.8.8.0/24", False),
        ("::ffff:10.0.0.0/104", False),
    ],
)
def test_is_lan_network(network: str, expected: bool) -> None:
    assert is_lan_network(net(network)) is expected


def test_cgnat_range_wider_than_one_address_is_not_lan() -> None:
    assert not is_lan_network(CGNAT_NETWORK)


@pytest.mark.parametrize("text", ["10.0.0.1", "::ffff:10.0.0.1", "64:ff9b::a00:1", "fd00::1"])
def test_is_private_lan_sees_through_ipv6_forms(text: str) -> None:
    assert is_private_lan(ip(text))


@pytest.mark.parametrize("text", ["100.64.0.1", "::ffff:100.64.0.1", "2002:6440:1::"])
def test_is_cgnat_sees_through_ipv6_forms(text: str) -> None:
    assert is_cgnat(ip(text))
    assert not is_private_lan(ip(text))


def test_constants() -> None:
    assert ip("fd00:ec2::254") in METADATA_ADDRESSES
    assert net("fc00::/7") in PRIVATE_LAN_NETWORKS
    assert sorted(addresses.__all__) == sorted(set(addresses.__all__))
    for name in addresses.__all__:
        assert hasattr(addresses, name), name


def ipv6_forms(a: ipaddress.IPv4Address) -> list[ipaddress.IPv6Address]:
    value = int(a)
    return [
        ipaddress.IPv6Address(0xFFFF << 32 | value),  # mapped
        ipaddress.IPv6Address(0xFFFF << 48 | value),  # translated
        ipaddress.IPv6Address(0x64FF9B << 96 | value),  # NAT64
        ipaddress.IPv6Address(0x2002 << 112 | value << 80 | 0x1234),  # 6to4
        ipaddress.IPv6Address(0x20010000 << 96 | (~value & 0xFFFFFFFF)),  # Teredo
        *([ipaddress.IPv6Address(value)] if value > 1 else []),  # compatible, not :: or ::1
    ]


@pytest.mark.parametrize("unsafe_public", [(), FAKE_INTERNET], ids=["plain", "fake-internet"])
@given(a=st.ip_addresses(v=4))
def test_every_ipv6_form_of_an_ipv4_is_judged_as_that_ipv4(
    unsafe_public: tuple[IPNetwork, ...], a: ipaddress.IPv4Address
) -> None:
    expected = judge_address(a, unsafe_public)
    for form in ipv6_forms(a):
        assert effective_address(form) == a
        assert judge_address(form, unsafe_public) is expected, form
        assert judge(f"[{form}]", unsafe_public) is expected, form


@given(a=st.ip_addresses(v=4))
def test_every_numeric_spelling_of_an_ipv4_parses_to_it(a: ipaddress.IPv4Address) -> None:
    value = int(a)
    octets = a.packed
    for spelling in [
        str(a),
        str(value),
        hex(value),
        f"0{value:o}",
        ".".join(f"0x{o:x}" for o in octets),
        ".".join(f"0{o:o}" for o in octets),
        f"{octets[0]}.{value & 0xFFFFFF}",
        f"{octets[0]}.{octets[1]}.{value & 0xFFFF}",
        f"{a}.",
    ]:
        assert parse_host_address(spelling) == a, spelling


@given(a=st.ip_addresses(v=6))
def test_every_ipv6_parses_to_itself(a: ipaddress.IPv6Address) -> None:
    assert parse_host_address(str(a)) == a
    assert parse_host_address(f"[{a.exploded}]") == a


@given(text=st.text(alphabet="0123456789abcdefxX.", max_size=24))
def test_what_inet_aton_reads_as_an_address_is_never_a_name(text: str) -> None:
    try:
        expected = ipaddress.IPv4Address(socket.inet_aton(text))
    except OSError:
        return
    assert parse_host_address(text) == expected


@given(text=st.text(max_size=40))
def test_any_text_is_an_address_a_name_or_a_value_error(text: str) -> None:
    try:
        found = parse_host_address(text)
    except ValueError:
        return
    if found is None:
        assert text.isascii()
        assert not text.rstrip(".").rsplit(".", 1)[-1].isdigit()
