"""/etc/hosts answers on the loop: nsswitch's order as a table, the hosts grammar, what is left
to getaddrinfo, edits seen at the next lookup; and, with real glibc, each answer given here
against getaddrinfo's own for the same files (bound over /etc in a private mount namespace)."""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lnk_proxy.hosts_file import MAX_BYTES, FilesOrder, HostsFile, files_order, parse_hosts

ip = ipaddress.ip_address


@pytest.mark.parametrize(
    ("line", "order"),
    [
        ("hosts: files", FilesOrder.ONLY),
        ("hosts:\tfiles   # the bench's", FilesOrder.ONLY),
        ("hosts: files dns", FilesOrder.FIRST),
        ("hosts:          files mdns4_minimal [NOTFOUND=return] dns myhostname", FilesOrder.FIRST),
        ("hosts: dns files", FilesOrder.NOT_FIRST),
        ("hosts: files [SUCCESS=continue] dns", FilesOrder.NOT_FIRST),
        ("hosts: files [NOTFOUND=return]", FilesOrder.NOT_FIRST),
        ("hosts: resolve [!UNAVAIL=return] files", FilesOrder.NOT_FIRST),
        ("hosts:", FilesOrder.NOT_FIRST),
        ("passwd: files", FilesOrder.NOT_FIRST),  # no hosts line: glibc asks DNS first
        ("# hosts: files", FilesOrder.NOT_FIRST),
        ("hosts: files\nhosts: dns", FilesOrder.NOT_FIRST),  # two lines: not ours to pick
        ("hostsx: files", FilesOrder.NOT_FIRST),
    ],
)
def test_where_files_stands_in_nsswitch(line: str, order: FilesOrder) -> None:
    assert files_order(f"passwd: files\n{line}\ngroup: files\n") is order


def test_hosts_lines_are_read_as_glibcs_files_source_gathers_them() -> None:
    names = parse_hosts(
        textwrap.dedent("""\
        # a comment line
        127.0.0.1   localhost
        ::1         localhost ip6-localhost  # both families for one name
        198.51.100.7 www.Example.test www  alias
        198.51.100.7 www.example.test
        198.51.100.8 alias
        fe80::1%eth0 scoped.test
        127.1        short.test
        garbage
        """)
    )
    assert names["localhost"] == (ip("127.0.0.1"), ip("::1"))
    assert names["ip6-localhost"] == (ip("::1"),)
    assert names["www.example.test"] == (ip("198.51.100.7"),)  # case folded, deduplicated
    assert names["alias"] == (ip("198.51.100.7"), ip("198.51.100.8"))
    assert names["scoped.test"] == ()  # read differently from glibc: left to it
    assert names["short.test"] == ()
    assert "garbage" not in names


def files(tmp_path: Path, hosts: str, nsswitch: str) -> HostsFile:
    (tmp_path / "hosts").write_text(hosts)
    (tmp_path / "nsswitch.conf").write_text(nsswitch)
    return HostsFile(tmp_path / "hosts", tmp_path / "nsswitch.conf")


HOSTS = "127.0.0.1 localhost\n::1 localhost\n198.51.100.7 www.test\nfe80::1%lo odd.test\n"


def test_with_files_alone_a_name_it_does_not_name_has_no_address(tmp_path: Path) -> None:
    hosts = files(tmp_path, HOSTS, "hosts: files\n")
    assert hosts.answer("www.test") == (ip("198.51.100.7"),)
    assert hosts.answer("nx-1.flood.test-public.example") == ()
    assert hosts.answer("localhost") is None  # two addresses: getaddrinfo orders them
    assert hosts.answer("odd.test") is None
    assert hosts.answer("127.1") is None  # inet_aton's: never a hosts line
    assert hosts.answer("0x7f.1") is None


def test_with_sources_after_files_a_name_it_does_not_name_goes_on(tmp_path: Path) -> None:
    hosts = files(tmp_path, HOSTS, "hosts: files dns\n")
    assert hosts.answer("www.test") == (ip("198.51.100.7"),)
    assert hosts.answer("elsewhere.example") is None


@pytest.mark.parametrize("nsswitch", ["hosts: dns files\n", "", "hosts: files [SUCCESS=continue]"])
def test_files_not_first_answers_nothing_here(tmp_path: Path, nsswitch: str) -> None:
    hosts = files(tmp_path, HOSTS, nsswitch)
    assert hosts.answer("www.test") is None
    assert hosts.answer("elsewhere.example") is None


