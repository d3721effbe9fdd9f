"""SpecBuilder: the form of every entry, whichever way it came (file or flag)."""

from __future__ import annotations

import ipaddress

import pytest

from lnk_shared.errors import EXIT_REFUSED, EXIT_USAGE, PortRefused, SpecError
from lnk_shared.hosts import HostPattern
from lnk_shared.spec import (
    MAIN_PROXY_PORT,
    MAX_ENTRIES,
    MAX_PATH_LENGTH,
    FdGrant,
    LanEntry,
    Origin,
    PathEntry,
    Spec,
    SpecBuilder,
)

ORIGIN = Origin("spec.toml", "section.key", 7)


def test_empty_spec_is_closed() -> None:
    spec = SpecBuilder().build()
    assert spec == Spec()
    assert not spec.has_proxy
    assert not (spec.read or spec.write or spec.internet or spec.lan or spec.browser)
    assert not (spec.ports or spec.commands or spec.with_fds)
    assert not (spec.internet_any or spec.lan_any or spec.commands_any or spec.network_host)
    assert not spec.commands_given


def test_errors_name_the_source_line_and_key() -> None:
    with pytest.raises(SpecError) as caught:
        SpecBuilder().add_read(3, "/", ORIGIN)
    assert caught.value.source == "spec.toml"
    assert caught.value.line == 7
    assert caught.value.key == "section.key"
    assert str(caught.value).startswith("spec.toml:7: section.key: ")
    assert caught.value.exit_code == EXIT_USAGE


# --- paths -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (3, "as a string, got int"),
        (None, "as a string"),
        (True, "as a string"),
        ("", "empty path"),
        ("a\x00b", "control character or NUL"),
        ("a\nb", "control character"),
        ("a\x1bb", "control character"),
        ("a\x7fb", "control character"),
        ("~root/x", "another user's ~"),
        ("~x", "another user's ~"),
        ("/" + "a" * MAX_PATH_LENGTH, "longer than"),
    ],
)
def test_bad_path_is_a_spec_error(value: object, why: str) -> None:
    for add in (SpecBuilder().add_read, SpecBuilder().add_write, SpecBuilder().add_command):
        with pytest.raises(SpecError, match=why):
            add(value, "/", ORIGIN)


@pytest.mark.parametrize("text", ["~", "~/src", "src/app", "/srv/data", "../x", "a b", "ü"])
def test_path_is_kept_as_written_with_its_base(text: str) -> None:
    builder = SpecBuilder()
    builder.add_read(text, "/base", ORIGIN)
    builder.add_write(text, "/base", ORIGIN)
    spec = builder.build()
    assert spec.read == spec.write == (PathEntry(text, "/base"),)


def test_duplicate_and_reordered_entries_build_the_same_spec() -> None:
    one, two = SpecBuilder(), SpecBuilder()
    for text in ["/b", "/a", "/b"]:
        one.add_read(text, "/", ORIGIN)
    for text in ["/a", "/b"]:
        two.add_read(text, "/", ORIGIN)
    assert one.build() == two.build()


def test_more_than_max_entries_per_key_is_a_spec_error() -> None:
    builder = SpecBuilder()
    for i in range(MAX_ENTRIES):
        builder.add_read(f"/d{i}", "/", ORIGIN)
    with pytest.raises(SpecError, match=f"more than {MAX_ENTRIES} entries"):
        builder.add_read("/one-more", "/", ORIGIN)


def test_entry_limit_is_per_key() -> None:
    builder = SpecBuilder()
    for i in range(MAX_ENTRIES):
        builder.add_read(f"/d{i}", "/", Origin("f", "folders.read"))
        builder.add_write(f"/d{i}", "/", Origin("f", "folders.write"))
    assert len(builder.build().write) == MAX_ENTRIES


# --- internet and browser hosts --------------------------------------------------------------


def test_internet_hosts_are_normalized_and_deduplicated() -> None:
    builder = SpecBuilder()
    for text in ["PyPI.org", "pypi.org.", "*.pythonhosted.org"]:
        builder.add_internet(text, ORIGIN)
    spec = builder.build()
    assert sorted(spec.internet, key=str) == list(spec.internet)
    assert set(spec.internet) == {
        HostPattern("pypi.org"),
        HostPattern("pythonhosted.org", wildcard=True),
    }
    assert len(spec.internet) == 2
    assert spec.has_proxy


def test_same_host_with_and_without_a_port_builds() -> None:
    builder = SpecBuilder()
    for text in ["pypi.org:443", "pypi.org", "pypi.org:80"]:
        builder.add_internet(text, ORIGIN)
    spec = builder.build()
    assert {str(h) for h in spec.internet} == {"pypi.org", "pypi.org:443", "pypi.org:80"}


def test_internet_star_means_any_and_drops_names() -> None:
    builder = SpecBuilder()
    builder.add_internet("pypi.org", ORIGIN)
    builder.add_internet("*", ORIGIN)
    spec = builder.build()
    assert spec.internet_any
    assert spec.internet == ()


