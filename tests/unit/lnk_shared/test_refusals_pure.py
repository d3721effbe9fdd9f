"""The refusal rules that are pure functions, on resolved specs written by hand: fixed system
folders and paths this machine need not have, every rule a spec breaks listed (settings first),
"inside" on component boundaries, and what a grant holding the sandboxes' homes says to grant
instead.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from refusal_box import Box, check_refusal, resolved

from lnk_shared.errors import (
    CommandRefused,
    OutsideCodeRefused,
    RefusedError,
    SandboxHomeRefused,
    SettingsGrantRefused,
    SocketGrantRefused,
)
from lnk_shared.refusals import find_refusals, inside, judge

PURE_RULES = [
    pytest.param({"write": ["/usr/local/x"]}, {"read": ["/usr/local/x"]},
                 OutsideCodeRefused, "/usr is a system folder", id="write-usr-local"),
    pytest.param({"write": ["/usr/share/x"]}, {"write": ["/srv/data/out"]},
                 OutsideCodeRefused, "/usr is a system folder", id="write-usr"),
    pytest.param({"write": ["/etc/x"]}, {"write": ["/etcx/x"]},
                 OutsideCodeRefused, "/etc is a system folder", id="write-etc"),
    pytest.param({"write": ["/opt/x"]}, {"write": ["/optx"]},
                 OutsideCodeRefused, "/opt is a system folder", id="write-opt"),
    pytest.param({"write": ["/var/lib/x"]}, {"write": ["/var/libx"]},
                 OutsideCodeRefused, "/var/lib is a system folder", id="write-var-lib"),
    pytest.param({"write": ["/var"]}, {"read": ["/var/lib"]},
                 OutsideCodeRefused, "/var/cache is a system folder", id="write-holds-system"),
    pytest.param({"write": ["/boot/x"]}, {"write": ["/srv/boot"]},
                 OutsideCodeRefused, "/boot is a system folder", id="write-boot"),
    pytest.param({"write": ["/lib64/x"]}, {"write": ["/srv/lib64"]},
                 OutsideCodeRefused, "/lib64 is a system folder", id="write-lib64"),
    pytest.param({"write": ["/sbin"]}, {"write": ["/srv/sbin"]},
                 OutsideCodeRefused, "/sbin", id="write-sbin"),
    pytest.param({"write": ["/srv/p/.gitmodules"]}, {"write": ["/srv/p/gitmodules"]},
                 OutsideCodeRefused, ".gitmodules is a project file", id="write-gitmodules"),
    pytest.param({"write": ["/srv/p/.git/config"]}, {"write": ["/srv/p/.git/objects"]},
                 OutsideCodeRefused, ".git/config is a project file", id="write-git-config"),
    pytest.param({"write": ["/srv/p/.husky/pre-commit"]}, {"write": ["/srv/p/husky"]},
                 OutsideCodeRefused, ".husky is a project file", id="write-husky-inside"),
    pytest.param({"read": ["/run/x"]}, {"read": ["/runx"]},
                 SocketGrantRefused, "/run", id="read-inside-run"),
    pytest.param({"read": ["/"]}, {"read": ["/srv"]},
                 SocketGrantRefused, "/run", id="read-root-holds-run"),
    pytest.param({"write": ["/tmp/.X11-unix"]}, {"write": ["/srv/.X11-unix"]},
                 SocketGrantRefused, "/tmp/.X11-unix", id="write-x11-sockets"),
    pytest.param({"commands": ["/var/tmp/x"]}, {"commands": ["/var/tmpx/x"]},
                 CommandRefused, "/var/tmp is a shared scratch folder", id="command-var-tmp"),
    pytest.param({"commands": ["/dev/shm/x"]}, {"commands": ["/dev/shmx/x"]},
                 CommandRefused, "/dev/shm is a shared scratch folder", id="command-dev-shm"),
    pytest.param({"commands": ["/var"]}, {"commands": ["/usr"]},
                 CommandRefused, "/var/tmp is a shared scratch folder", id="command-holds-tmp"),
    pytest.param({"commands": ["/srv/proj/bin/x"], "write": ["/srv/proj"]},
                 {"commands": ["/srv/projx/x"], "write": ["/srv/proj"]},
                 CommandRefused, "the sandbox may write /srv/proj", id="command-in-write"),
    pytest.param({"commands": ["/srv/tools"], "write": ["/srv/tools/out"]},
                 {"commands": ["/srv/tools"], "write": ["/srv/toolsx"]},
                 CommandRefused, "the sandbox may write /srv/tools/out", id="command-holds-write"),
    pytest.param({"commands": ["/srv/proj/x"], "fds": [("/srv/proj", True)]},
                 {"commands": ["/srv/proj/x"], "fds": [("/srv/proj", False)]},
                 CommandRefused, "the sandbox may write /srv/proj", id="command-in-write-fd"),
    pytest.param({"write": ["/srv/data/out"], "fds": [("/etc", True)]},
                 {"write": ["/srv/data/out"], "fds": [("/etc", False)]},
                 OutsideCodeRefused, "/etc is a system folder", id="with-fd-write-etc"),
    pytest.param({"read": ["/home"]}, {"read": ["/home/someone"]},
                 SandboxHomeRefused, "it holds /home, where the sandbox's own home",
                 id="read-holds-sandbox-homes"),
    pytest.param({"write": ["/home"]}, {"write": ["/homework"]},
                 SandboxHomeRefused, "grant folders below /home instead",
                 id="write-holds-sandbox-homes"),
    pytest.param({"read": ["/srv/x"], "fds": [("/home", False)]},
                 {"read": ["/srv/x"], "fds": [("/srv", False)]},
                 SandboxHomeRefused, "/home", id="with-fd-holds-sandbox-homes"),
]  # fmt: skip


@pytest.mark.parametrize(("refused", "allowed", "kind", "why"), PURE_RULES)
def test_pure_rule_refuses_its_case(
    box: Box, refused: dict[str, Any], allowed: dict[str, Any], kind: type[RefusedError], why: str
) -> None:
    with pytest.raises(RefusedError) as caught:
        judge(resolved(**refused), box.ctx())
    error = caught.value
    first = (refused.get(k) for k in ("commands", "fds", "write", "read"))
    written = next(entries for entries in first if entries)[0]
    entry = written[0] if isinstance(written, tuple) else written
    check_refusal(error, kind, why, entry)


@pytest.mark.parametrize(("refused", "allowed", "kind", "why"), PURE_RULES)
def test_pure_rule_allows_its_neighbour(
    box: Box, refused: dict[str, Any], allowed: dict[str, Any], kind: type[RefusedError], why: str
) -> None:
    assert find_refusals(resolved(**allowed), box.ctx()) == []


def test_find_refusals_lists_every_rule_broken_settings_first(box: Box) -> None:
    spec = resolved(read=["/run"], write=["/etc/x", str(box.home / ".lnk")], commands=["/tmp/x"])
    kinds = [type(r) for r in find_refusals(spec, box.ctx())]
    assert kinds[0] is SocketGrantRefused  # reads are judged first, in the order given
    assert set(kinds) == {
        SocketGrantRefused, OutsideCodeRefused, SettingsGrantRefused, CommandRefused
    }  # fmt: skip
    with pytest.raises(SocketGrantRefused):
        judge(spec, box.ctx())


@pytest.mark.parametrize(
    ("path", "folder", "expected"),
    [
        ("/a/b", "/a", True),
        ("/a", "/a", True),
        ("/ab", "/a", False),
        ("/a", "/a/b", False),
        ("/anything", "/", True),
        ("/a/b", "/a/", True),
    ],
)
def test_inside_is_on_component_boundaries(path: str, folder: str, expected: bool) -> None:
    assert inside(path, folder) is expected


def test_a_grant_holding_the_sandbox_homes_names_the_owners_home_when_it_is_below(
    box: Box,
) -> None:
    """The refusal says what to grant instead: the owner's own home when it is under /home,
    nothing more when it is elsewhere (root's /root)."""
    spec = resolved(read=["/home"])
    for home, hint in (("/home/alice", ", such as your home /home/alice"), ("/root", "")):
        ctx = dataclasses.replace(box.ctx(), home=home)
        with pytest.raises(SandboxHomeRefused) as caught:
            judge(spec, ctx)
        assert caught.value.why.endswith(f"grant folders below /home instead{hint}")
