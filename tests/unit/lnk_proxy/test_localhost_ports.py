"""`[localhost] ports`: a listed port of this machine, asked for as localhost, 127.0.0.1 or ::1,
is forwarded raw; any other port, and any other spelling of this machine, is refused."""

from __future__ import annotations

import ipaddress

import pytest

from lnk_proxy.admin import parse_grants
from lnk_proxy.policy import ProxyGrants, Refused, Rule, judge_localhost, judge_target

GRANTS = ProxyGrants(localhost_ports=frozenset({11434}))


@pytest.mark.parametrize(
    ("host", "address"),
    [
        ("localhost", "127.0.0.1"),
        ("LOCALHOST.", "127.0.0.1"),
        ("127.0.0.1", "127.0.0.1"),
        ("::1", "::1"),
        ("[::1]", "::1"),
    ],
)
def test_a_listed_port_is_forwarded_to_the_loopback(host: str, address: str) -> None:
    allowed = judge_localhost(GRANTS, host, 11434)
    assert allowed is not None
    assert allowed.address == ipaddress.ip_address(address)
    assert allowed.rule is Rule.ALLOWED_LOCALHOST_PORT


@pytest.mark.parametrize("port", [11435, 40781, 22, 3128])
def test_an_unlisted_port_is_not_forwarded(port: int) -> None:
    assert judge_localhost(GRANTS, "localhost", port) is None
    assert isinstance(judge_target(GRANTS, "localhost", port), Refused)


@pytest.mark.parametrize(
    "host",
    [
        "127.1",
        "0x7f000001",
        "2130706433",
        "::ffff:127.0.0.1",
        "127.0.0.2",
        "0.0.0.0",
        "localhost.localdomain",
        "a.localhost",
    ],
)
def test_other_spellings_of_this_machine_are_not_forwarded(host: str) -> None:
    assert judge_localhost(GRANTS, host, 11434) is None
    assert isinstance(judge_target(GRANTS, host, 11434), Refused)


def test_no_ports_means_nothing_is_forwarded() -> None:
    assert judge_localhost(ProxyGrants(), "localhost", 11434) is None


BASE = {"internet_any": False, "internet": [], "lan_any": False, "lan": []}


def test_admin_reads_localhost_ports() -> None:
    assert parse_grants({**BASE, "localhost_ports": [11434]}).localhost_ports == {11434}
    assert parse_grants(BASE).localhost_ports == frozenset()


@pytest.mark.parametrize("ports", [[0], [65536], ["80"], [True], "80", [1.5]])
def test_admin_refuses_bad_localhost_ports(ports: object) -> None:
    with pytest.raises(ValueError, match="localhost_ports"):
        parse_grants({**BASE, "localhost_ports": ports})
