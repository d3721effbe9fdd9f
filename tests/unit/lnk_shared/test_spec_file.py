"""Reading a spec's TOML file strictly: errors name the file, the line, the key and what was
expected."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lnk_shared.errors import PortRefused, SpecError
from lnk_shared.hosts import HostPattern
from lnk_shared.spec import Origin, PathEntry, SpecBuilder
from lnk_shared.spec_file import SECTIONS, load_spec_file, parse_spec_text

EXAMPLE = """\
# the issue's example spec
[folders]
read  = ["~/src/app", "/srv/data"]   # read-only
write = ["~/src/app/out"]            # read-write (implies read)
[internet]
hosts = ["pypi.org", "*.pythonhosted.org"]
[network]
mode = "host"
[lan]
hosts = ["nas.home.arpa", "192.168.1.20", "10.0.0.0/8"]
[browser]
hosts = ["accounts.example.com"]
[localhost]
ports = [11434]
[commands]
allow = ["bash", "python3", "/usr/bin/git"]
"""


def write_spec(tmp_path: Path, text: str | bytes, name: str = "spec.toml") -> Path:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def test_example_spec_is_read(tmp_path: Path) -> None:
    path = write_spec(tmp_path, EXAMPLE)
    spec = load_spec_file(path).build()
    base = str(tmp_path)
    assert spec.source == str(path)
    assert spec.read == (PathEntry("/srv/data", base), PathEntry("~/src/app", base))
    assert spec.write == (PathEntry("~/src/app/out", base),)
    assert set(spec.internet) == {
        HostPattern("pypi.org"),
        HostPattern("pythonhosted.org", wildcard=True),
    }
    assert spec.network_host
    assert [str(e) for e in spec.lan] == ["10.0.0.0/8", "192.168.1.20", "nas.home.arpa"]
    assert spec.browser == (HostPattern("accounts.example.com"),)
    assert spec.ports == (11434,)
    assert spec.commands_given
    assert [c.written for c in spec.commands] == ["/usr/bin/git", "bash", "python3"]


def test_relative_paths_are_read_against_the_spec_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "specs").mkdir()
    write_spec(tmp_path / "specs", '[folders]\nread = ["data"]\n')
    monkeypatch.chdir(tmp_path)
    spec = load_spec_file("specs/spec.toml").build()
    assert spec.source == str(tmp_path / "specs" / "spec.toml")
    assert spec.read == (PathEntry("data", str(tmp_path / "specs")),)


def test_empty_file_is_an_empty_spec(tmp_path: Path) -> None:
    spec = load_spec_file(write_spec(tmp_path, "# nothing\n")).build()
    assert spec.read == spec.write == spec.commands == ()
    assert not spec.commands_given


def test_empty_commands_section_grants_no_programs(tmp_path: Path) -> None:
    spec = load_spec_file(write_spec(tmp_path, "[commands]\n")).build()
    assert spec.commands_given
    assert spec.commands == ()


def test_dotted_keys_and_inline_tables_are_the_same_spec(tmp_path: Path) -> None:
    one = load_spec_file(write_spec(tmp_path, 'folders.read = ["/a"]\n', "one.toml")).build()
    two = load_spec_file(write_spec(tmp_path, 'folders = { read = ["/a"] }\n', "two.toml"))
    assert one.read == two.build().read


# Each case: the spec text, the line the error must name, the key, and what was expected.
STRICT_CASES = [
    pytest.param(
        '[folders]\nread = ["/a"]\n\n[foo]\nx = 1\n', 4, "[foo]", "unknown section; expected one",
        id="unknown-section",
    ),
    pytest.param(
        '# a comment\n[folders]\nread = ["/a"]\nwrtie = ["/b"]\n', 4, "folders.wrtie",
        "unknown key; [folders] takes: read, write", id="unknown-key",
    ),
    pytest.param(
        '[folders]\n\n\nread = "/a"\n', 4, "folders.read",
        "expected a list of paths, got a string", id="string-not-list",
    ),
    pytest.param(
        "[folders]\nwrite = [1]\n", 2, "folders.write", "expected a path as a string",
        id="int-path",
    ),
    pytest.param(
        '[folders]\nread = [\n  "/a",\n  ["/b"],\n]\n', 2, "folders.read",
        "expected a list of paths, got a nested array", id="nested-array",
    ),
    pytest.param(
        "\n\nfolders = 1\n", 3, "[folders]", "expected a table", id="section-not-table",
    ),
    pytest.param(
        '[internet]\nhosts = ["pypi.org"]\n[internet.extra]\nx = 1\n', 3, "internet.extra",
        "unknown key", id="dotted-header",
    ),
    pytest.param(
        '[[folders]]\nread = ["/a"]\n', 1, "[folders]", "expected a table", id="array-of-tables",
    ),
    pytest.param(
        '[folders]\nread = ["/a"]\nx.y = 1\n', 3, "folders.x", "unknown key", id="dotted-key",
    ),
    pytest.param(
        '[internet]\n\nhosts = ["pypi.org", "user@evil.com"]\n', 3, "internet.hosts",
        "'user@evil.com': a host name may hold only", id="bad-host",
    ),
    pytest.param(
        '[internet]\nhosts = "pypi.org"\n', 2, "internet.hosts",
        'expected a list of host names, "*.name" or "*", got a string', id="host-not-list",
    ),
    pytest.param(
        '[folders]\nread = []\n[lan]\nhosts = ["10.0.0.0/33"]\n', 4, "lan.hosts",
        "'10.0.0.0/33' is not a range", id="bad-cidr",
    ),
    pytest.param(
        '[lan]\nhosts = ["10.0.0.1/8"]\n', 2, "lan.hosts", "is not a range", id="cidr-host-bits",
    ),
    pytest.param(
        '[lan]\nhosts = ["8.8.8.0/24"]\n', 2, "lan.hosts", "not inside a private range",
        id="public-cidr",
    ),
    pytest.param(
        "\n[localhost]\nports = [70000]\n", 3, "localhost.ports",
        "expected a port number from 1 to 65535, got 70000", id="bad-port",
    ),
    pytest.param(
        '[localhost]\nports = [1.5]\n', 2, "localhost.ports", "expected a port number",
        id="float-port",
    ),
    pytest.param(
        '[localhost]\nports = ["8080"]\n',
        2,
        "localhost.ports",
        "expected a list of port numbers, got a string '8080'",
        id="string-port",
    ),
    pytest.param(
        "[localhost]\nports = 8080\n", 2, "localhost.ports",
        "expected a list of port numbers, got an integer", id="port-not-list",
    ),
    pytest.param(
        '[network]\nmode = "bridge"\n', 2, "network.mode", 'expected "host"', id="bad-mode",
    ),
    pytest.param(
        '[network]\nhosts = ["x"]\n', 2, "network.hosts", "unknown key; [network] takes: mode",
        id="network-unknown-key",
    ),
    pytest.param(
        '[browser]\nhosts = ["*"]\n', 2, "browser.hosts", "'*' is not allowed", id="browser-star",
    ),
    pytest.param(
        "[commands]\nallow = [true]\n", 2, "commands.allow", "expected a path as a string",
        id="bool-command",
    ),
    pytest.param(
        "[commands]\nallow = [{ x = 1 }]\n", 2, "commands.allow", "got a nested table",
        id="nested-table",
    ),
    pytest.param(
        '\n\n[folders]\nread = ["/a"\n', 4, None, "not valid TOML", id="unclosed-array",
    ),
    pytest.param(
        '[folders]\nread = ["/a"]\nread = ["/b"]\n', 3, None, "not valid TOML",
        id="duplicate-key",
    ),
    pytest.param(
        '[folders]\nread = ["/a"]\n[folders]\n', 3, None, "not valid TOML",
        id="duplicate-section",
    ),
    pytest.param('a = "\x01"\n', 1, None, "not valid TOML", id="raw-control-character"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "line", "key", "expected"), STRICT_CASES)
def test_strict_error_names_file_line_key_and_expectation(
    tmp_path: Path, text: str, line: int, key: str | None, expected: str
) -> None:
    path = write_spec(tmp_path, text)
    with pytest.raises(SpecError) as caught:
        load_spec_file(path).build()
    error = caught.value
    assert error.source == str(path)
    assert error.line == line
    assert error.key == key
    where = f"{path}:{line}: " if key is None else f"{path}:{line}: {key}: "
    assert str(error).startswith(where)
    assert expected in str(error)


def test_every_known_key_is_accepted(tmp_path: Path) -> None:
    values = {
        ("folders", "read"): '["/a"]',
        ("folders", "write"): '["/b"]',
        ("internet", "hosts"): '["pypi.org"]',
        ("network", "mode"): '"host"',
        ("lan", "hosts"): '["10.0.0.1"]',
        ("browser", "hosts"): '["example.com"]',
        ("localhost", "ports"): "[8080]",
        ("commands", "allow"): '["bash"]',
        ("store", "driver"): '"sqlite"',
        ("limits", "processes"): "64",
        ("limits", "memory"): '"512M"',
        ("limits", "cpu"): "50",
        ("limits", "open_files"): "256",
    }
    assert set(values) == {(s, k) for s, keys in SECTIONS.items() for k in keys}
    text = "".join(f"{s}.{k} = {v}\n" for (s, k), v in values.items())
    spec = load_spec_file(write_spec(tmp_path, text)).build()
    assert spec.read and spec.write and spec.internet and spec.network_host
    assert spec.lan and spec.browser and spec.ports and spec.commands and spec.store_driver


def test_star_port_in_a_file_is_refused_not_a_spec_error(tmp_path: Path) -> None:
    path = write_spec(tmp_path, '[localhost]\nports = ["*"]\n')
    with pytest.raises(PortRefused, match=r'localhost\.ports = "\*"'):
        load_spec_file(path)


def test_main_proxy_port_in_a_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(PortRefused, match="40781"):
        load_spec_file(write_spec(tmp_path, "[localhost]\nports = [40781]\n"))


def test_missing_file_is_a_spec_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "absent.toml"
    with pytest.raises(SpecError, match="cannot open the spec file") as caught:
        load_spec_file(path)
    assert caught.value.source == str(path)


def test_folder_as_spec_is_not_a_regular_file(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="not a regular file"):
        load_spec_file(tmp_path)


def test_link_to_a_spec_is_read(tmp_path: Path) -> None:
    real = write_spec(tmp_path, '[folders]\nread = ["/a"]\n')
    (tmp_path / "link.toml").symlink_to(real)
    assert load_spec_file(tmp_path / "link.toml").build().read == (PathEntry("/a", str(tmp_path)),)


def test_builder_given_is_filled_and_named_after_the_file(tmp_path: Path) -> None:
    builder = SpecBuilder()
    builder.add_read("/flag", "/", Origin("command line", "--read"))
    path = write_spec(tmp_path, '[folders]\nread = ["/file"]\n')
    assert load_spec_file(path, builder) is builder
    spec = builder.build()
    assert spec.source == str(path)
    assert {e.written for e in spec.read} == {"/file", "/flag"}


def test_text_is_parsed_with_the_source_named() -> None:
    with pytest.raises(SpecError) as caught:
        parse_spec_text("[x]\n", source="<stdin>", base=os.getcwd())
    assert str(caught.value).startswith("<stdin>:1: [x]: unknown section")


def test_store_names_a_driver(tmp_path: Path) -> None:
    spec = load_spec_file(write_spec(tmp_path, '[store]\ndriver = "sqlite"\n')).build()
    assert spec.store_driver == "sqlite"
    assert (
        load_spec_file(write_spec(tmp_path, "[folders]\n", "b.toml")).build().store_driver is None
    )


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ('"sqlite:////var/lib/lnk/bridge-store/store.db"', "name the driver only"),
        ('"postgresql://db.internal/agents"', "name the driver only"),
        ('"SQLite"', "a driver name"),
        ('"sqlite; drop"', "a driver name"),
        ('""', "a driver name"),
        ('["sqlite"]', "a driver name"),
        ("1", "a driver name"),
    ],
)
def test_store_driver_is_a_name_never_a_url(tmp_path: Path, value: str, why: str) -> None:
    path = write_spec(tmp_path, f"[store]\ndriver = {value}\n")
    with pytest.raises(SpecError, match=why) as raised:
        load_spec_file(path)
    assert "store.driver" in str(raised.value) and ":2" in str(raised.value)


def test_store_takes_no_other_key(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"unknown key; \[store\] takes: driver"):
        load_spec_file(write_spec(tmp_path, '[store]\nurl = "x"\n'))
