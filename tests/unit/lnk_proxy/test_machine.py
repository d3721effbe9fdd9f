"""This machine's view: every address of every interface is this machine's; the networks of
guests' bridges (by link kind or a known name) are never reached; veths, uplinks and VPNs only
contribute their own addresses."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest

from lnk_proxy.machine import machine_view_from_ip, read_machine_view

ip = ipaddress.ip_address
net = ipaddress.ip_network


def iface(
    name: str, *addresses: tuple[str, int], kind: str | None = None, family: str = "inet"
) -> dict[str, Any]:
    """An interface as `ip -json -details address show` prints it."""
    doc: dict[str, Any] = {
        "ifindex": 1,
        "ifname": name,
        "addr_info": [
            {
                "family": "inet6" if ":" in local else family,
                "local": local,
                "prefixlen": prefix,
            }
            for local, prefix in addresses
        ],
    }
    if kind is not None:
        doc["linkinfo"] = {"info_kind": kind}
    return doc


MACHINE = [
    iface("lo", ("127.0.0.1", 8), ("::1", 128)),
    iface("eth0", ("192.168.1.10", 24), ("2001:db8:1::10", 64), ("fe80::1", 64)),
    iface("docker0", ("172.17.0.1", 16), kind="bridge"),
    iface("br-5f3a9c", ("172.18.0.1", 16), kind="bridge"),
    iface("virbr0", ("192.168.122.1", 24), kind="bridge"),
    iface("lxdbr0", ("10.20.30.1", 24), ("fd42:1::1", 64)),  # name only, no linkinfo
    iface("mybridge", ("10.99.0.1", 24), kind="bridge"),  # any bridge, whatever its name
    iface("lnkn1a2b3cpr", ("198.18.7.1", 24), kind="veth"),  # the test internet's veth
    iface("wg0", ("10.8.0.2", 24), kind="wireguard"),
    iface("vethabc", kind="veth"),  # a container's veth, no address
]


def test_every_address_of_every_interface_is_this_machine() -> None:
    view = machine_view_from_ip(MACHINE)
    expected = {
        "127.0.0.1",
        "::1",
        "192.168.1.10",
        "2001:db8:1::10",
        "fe80::1",
        "172.17.0.1",
        "172.18.0.1",
        "192.168.122.1",
        "10.20.30.1",
        "fd42:1::1",
        "10.99.0.1",
        "198.18.7.1",
        "10.8.0.2",
    }
    assert view.local_addresses == frozenset(ip(a) for a in expected)


def test_guest_bridges_networks_are_local_networks() -> None:
    view = machine_view_from_ip(MACHINE)
    assert set(view.local_networks) == {
        net("172.17.0.0/16"),
        net("172.18.0.0/16"),
        net("192.168.122.0/24"),
        net("10.20.30.0/24"),
        net("fd42:1::/64"),
        net("10.99.0.0/24"),
    }


@pytest.mark.parametrize(
    "name", ["eth0", "lnkn1a2b3cpr", "vethabc", "wg0", "tailscale0", "enp3s0", "lo"]
)
def test_uplinks_veths_and_vpns_are_not_guest_bridges(name: str) -> None:
    view = machine_view_from_ip([iface(name, ("10.1.2.3", 24), kind="veth")])
    assert view.local_networks == ()
    assert view.local_addresses == frozenset({ip("10.1.2.3")})


@pytest.mark.parametrize(
    "name", ["docker0", "br-0a1b2c", "podman0", "cni0", "virbr1", "lxcbr0", "incusbr0"]
)
def test_known_guest_names_are_bridges_even_without_linkinfo(name: str) -> None:
    view = machine_view_from_ip([iface(name, ("10.1.2.1", 24))])
    assert view.local_networks == (net("10.1.2.0/24"),)


def test_a_scoped_address_is_read_without_its_zone() -> None:
    view = machine_view_from_ip([iface("eth0", ("fe80::1%eth0", 64))])
    assert view.local_addresses == frozenset({ip("fe80::1")})


def test_an_empty_address_entry_is_skipped() -> None:
    doc = iface("eth0", ("192.0.2.5", 24))
    doc["addr_info"].append({})
    assert machine_view_from_ip([doc]).local_addresses == frozenset({ip("192.0.2.5")})


def test_unsafe_public_networks_are_carried() -> None:
    view = machine_view_from_ip([], [net("198.18.0.0/15")])
    assert view.unsafe_public_networks == (net("198.18.0.0/15"),)


@pytest.mark.parametrize(
    "document",
    [
        {"ifname": "eth0"},
        ["eth0"],
        [{"addr_info": []}],
        [iface("eth0", ("not an address", 24))],
        [{"ifname": "eth0", "addr_info": [{"local": "192.0.2.1"}]}],
    ],
)
def test_a_malformed_document_is_an_error(document: Any) -> None:
    with pytest.raises(ValueError):
        machine_view_from_ip(document)


def test_this_machine_is_read_with_ip() -> None:
    view = read_machine_view()
    assert ip("127.0.0.1") in view.local_addresses