def test_missing_large_or_unreadable_files_answer_nothing_here(tmp_path: Path) -> None:
    assert HostsFile(tmp_path / "none", tmp_path / "none.conf").answer("www.test") is None
    hosts = files(tmp_path, "198.51.100.7 www.test\n" * (MAX_BYTES // 20), "hosts: files\n")
    assert hosts.answer("www.test") is None
    assert hosts.answer("elsewhere.example") is None  # not "no address": the file went unread
    missing = HostsFile(tmp_path / "gone", tmp_path / "nsswitch.conf")
    assert missing.answer("elsewhere.example") is None


def test_an_edit_of_either_file_is_seen_at_the_next_lookup(tmp_path: Path) -> None:
    hosts = files(tmp_path, "198.51.100.7 www.test\n", "hosts: files\n")
    assert hosts.answer("www.test") == (ip("198.51.100.7"),)
    (tmp_path / "hosts").write_text("198.51.100.99 www.test\n198.51.100.9 new.test\n")
    assert hosts.answer("www.test") == (ip("198.51.100.99"),)
    assert hosts.answer("new.test") == (ip("198.51.100.9"),)
    (tmp_path / "nsswitch.conf").write_text("hosts: files dns\n")
    assert hosts.answer("elsewhere.example") is None
    (tmp_path / "hosts").unlink()
    assert hosts.answer("www.test") is None


# -- against glibc ---------------------------------------------------------------------------

GLIBC_HOSTS = textwrap.dedent("""\
    127.0.0.1 localhost
    ::1 localhost ip6-localhost
    198.51.100.7 www.test WWW-ALIAS.test
    198.51.100.8 two.test
    2001:db8::8 two.test
    2001:db8::9 six.test
    198.51.100.10 dup.test
    198.51.100.10 dup.test
    fe80::1%lo scoped.test
    127.1 short.test
    ::ffff:198.51.100.11 mapped.test
    """)
NAMES = (
    "localhost", "ip6-localhost", "www.test", "www-alias.test", "two.test", "six.test",
    "dup.test", "scoped.test", "short.test", "mapped.test", "nx.test", "nx-2.flood.example",
)  # fmt: skip
ASK = """
import json, socket, sys
out = {}
for name in sys.argv[1:]:
    try:
        infos = socket.getaddrinfo(name, None, family=socket.AF_UNSPEC, type=socket.SOCK_STREAM,
                                   proto=socket.IPPROTO_TCP)
        out[name] = list(dict.fromkeys(i[4][0] for i in infos))
    except socket.gaierror:
        out[name] = []
print(json.dumps(out))
"""


def glibc_answers(tmp_path: Path, nsswitch: str) -> dict[str, list[str]]:
    """getaddrinfo's answers in a private mount namespace whose /etc/hosts and nsswitch.conf
    are `GLIBC_HOSTS` and `nsswitch` (no DNS server: resolv.conf names a closed port)."""
    for name, text in (
        ("hosts", GLIBC_HOSTS),
        ("nsswitch.conf", nsswitch),
        ("resolv.conf", "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n"),
    ):
        (tmp_path / name).write_text(text)
    binds = " && ".join(
        f"mount --bind {tmp_path / name} /etc/{name}"
        for name in ("hosts", "nsswitch.conf", "resolv.conf")
    )
    script = f'{binds} && exec "$0" -c "$1" "$@"'
    unshare = shutil.which("unshare")
    assert unshare is not None
    done = subprocess.run(
        [unshare, "--mount", "--propagation", "private", "sh", "-c", script, sys.executable, ASK,
         *NAMES],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    answers: dict[str, list[str]] = json.loads(done.stdout)
    return answers


@pytest.mark.needs_root
@pytest.mark.skipif(os.uname().sysname != "Linux", reason="glibc and mount namespaces")
@pytest.mark.parametrize("nsswitch", ["hosts: files\n", "hosts: files dns\n"])
def test_every_answer_given_here_is_getaddrinfos_own(tmp_path: Path, nsswitch: str) -> None:
    glibc = glibc_answers(tmp_path, nsswitch)
    hosts = HostsFile(tmp_path / "hosts", tmp_path / "nsswitch.conf")
    settled = {}
    for name in NAMES:
        answer = hosts.answer(name)
        if answer is not None:
            settled[name] = answer
            assert list(answer) == [ip(address) for address in glibc[name]], name
    # what it settles: the single-address names, and (files alone) the unnamed ones
    assert {"www.test", "www-alias.test", "six.test", "dup.test", "mapped.test"} <= set(settled)
    assert ("nx.test" in settled) == (nsswitch == "hosts: files\n")
