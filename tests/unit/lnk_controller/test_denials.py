"""lnk_controller.denial_records, denial_hints and denials.Summary: Landlock's audit records
(captured from this 6.18 kernel, ABI 7) read into what was denied, said with the grant that
allows it, never a grant the box refuses; a hostile path is decoded and shown escaped; a
sandbox's record stays bounded however many denials it makes."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from lnk_controller import denials
from lnk_controller.denial_hints import Refused, explain, rules_of
from lnk_controller.denial_records import (
    AUDIT_LANDLOCK_ACCESS,
    AUDIT_LANDLOCK_DOMAIN,
    MAX_RECORD_CHARS,
    Access,
    Domain,
    parse,
)
from lnk_shared.discovery import context_for
from lnk_shared.paths import BoxPaths

# Real records, as the kernel sent them to the multicast group.
EXEC = (
    "audit(1796139444.380:64): domain=109d708b4 blockers=fs.execute,fs.read_file "
    'path="/usr/bin/dash" dev="vda" ino=260180'
)
ALLOCATED = (
    "audit(1796139444.380:64): domain=109d708b4 status=allocated mode=enforcing pid=27961 "
    'uid=2000000007 exe="/root/.pyenv/versions/3.11.7/bin/python3.11" comm="python3"'
)
DEALLOCATED = "audit(1796139444.648:67): domain=109d708b4 status=deallocated denials=3"
MAKE_REG = (
    'audit(1796139514.380:100): domain=109d709f0 blockers=fs.make_reg path="/tmp/h19d" '
    'dev="vda" ino=2277629'
)
CONNECT = (
    "audit(1796139514.392:105): domain=109d709f0 blockers=net.connect_tcp daddr=10.0.0.5 dest=443"
)
CONNECT6 = "audit(1796139514.392:106): domain=109d709f0 blockers=net.connect_tcp daddr=::1 dest=22"
WRITE = (
    'audit(1796139514.392:107): domain=109d709f0 blockers=fs.write_file path="/etc/hostname" '
    'dev="vda" ino=612'
)
IOCTL = (
    'audit(1796140032.876:614): domain=109d710ca blockers=fs.ioctl_dev path="/dev/null" '
    'dev="devtmpfs" ino=3 ioctlcmd=0x5401'
)
# /tmp/h19d/ev ESC [31m U+202E x/f: the kernel writes a name with controls as hex.
HOSTILE = (
    "audit(1796139521.308:111): domain=109d70a01 blockers=fs.write_file "
    'path=2F746D702F683139642F65761B5B33316DE280AE782F66 dev="vda" ino=2277897'
)


@pytest.mark.parametrize(
    ("kind", "text", "expected"),
    [
        (
            AUDIT_LANDLOCK_ACCESS,
            EXEC,
            Access(64, "109d708b4", ("fs.execute", "fs.read_file"), path="/usr/bin/dash"),
        ),
        (AUDIT_LANDLOCK_DOMAIN, ALLOCATED, Domain(64, "109d708b4", "allocated", 2000000007)),
        (AUDIT_LANDLOCK_DOMAIN, DEALLOCATED, Domain(67, "109d708b4", "deallocated", None, 3)),
        (AUDIT_LANDLOCK_ACCESS, MAKE_REG, Access(100, "109d709f0", ("fs.make_reg",), "/tmp/h19d")),
        (
            AUDIT_LANDLOCK_ACCESS,
            IOCTL,
            Access(614, "109d710ca", ("fs.ioctl_dev",), path="/dev/null", ioctl=0x5401),
        ),
        (
            AUDIT_LANDLOCK_ACCESS,
            CONNECT,
            Access(105, "109d709f0", ("net.connect_tcp",), address="10.0.0.5", port=443),
        ),
        (
            AUDIT_LANDLOCK_ACCESS,
            CONNECT6,
            Access(106, "109d709f0", ("net.connect_tcp",), address="::1", port=22),
        ),
        (
            AUDIT_LANDLOCK_ACCESS,
            HOSTILE,
            Access(111, "109d70a01", ("fs.write_file",), path="/tmp/h19d/ev\x1b[31m\u202ex/f"),
        ),
        # Not the kernel's: another type, no header, a bad domain, no blockers, too long.
        (1300, EXEC, None),
        (AUDIT_LANDLOCK_ACCESS, EXEC.split(": ", 1)[1], None),
        (AUDIT_LANDLOCK_ACCESS, EXEC.replace("109d708b4", "zz; rm"), None),
        (AUDIT_LANDLOCK_ACCESS, EXEC.replace("blockers=fs.execute,fs.read_file", ""), None),
        (AUDIT_LANDLOCK_ACCESS, EXEC + " x" * MAX_RECORD_CHARS, None),
    ],
)
def test_records_are_read_as_the_kernel_writes_them(
    kind: int, text: str, expected: Access | Domain | None
) -> None:
    assert parse(kind, text) == expected


HOME = "/home/alice"


@pytest.fixture
def box_rules(tmp_path: Path) -> Refused:
    """The box's own rules for an owner whose home is HOME (nothing of it need exist)."""
    box = BoxPaths(
        config_dir=tmp_path / "etc", state_dir=tmp_path / "state", run_dir=tmp_path / "run"
    )
    ctx = context_for(os.getuid(), env={"PATH": "/usr/bin:/bin"}, box=box, home=HOME)
    return rules_of(ctx)


