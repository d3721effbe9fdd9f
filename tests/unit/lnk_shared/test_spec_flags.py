"""The spec's flags: each the equivalent of a section, merged with `--spec FILE` through the same
checks."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from lnk_shared.errors import PortRefused, SpecError
from lnk_shared.hosts import HostPattern
from lnk_shared.spec import FdGrant, PathEntry, Spec
from lnk_shared.spec_file import load_spec_file
from lnk_shared.spec_flags import add_spec_arguments, spec_from_arguments


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise ValueError(message)


def parse(*argv: str, cwd: str = "/work") -> Spec:
    parser = _Parser()
    add_spec_arguments(parser)
    return spec_from_arguments(parser.parse_args(list(argv)), cwd=cwd)


def test_no_flags_is_an_empty_spec() -> None:
    assert parse() == Spec()


def test_each_flag_fills_its_section() -> None:
    spec = parse(
        "--read", "/srv/data",
        "--write", "out",
        "--internet-host", "PyPI.org",
        "--network-mode", "host",
        "--lan-host", "192.168.1.20",
        "--browser-host", "accounts.example.com",
        "--port", "11434",
        "--command", "bash",
        "--with-fd", "5:write",
    )  # fmt: skip
    assert spec.read == (PathEntry("/srv/data", "/work"),)
    assert spec.write == (PathEntry("out", "/work"),)
    assert spec.internet == (HostPattern("pypi.org"),)
    assert spec.network_host
    assert [str(e) for e in spec.lan] == ["192.168.1.20"]
    assert spec.browser == (HostPattern("accounts.example.com"),)
    assert spec.ports == (11434,)
    assert [c.written for c in spec.commands] == ["bash"]
    assert spec.commands_given
    assert spec.with_fds == (FdGrant(5, True),)
    assert spec.source is None


def test_flags_repeat() -> None:
    spec = parse("--read", "/a", "--read", "/b", "--read", "/a", "--port", "1", "--port", "2")
    assert [e.written for e in spec.read] == ["/a", "/b"]
    assert spec.ports == (1, 2)


def test_relative_flag_paths_are_read_against_the_current_folder() -> None:
    spec = parse("--read", "data", "--command", "./tool", cwd="/home/u/proj")
    assert spec.read == (PathEntry("data", "/home/u/proj"),)
    assert spec.commands == (PathEntry("./tool", "/home/u/proj"),)


def test_flags_merge_with_the_spec_file(tmp_path: Path) -> None:
    spec_path = tmp_path / "spec.toml"
    spec_path.write_text('[folders]\nread = ["data"]\n[internet]\nhosts = ["pypi.org"]\n')
    spec = parse("--spec", str(spec_path), "--read", "more", "--internet-host", "github.com")
    assert set(spec.read) == {PathEntry("data", str(tmp_path)), PathEntry("more", "/work")}
    assert {h.name for h in spec.internet} == {"pypi.org", "github.com"}
    assert spec.source == str(spec_path)


def test_flags_and_file_give_the_same_spec(tmp_path: Path) -> None:
    spec_path = tmp_path / "spec.toml"
    spec_path.write_text(
        '[folders]\nread = ["/srv/data"]\n[internet]\nhosts = ["pypi.org"]\n'
        "[localhost]\nports = [8080]\n"
    )
    from_file = load_spec_file(spec_path).build()
    from_flags = parse("--read", "/srv/data", "--internet-host", "pypi.org", "--port", "8080")
    assert from_file.internet == from_flags.internet
    assert from_file.ports == from_flags.ports
    assert [e.written for e in from_file.read] == [e.written for e in from_flags.read]


@pytest.mark.parametrize(
    ("argv", "flag", "why"),
    [
        (["--internet-host", "user@pypi.org"], "--internet-host", "only letters"),
        (["--internet-host", "10.0.0.1"], "--internet-host", "an address"),
        (["--lan-host", "8.8.8.8"], "--lan-host", "not a private address"),
        (["--lan-host", "10.0.0.0/33"], "--lan-host", "not a range"),
        (["--browser-host", "*"], "--browser-host", "not allowed"),
        (["--port", "0"], "--port", "expected a port number"),
        (["--port", "http"], "--port", "expected a port number"),
        (["--read", ""], "--read", "an empty path"),
        (["--write", "~other/x"], "--write", "another user's ~"),
        (["--command", "a\x1bb"], "--command", "control character"),
        (["--with-fd", "5"], "--with-fd", "expected FD:read or FD:write"),
        (["--with-fd", "1:read"], "--with-fd", "not a passed folder"),
    ],
)
def test_bad_flag_is_a_spec_error_naming_the_flag(argv: list[str], flag: str, why: str) -> None:
    with pytest.raises(SpecError, match=why) as caught:
        parse(*argv)
    assert caught.value.source == "command line"
    assert caught.value.key == flag
    assert str(caught.value).startswith(f"command line: {flag}: ")


@pytest.mark.parametrize("port", ["*", "40781"])
def test_refused_port_flag_is_refused(port: str) -> None:
    with pytest.raises(PortRefused, match="--port"):
        parse("--port", port)


def test_network_mode_other_than_host_is_a_usage_error() -> None:
    with pytest.raises(ValueError, match="invalid choice"):
        parse("--network-mode", "bridge")


def test_bad_spec_file_given_by_flag_is_a_spec_error(tmp_path: Path) -> None:
    spec_path = tmp_path / "spec.toml"
    spec_path.write_text("[folders]\nexecute = []\n")
    with pytest.raises(SpecError, match=r"spec\.toml:2: folders\.execute: unknown key"):
        parse("--spec", str(spec_path))


def test_store_driver_flag_matches_the_file(tmp_path: Path) -> None:
    assert parse("--store-driver", "sqlite").store_driver == "sqlite"
    spec_file = tmp_path / "s.toml"
    spec_file.write_text('[store]\ndriver = "sqlite"\n')
    assert parse("--spec", str(spec_file), "--store-driver", "sqlite").store_driver == "sqlite"
    with pytest.raises(SpecError, match="a second store driver"):
        parse("--spec", str(spec_file), "--store-driver", "postgresql")
    with pytest.raises(SpecError, match="name the driver only"):
        parse("--store-driver", "sqlite:///x.db")
