"""The bait: made in every place the seed names, logged when reached, and gone afterwards, even
when setting it up fails halfway or a probe left things behind."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from lnk_cli.check.bait import BAIT_MODE, PREFIX, VAR_TMP, Bait, locally_routed


def tree(root: Path) -> set[str]:
    found = set()
    for folder, dirs, files in os.walk(root):
        found.update(os.path.join(folder, n) for n in dirs + files)
    return found


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    (home / ".config").mkdir(parents=True)
    (home / ".cache").mkdir()
    (home / "plain").mkdir()
    (home / ".dotfile").write_text("not a folder\n")
    return home


def test_bait_is_everywhere_the_seed_names_with_a_fresh_secret_each(home: Path) -> None:
    with Bait.set_up(str(home)) as bait:
        places = {f.id: os.path.dirname(f.path) for f in bait.files}
        assert places == {
            "read.home": str(home),
            "read.settings": str(home / ".lnk"),
            "read.var-tmp": VAR_TMP,
            "read.agents:Link/Agents": str(home / "Link/Agents"),
            "read.agents:Link/History": str(home / "Link/History"),
            "read.hidden:~/.ssh": str(home / ".ssh"),
            "read.hidden:~/.config": str(home / ".config"),
            "read.hidden:~/.cache": str(home / ".cache"),
        }
        secrets = [f.secret for f in bait.files] + [bait.outside_secret]
        assert len(set(secrets)) == len(secrets)
        for f in bait.files:
            assert Path(f.path).read_text() == f"lnk check bait {f.secret}\n"
            assert os.stat(f.path).st_mode & 0o777 == BAIT_MODE
            assert os.path.basename(f.path).startswith(PREFIX)
        assert bait.ssh_names == sorted(os.listdir(home / ".ssh"))
        assert bait.outside is not None
        with open(f"/proc/{bait.outside.pid}/environ", "rb") as env:
            assert f"LNK_CHECK_BAIT={bait.outside_secret}".encode() in env.read()


def test_removing_leaves_the_home_as_it_was_and_ends_the_outside_program(home: Path) -> None:
    before = tree(home)
    with Bait.set_up(str(home)) as bait:
        assert bait.outside is not None and bait.server is not None
        pid, port = bait.outside.pid, bait.server.port
        var_tmp = next(f.path for f in bait.files if f.id == "read.var-tmp")
        made = home / "project-out-file"
        made.write_text("a probe's")
        bait.leftovers.append(str(made))
    assert tree(home) == before
    assert not os.path.exists(var_tmp)
    assert not os.path.exists(f"/proc/{pid}") or "Z" in Path(f"/proc/{pid}/stat").read_text()
    with socket.socket() as s, pytest.raises(ConnectionRefusedError):
        s.connect(("127.0.0.1", port))
    assert bait.remove() == []  # twice is fine


def test_a_failure_halfway_removes_what_was_made(home: Path) -> None:
    before = tree(home)
    (home / ".locked").mkdir(mode=0o500)
    os.chmod(home / ".locked", 0o500)
    bait = Bait(home=str(home))
    try:
        if os.geteuid() == 0:  # root writes anywhere: make a later step fail instead
            os.chmod(home, 0o500)
            (home / ".ssh").mkdir()
            os.chmod(home, 0o700)
            os.symlink("/nonexistent", home / ".lnk")  # a dangling link where ~/.lnk goes
        with pytest.raises(OSError):
            bait.make()
    finally:
        assert bait.remove() == []
    assert tree(home) - {str(home / ".locked"), str(home / ".ssh"), str(home / ".lnk")} == before


def test_the_server_logs_each_connection_and_the_line_it_sent(home: Path) -> None:
    with Bait.set_up(str(home)) as bait:
        server = bait.server
        assert server is not None
        with socket.create_connection(("127.0.0.1", server.port)) as s:
            s.sendall(b"lnk-check server:127.0.0.1\n")
        with socket.create_connection(("127.0.0.1", server.port)):
            pass
        with socket.socket(socket.AF_UNIX) as u:
            u.connect("\0" + server.abstract_name)
        log = server.finish()
    assert sorted((a.label, a.line) for a in log) == [
        ("127.0.0.1", ""),
        ("127.0.0.1", "lnk-check server:127.0.0.1"),
        ("abstract", ""),
    ]


def test_the_servers_port_avoids_the_specs_ports(home: Path) -> None:
    avoid = frozenset(range(20000, 31999))  # all but one of the range it picks from
    with Bait.set_up(str(home), avoid_ports=avoid) as bait:
        assert bait.server is not None and bait.server.port == 31999


def test_locally_routed_takes_one_address_per_local_prefix_that_no_interface_holds() -> None:
    routes = [  # `ip -j route show table local type local`, as captured on Linux 6.18
        {"type": "local", "dst": "10.61.0.0/24", "dev": "lo", "prefsrc": "10.61.0.1"},
        {"type": "local", "dst": "10.61.0.1", "dev": "lo"},
        {"type": "local", "dst": "10.61.0.2", "dev": "lo"},  # a second address: skipped
        {"type": "local", "dst": "10.62.0.0/24", "dev": "lo"},  # AnyIP
        {"type": "local", "dst": "127.0.0.0/8", "dev": "lo"},  # loopback: refused by class
        {"type": "local", "dst": "127.0.0.1", "dev": "lo"},
        {"type": "local", "dst": "fd62::/64", "dev": "lo"},
        {"type": "local", "dst": "::1", "dev": "lo"},
        {"type": "local", "dst": "not an address"},
        "junk",
    ]
    assert locally_routed(routes) == ["10.61.0.3", "10.62.0.2", "fd62::2"]
    assert locally_routed({"not": "a list"}) == []