@pytest.mark.parametrize(
    ("access", "line"),
    [
        (
            Access(1, "a", ("fs.execute", "fs.read_file"), path="/usr/bin/echo"),
            "run /usr/bin/echo (grant it with --command echo)",
        ),
        (
            Access(1, "a", ("fs.execute",), path="/home/alice/bin/tool"),
            "run ~/bin/tool (grant it with --command ~/bin/tool)",
        ),
        (
            Access(1, "a", ("fs.write_file",), path="/home/alice/x/y"),
            "write ~/x/y (grant it with --write ~/x)",
        ),
        (
            Access(1, "a", ("fs.make_reg",), path="/home/alice/x"),
            "write ~/x (grant it with --write ~/x)",
        ),
        (
            Access(1, "a", ("fs.read_file",), path="/home/alice/notes.txt"),
            "read ~/notes.txt (grant it with --read ~/notes.txt)",
        ),
        (
            Access(1, "a", ("net.connect_tcp",), address="127.0.0.1", port=8080),
            "connect 127.0.0.1:8080 (grant this machine's port with --port 8080)",
        ),
        # A grant the box refuses anyway is said to be refused by rule, not suggested.
        (
            Access(1, "a", ("fs.write_file",), path="/etc/hostname"),
            "write /etc/hostname (refused [code-runs-outside]: /etc is a system folder)",
        ),
        (
            Access(1, "a", ("fs.make_reg",), path="/home/alice/.config"),
            "write ~/.config (refused [code-runs-outside]: ~/.config is a home dot "
            "folder; it runs outside)",
        ),
        (
            Access(1, "a", ("fs.read_file",), path="/home/alice/.lnk/keys"),
            "read ~/.lnk/keys (refused [box-settings]: it opens the box's settings "
            "(~/.lnk), closed to every sandbox)",
        ),
        (
            Access(1, "a", ("fs.read_dir",), path="/"),
            "read / (refused [other-programs-sockets]: it opens /run, where other programs keep "
            "their sockets)",
        ),
    ],
)
def test_each_denial_names_the_grant_that_allows_it(
    access: Access, line: str, box_rules: Refused
) -> None:
    assert explain(access, HOME, box_rules) == line


def test_a_connection_out_names_the_proxy_and_the_host_flag() -> None:
    line = explain(Access(1, "a", ("net.connect_tcp",), address="10.0.0.5", port=443), HOME)
    assert line.startswith("connect 10.0.0.5:443 (") and "--internet-host NAME:443" in line


def test_a_hostile_path_is_shown_escaped() -> None:
    parsed = parse(AUDIT_LANDLOCK_ACCESS, HOSTILE)
    assert isinstance(parsed, Access)
    summary = denials.Summary()
    summary.add(parsed)
    lines = summary.lines(HOME, lambda kind, path: None)
    (line,) = lines
    assert "\x1b" not in line and "\u202e" not in line
    assert "ev\\x1b[31m\\u202ex/f" in line
    said = summary.said("sbx1", lines)
    assert said is not None and said.isprintable()


