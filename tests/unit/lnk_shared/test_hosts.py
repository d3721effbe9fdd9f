"""Host patterns as a spec lists them: normalization, hostile spellings, label-boundary matching."""

from __future__ import annotations

import pytest

from lnk_shared.hosts import MAX_HOST_LENGTH, HostPattern, normalize_name, parse_host_pattern


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("pypi.org", HostPattern("pypi.org")),
        ("PyPI.ORG", HostPattern("pypi.org")),
        ("pypi.org.", HostPattern("pypi.org")),
        ("pypi.org:443", HostPattern("pypi.org", port=443)),
        ("*.pythonhosted.org", HostPattern("pythonhosted.org", wildcard=True)),
        ("*.Example.COM.:8443", HostPattern("example.com", wildcard=True, port=8443)),
        ("bücher.example", HostPattern("xn--bcher-kva.example")),
        (
            "\uff50\uff59\uff50\uff49.org",
            HostPattern("pypi.org"),
        ),  # full-width "pypi" maps to ASCII
        ("xn--bcher-kva.example", HostPattern("xn--bcher-kva.example")),
        ("a-b.c-d.example", HostPattern("a-b.c-d.example")),
        ("1password.com", HostPattern("1password.com")),
    ],
)
def test_host_is_normalized(text: str, expected: HostPattern) -> None:
    assert parse_host_pattern(text) == expected


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "empty"),
        ("a..b", "empty label"),
        (".pypi.org", "empty label"),
        ("pypi.org..", "label"),
        ("user@pypi.org", "only letters"),
        ("pypi.org#frag", "only letters"),
        ("pypi.org%2f", "only letters"),
        ("pypi.org\\evil.com", "only letters"),
        ("pypi.org/path", "only letters"),
        ("pypi.org?q", "only letters"),
        ("py pi.org", "only letters"),
        ("pypi.org\r\nHost: evil", "control"),
        ("pypi.org\n", "control"),
        ("pypi\x00.org", "control"),
        ("pypi\x7f.org", "control"),
        ("[::1]", "only letters"),
        ("::1", "':'"),
        ("1.2.3.4", "numeric"),
        ("127.1", "numeric"),
        ("0x7f.1", "numeric"),
        ("pypi.0x10", "numeric"),
        ("*.com", "top-level"),
        ("*", "'*' only"),
        ("**.org", "'*' only"),
        ("py*pi.org", "'*' only"),
        ("a.*.org", "'*' only"),
        ("*pypi.org", "'*' only"),
        ("localhost", "localhost"),
        ("LOCALHOST.", "localhost"),
        ("app.localhost", "localhost"),
        ("localhost:8080", "localhost"),
        ("-a.com", "hyphen"),
        ("a-.com", "hyphen"),
        ("xn--zz.com", "international"),
        ("xn--.com", "international"),
        ("xn--ls8h.com", "international"),  # punycode of a disallowed code point
        ("a\uff20b.com", "international"),  # full-width '@' maps to '@'
        ("pypi.org:0", "port"),
        ("pypi.org:65536", "port"),
        ("pypi.org:http", "port"),
        ("pypi.org:", "port"),
        ("pypi.org:٤٤٣", "port"),  # non-ASCII digits
        ("a" * 64 + ".com", "[Ll]abel too long|label longer"),
        (".".join(["a" * 63] * 4) + ".com", "[Dd]omain too long|longer than"),
    ],
)
def test_hostile_host_is_refused_with_a_reason(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why) as caught:
        parse_host_pattern(text)
    assert type(caught.value) is ValueError


def test_homograph_is_granted_under_its_punycode_name_never_its_look_alike() -> None:
    # A Cyrillic a (U+0430) in "paypal.com": what is granted and shown is the xn-- name.
    pattern = parse_host_pattern("p\u0430ypal.com")
    assert pattern.name.startswith("xn--")
    assert pattern.name != "paypal.com"
    assert pattern.name.isascii()


def test_port_is_refused_where_none_is_allowed() -> None:
    with pytest.raises(ValueError, match="port is not allowed"):
        parse_host_pattern("example.com:443", allow_port=False)


def test_longest_valid_name_is_accepted() -> None:
    name = ".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 57]) + ".com"
    assert len(name) == MAX_HOST_LENGTH
    assert normalize_name(name) == name


@pytest.mark.parametrize(
    ("pattern", "name", "port", "matches"),
    [
        ("example.com", "example.com", 443, True),
        ("example.com", "www.example.com", 443, False),
        ("example.com", "badexample.com", 443, False),
        ("*.example.com", "a.example.com", 443, True),
        ("*.example.com", "a.b.example.com", 80, True),
        ("*.example.com", "example.com", 443, False),
        ("*.example.com", "badexample.com", 443, False),
        ("*.example.com", "example.com.evil.net", 443, False),
        ("example.com:443", "example.com", 443, True),
        ("example.com:443", "example.com", 80, False),
        ("*.example.com:8443", "a.example.com", 443, False),
    ],
)
def test_pattern_matches_on_label_boundaries(
    pattern: str, name: str, port: int, matches: bool
) -> None:
    assert parse_host_pattern(pattern).matches(name, port) is matches


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("pypi.org", "pypi.org"),
        ("*.pypi.org", "*.pypi.org"),
        ("pypi.org:443", "pypi.org:443"),
        ("*.PYPI.org.:8080", "*.pypi.org:8080"),
    ],
)
def test_pattern_is_shown_as_written_in_normal_form(text: str, shown: str) -> None:
    assert str(parse_host_pattern(text)) == shown
