"""The Ansible role's systemd units let each service open the socket families its code opens:
a family the unit's `RestrictAddressFamilies=` leaves out fails with EAFNOSUPPORT on a deployed
box only (the tests' boxes run without systemd), and the proxy refuses to start without its
route netlink socket."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = ROOT / "deploy" / "ansible" / "roles" / "lnk_box" / "templates"
SOURCES = {
    "lnk-proxy.service.j2": ROOT / "services" / "proxy" / "lnk_proxy",
}
FAMILY = re.compile(r"\bsocket\.(AF_[A-Z0-9]+)\b")
NOT_A_SOCKET = {"AF_UNSPEC"}  # getaddrinfo's "any family", never a socket's


def _allowed(template: Path) -> set[str]:
    lines = [
        line
        for line in template.read_text().splitlines()
        if line.startswith("RestrictAddressFamilies=")
    ]
    assert len(lines) == 1, f"{template.name}: one RestrictAddressFamilies= line"
    return set(lines[0].split("=", 1)[1].split())


def _opened(package: Path) -> set[str]:
    found = {m for path in package.rglob("*.py") for m in FAMILY.findall(path.read_text())}
    return found - NOT_A_SOCKET


@pytest.mark.parametrize("template", sorted(SOURCES))
def test_a_unit_allows_every_socket_family_its_service_opens(template: str) -> None:
    opened = _opened(SOURCES[template])
    assert opened, "the scan found the service's sockets"
    assert opened <= _allowed(TEMPLATES / template)


def test_the_proxy_unit_allows_route_netlink() -> None:
    assert "AF_NETLINK" in _allowed(TEMPLATES / "lnk-proxy.service.j2")