def test_internet_star_keeps_the_port_22_entries_it_does_not_open() -> None:
    builder = SpecBuilder()
    for text in ("pypi.org", "*", "github.com:22", "*.forge.example:22", "pypi.org:443"):
        builder.add_internet(text, ORIGIN)
    spec = builder.build()
    assert spec.internet_any
    assert [str(h) for h in spec.internet] == ["*.forge.example:22", "github.com:22"]


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (1, "expected a host name, got int"),
        ("10.0.0.1", r"an address, not a name.*\[lan\]"),
        ("*.com", "top-level"),
        ("user@pypi.org", "only letters"),
        ("localhost", "localhost"),
    ],
)
def test_bad_internet_host_is_a_spec_error(value: object, why: str) -> None:
    with pytest.raises(SpecError, match=why):
        SpecBuilder().add_internet(value, ORIGIN)


def test_browser_hosts_are_names() -> None:
    builder = SpecBuilder()
    builder.add_browser("Accounts.Example.com", ORIGIN)
    assert builder.build().browser == (HostPattern("accounts.example.com"),)
    assert not builder.build().has_proxy


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("*", r"'\*' is not allowed for \[browser\]"),
        ("accounts.example.com:443", "port is not allowed"),
        ("localhost", "localhost"),
        (5, "expected a host name"),
    ],
)
def test_bad_browser_host_is_a_spec_error(value: object, why: str) -> None:
    with pytest.raises(SpecError, match=why):
        SpecBuilder().add_browser(value, ORIGIN)


# --- network mode ----------------------------------------------------------------------------


def test_network_mode_host_is_the_only_mode() -> None:
    builder = SpecBuilder()
    builder.add_internet("pypi.org", ORIGIN)
    builder.set_network_mode("host", ORIGIN)
    spec = builder.build()
    assert spec.network_host
    assert not spec.has_proxy


@pytest.mark.parametrize("value", ["bridge", "HOST", "", ["host"], True, None])
def test_other_network_mode_is_a_spec_error(value: object) -> None:
    with pytest.raises(SpecError, match='expected "host"'):
        SpecBuilder().set_network_mode(value, ORIGIN)


# --- lan -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("192.168.1.20", "192.168.1.20"),
        ("10.0.0.0/8", "10.0.0.0/8"),
        ("172.16.0.0/12", "172.16.0.0/12"),
        ("192.168.1.0/24", "192.168.1.0/24"),
        ("10.1.2.3/32", "10.1.2.3"),
        ("fd12:3456::1", "fd12:3456::1"),
        ("fc00::/7", "fc00::/7"),
        ("[fd00::5]", "fd00::5"),
        ("100.64.1.2", "100.64.1.2"),  # CGNAT (Tailscale): one address at a time
        ("nas.home.arpa", "nas.home.arpa"),
        ("NAS.Home.Arpa.", "nas.home.arpa"),
        ("*.home.arpa", "*.home.arpa"),
    ],
)
def test_private_lan_entry_is_accepted(text: str, shown: str) -> None:
    builder = SpecBuilder()
    builder.add_lan(text, ORIGIN)
    spec = builder.build()
    assert [str(e) for e in spec.lan] == [shown]
    assert spec.has_proxy


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("8.8.8.8", "not a private address"),
        ("1.1.1.0/24", "not inside a private range"),
        ("0.0.0.0/0", "not inside a private range"),
        ("::/0", "not inside a private range"),
        ("127.0.0.1", "not a private address"),
        ("169.254.169.254", "metadata"),
        ("169.254.1.1", "not a private address"),
        ("100.64.0.0/10", "100.64/10 only as single addresses"),
        ("100.64.0.0/24", "100.64/10 only as single addresses"),
        ("100.100.100.200", "metadata"),  # Alibaba Cloud's metadata, inside CGNAT
        ("100.100.100.200/32", "metadata"),
        ("fd00:ec2::254", "metadata"),  # AWS metadata over IPv6, inside fc00::/7
        ("10.0.0.1/8", "not a range"),
        ("10.0.0.0/33", "not a range"),
        ("fe80::1%eth0", "scoped"),
        ("10.0.0.1:80", "port is not allowed"),
        ("nas:80", "port is not allowed"),
        ("localhost", "localhost"),
        ("a@nas.home.arpa", "only letters"),
        ("\x00", "control"),
    ],
)
def test_public_or_bad_lan_entry_is_a_spec_error(text: str, why: str) -> None:
    with pytest.raises(SpecError, match=why):
        SpecBuilder().add_lan(text, ORIGIN)


@pytest.mark.parametrize("value", [10, None, 1.5])
def test_lan_entry_of_the_wrong_type_is_a_spec_error(value: object) -> None:
    with pytest.raises(SpecError, match="expected a name, address or range"):
        SpecBuilder().add_lan(value, ORIGIN)