def test_a_flood_keeps_a_count_and_a_few_distinct_examples() -> None:
    summary = denials.Summary()
    for n in range(100_000):
        summary.add(Access(n, "a", ("fs.read_file",), path=f"/home/alice/f{n}"))
    assert summary.count == 100_000
    assert len(summary.examples) == denials.MAX_EXAMPLES
    said = summary.said("sbx1", summary.lines(HOME, lambda kind, path: None))
    assert said is not None and said.startswith("denied: read ~/f0 (grant it with --read ~/f0)")
    assert said.endswith(f"; {100_000 - denials.SUMMARY_LINES} more (lnk sandbox show sbx1)")


def test_the_same_denial_twice_is_one_example() -> None:
    summary = denials.Summary()
    for _ in range(3):
        summary.add(Access(1, "a", ("fs.execute",), path="/usr/bin/echo"))
    assert summary.count == 3 and len(summary.examples) == 1
    assert summary.said("s", summary.lines(HOME, lambda kind, path: None)) == (
        "denied: run /usr/bin/echo (grant it with --command echo); 2 more (lnk sandbox show s)"
    )


def _feed(reader: denials.DenialReader, kind: int, text: str) -> None:
    """One record as the socket gives it, handled as the reader's drain does (under its lock)."""
    body = text.encode()
    with reader._lock:
        reader._record(struct.pack("=IHHII", 16 + len(body), kind, 0, 0, 0) + body)


def test_records_reach_the_sandbox_whose_uid_made_the_domain() -> None:
    """The first denial comes before its domain's record: it waits, then counts; another
    user's domain (not a sandbox of this box) is not counted anywhere."""
    reader = denials.DenialReader()
    reader.started("sbx1", 2000000007)
    _feed(reader, AUDIT_LANDLOCK_ACCESS, EXEC)
    _feed(reader, AUDIT_LANDLOCK_DOMAIN, ALLOCATED)
    _feed(reader, AUDIT_LANDLOCK_ACCESS, EXEC.replace(":64)", ":65)"))
    other = ALLOCATED.replace("109d708b4", "abc").replace("uid=2000000007", "uid=1000")
    _feed(reader, AUDIT_LANDLOCK_ACCESS, EXEC.replace("109d708b4", "abc"))
    _feed(reader, AUDIT_LANDLOCK_DOMAIN, other)
    held = reader._by_uid[2000000007].summary
    assert held.count == 2
    assert held.lines(HOME, lambda kind, path: None) == [
        "run /usr/bin/dash (grant it with --command dash)"
    ]


def test_a_terminal_probe_is_counted_but_never_an_example() -> None:
    """`ls >/dev/null` asks whether /dev/null is a terminal (TCGETS): denied, and harmless."""
    parsed = parse(AUDIT_LANDLOCK_ACCESS, IOCTL)
    assert isinstance(parsed, Access)
    summary = denials.Summary()
    summary.add(parsed)
    assert summary.count == 1 and summary.examples == []
    assert summary.said("s", summary.lines(HOME, lambda kind, path: None)) is None


def test_what_a_program_needed_is_said_before_what_it_probed() -> None:
    """A device ioctl comes first in time, the missing write first in the summary."""
    summary = denials.Summary()
    summary.add(Access(1, "a", ("fs.ioctl_dev",), path="/dev/sda", ioctl=0x1260))
    summary.add(Access(2, "a", ("fs.make_reg",), path="/home/alice/x"))
    lines = summary.lines(HOME, lambda kind, path: None)
    assert lines[0] == "write ~/x (grant it with --write ~/x)"


def test_a_domains_end_gives_the_kernels_own_count() -> None:
    """The kernel drops records past its backlog but counts every denial: the `deallocated`
    record's count is the sandbox's, and the domain is no longer awaited."""
    reader = denials.DenialReader()
    reader.started("sbx1", 2000000007)
    _feed(reader, AUDIT_LANDLOCK_ACCESS, EXEC)
    _feed(reader, AUDIT_LANDLOCK_DOMAIN, ALLOCATED)
    held = reader._by_uid[2000000007]
    assert held.open_domains == {"109d708b4"}
    _feed(reader, AUDIT_LANDLOCK_DOMAIN, DEALLOCATED.replace("=3", "=100000"))
    assert held.open_domains == set()
    assert held.summary.count == 100000 and len(held.summary.examples) == 1
