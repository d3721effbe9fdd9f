"""Which area each probe id is grouped under in the check's table."""

from __future__ import annotations

import pytest

from lnk_cli.check.areas import UNNAMED, area_of, in_order


@pytest.mark.parametrize(
    ("probe_id", "area"),
    [
        ("read.home", "read"),
        ("list.ssh", "read"),
        ("write.folder:/home/u/out", "write"),
        ("write.deep-dot:/w", "write"),
        ("link.write:/w", "write"),
        ("mode:setuid:/w", "write"),
        ("exec:loader-read:/srv", "exec"),
        ("kernel:bpf", "kernel"),
        ("privilege", "kernel"),
        ("server:127.0.0.1", "network"),
        ("server:[::1]:8080", "network"),
        ("port:11434", "network"),
        ("abstract-socket", "network"),
        ("proxy:machine:10.0.0.1", "proxy"),
        ("service:telegram:api.telegram.org", "services"),
        ("host:boot-id", "machine"),
        ("identity-3", "machine"),
        ("environ", "caller"),
        ("stdout:append-only", "caller"),
        ("swap:read", "judging"),
        ("limits:processes", "limits"),
        ("brand-new:thing", "brand-new"),  # a kind no table knows: its own area
        ("", UNNAMED),
        (":x", UNNAMED),
    ],
)
def test_each_kind_has_its_area(probe_id: str, area: str) -> None:
    assert area_of(probe_id) == area


def test_areas_come_in_the_order_of_their_first_probe() -> None:
    ids = ["read.home", "server:a", "read.hidden:~/.x", "kernel:bpf", "port:1"]
    assert in_order(ids) == ["read", "network", "kernel"]