def test_lan_star_means_every_private_network() -> None:
    builder = SpecBuilder()
    builder.add_lan("10.0.0.1", ORIGIN)
    builder.add_lan("*", ORIGIN)
    spec = builder.build()
    assert spec.lan_any
    assert spec.lan == ()


def test_lan_entries_are_deduplicated_in_a_stable_order() -> None:
    builder = SpecBuilder()
    for text in ["nas.home.arpa", "10.0.0.1", "10.0.0.1/32", "fd00::1"]:
        builder.add_lan(text, ORIGIN)
    lan = builder.build().lan
    assert lan == (
        LanEntry(network=ipaddress.ip_network("10.0.0.1")),
        LanEntry(network=ipaddress.ip_network("fd00::1")),
        LanEntry(name=HostPattern("nas.home.arpa")),
    )


# --- localhost ports -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "port"), [(11434, 11434), ("8080", 8080), (1, 1), (65535, 65535)]
)
def test_localhost_port_is_accepted(value: object, port: int) -> None:
    builder = SpecBuilder()
    builder.add_port(value, ORIGIN)
    assert builder.build().ports == (port,)


def test_every_localhost_port_star_is_refused() -> None:
    with pytest.raises(PortRefused) as caught:
        SpecBuilder().add_port("*", Origin("spec.toml", "localhost.ports", 3))
    assert caught.value.exit_code == EXIT_REFUSED
    assert 'localhost.ports = "*"' in str(caught.value)
    assert "[localhost-port]" in str(caught.value)


@pytest.mark.parametrize("value", [MAIN_PROXY_PORT, str(MAIN_PROXY_PORT)])
def test_main_proxy_port_is_refused(value: object) -> None:
    with pytest.raises(PortRefused, match="main proxy") as caught:
        SpecBuilder().add_port(value, Origin("command line", "--port"))
    assert caught.value.exit_code == EXIT_REFUSED
    assert f"--port = {MAIN_PROXY_PORT}" in str(caught.value)


@pytest.mark.parametrize("value", [MAIN_PROXY_PORT - 1, MAIN_PROXY_PORT + 1])
def test_ports_next_to_the_main_proxy_port_are_accepted(value: int) -> None:
    builder = SpecBuilder()
    builder.add_port(value, ORIGIN)
    assert builder.build().ports == (value,)


@pytest.mark.parametrize(
    "value", [0, -1, 65536, 10**30, True, False, 1.0, None, "", "http", "80x", "٨٠", "000008080"]
)
def test_bad_port_is_a_spec_error(value: object) -> None:
    with pytest.raises(SpecError, match="expected a port number"):
        SpecBuilder().add_port(value, ORIGIN)


# --- commands --------------------------------------------------------------------------------


def test_commands_section_present_but_empty_is_recorded() -> None:
    builder = SpecBuilder()
    builder.declare_commands()
    spec = builder.build()
    assert spec.commands_given
    assert spec.commands == ()


def test_commands_star_lifts_only_the_exec_limit() -> None:
    builder = SpecBuilder()
    builder.add_command("bash", "/", ORIGIN)
    builder.add_command("*", "/", ORIGIN)
    spec = builder.build()
    assert spec.commands_any
    assert spec.commands == ()
    assert spec.read == spec.write == ()


def test_commands_keep_names_and_paths_as_written() -> None:
    builder = SpecBuilder()
    for text in ["python3", "/usr/bin/git", "bash", "bash"]:
        builder.add_command(text, "/base", ORIGIN)
    assert [c.written for c in builder.build().commands] == ["/usr/bin/git", "bash", "python3"]


# --- --with-fd -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "grant"), [("3:read", FdGrant(3, False)), ("5:write", FdGrant(5, True))]
)
def test_with_fd_is_parsed(text: str, grant: FdGrant) -> None:
    builder = SpecBuilder()
    builder.add_fd(text, ORIGIN)
    assert builder.build().with_fds == (grant,)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("5", "expected FD:read or FD:write"),
        ("5:rw", "expected FD:read or FD:write"),
        (":write", "expected FD:read or FD:write"),
        ("-5:write", "expected FD:read or FD:write"),
        ("x:write", "expected FD:read or FD:write"),
        ("\u00b2:write", "expected FD:read or FD:write"),  # superscript two: isdigit, not int
        ("\u0665:write", "expected FD:read or FD:write"),  # Arabic-Indic five
        ("9" * 5000 + ":write", "expected FD:read or FD:write"),  # past int()'s digit limit
        ("0:read", "not a passed folder"),
        ("2:write", "not a passed folder"),
        (f"{(1 << 20) + 1}:write", "not a passed folder"),
    ],
)
def test_bad_with_fd_is_a_spec_error(text: str, why: str) -> None:
    with pytest.raises(SpecError, match=why):
        SpecBuilder().add_fd(text, ORIGIN)


def test_spec_is_immutable() -> None:
    spec = SpecBuilder().build()
    with pytest.raises(AttributeError):
        spec.read = (PathEntry("/", "/"),)  # type: ignore[misc]
