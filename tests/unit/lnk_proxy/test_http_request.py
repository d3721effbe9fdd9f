"""Request heads from the sandbox: every hostile head is refused with its exact rule id, and the
honest neighbour of each trick is served."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lnk_proxy.http_request import (
    MAX_HEAD_BYTES,
    MAX_HEADERS,
    MAX_LINE,
    RULES,
    BodyLength,
    ProxyRequest,
    RequestRefused,
    cut_for_log,
    find_head_end,
    format_upstream_head,
    parse_request_head,
    refusal_response,
)


def head(request_line: str | bytes, *headers: str | bytes) -> bytes:
    """A head from its lines: CRLF after each, then the blank line."""
    lines = [x.encode("latin-1") if isinstance(x, str) else x for x in (request_line, *headers)]
    return b"".join(line + b"\r\n" for line in lines) + b"\r\n"


def get(target: str, *headers: str | bytes, host: str = "a.com") -> bytes:
    return head(f"GET {target} HTTP/1.1", f"Host: {host}", *headers)


def connect(target: str, *headers: str | bytes) -> bytes:
    return head(f"CONNECT {target} HTTP/1.1", *headers)


def post(*headers: str | bytes) -> bytes:
    return head("POST http://a.com/upload HTTP/1.1", "Host: a.com", *headers)


def refused_rule(untrusted: bytes) -> str:
    with pytest.raises(RequestRefused) as caught:
        parse_request_head(untrusted)
    return caught.value.rule


HOSTILE: list[tuple[str, bytes, str]] = [
    # Request smuggling: two readings of where the body ends.
    ("cl_and_te", post("Content-Length: 5", "Transfer-Encoding: chunked"), "ambiguous-framing"),
    ("te_and_cl", post("Transfer-Encoding: chunked", "Content-Length: 0"), "ambiguous-framing"),
    ("two_differing_cl", post("Content-Length: 5", "Content-Length: 6"), "ambiguous-framing"),
    ("cl_list_differing", post("Content-Length: 5, 6"), "ambiguous-framing"),
    ("te_chunked_identity", post("Transfer-Encoding: chunked, identity"), "bad-transfer-encoding"),
    ("te_identity", post("Transfer-Encoding: identity"), "bad-transfer-encoding"),
    ("te_gzip_chunked", post("Transfer-Encoding: gzip, chunked"), "bad-transfer-encoding"),
    ("te_twice", post("Transfer-Encoding: chunked", "Transfer-Encoding: chunked"),
        "bad-transfer-encoding"),
    ("te_xchunked", post("Transfer-Encoding: xchunked"), "bad-transfer-encoding"),
    ("te_space_before_colon", post("Transfer-Encoding : chunked"), "bad-header"),
    ("cl_space_before_colon", post("Content-Length : 5"), "bad-header"),
    ("te_obs_fold", post("Transfer-Encoding:", " chunked"), "bad-header"),
    ("obs_fold_tab", get("http://a.com/", "X-A: 1", "\tcontinued"), "bad-header"),
    ("te_in_http10", head("POST http://a.com/ HTTP/1.0", "Transfer-Encoding: chunked"),
        "ambiguous-framing"),
    ("cl_negative", post("Content-Length: -1"), "bad-content-length"),
    ("cl_plus", post("Content-Length: +5"), "bad-content-length"),
    ("cl_hex", post("Content-Length: 0x5"), "bad-content-length"),
    ("cl_empty", post("Content-Length:"), "bad-content-length"),
    ("cl_huge", post("Content-Length: " + "9" * 19), "bad-content-length"),
    ("cl_unicode_digits", post("Content-Length: \xb2"), "bad-content-length"),
    ("connect_with_body", connect("a.com:443", "Content-Length: 5"), "ambiguous-framing"),
    ("connect_chunked", connect("a.com:443", "Transfer-Encoding: chunked"), "ambiguous-framing"),
    ("data_after_head", get("http://a.com/") + b"GET http://b.com/ HTTP/1.1\r\n\r\n",
        "incomplete-head"),
    ("bare_lf_lines", b"GET http://a.com/ HTTP/1.1\nHost: a.com\n\n", "incomplete-head"),
    ("bare_lf_header", get("http://a.com/", b"X-A: 1\nHost: b.com"), "bad-header"),
    # Host tricks: where the request goes, read two ways.
    ("userinfo", get("http://evil@good/", host="good"), "userinfo"),
    ("backslash_userinfo", get("http://good\\@evil/", host="evil"), "userinfo"),
    ("escaped_slash_userinfo", get("http://good%2f@evil/", host="evil"), "userinfo"),
    ("fragment_userinfo", get("http://a.com#@b.com/", host="b.com"), "userinfo"),
    ("userinfo_in_host_header", get("http://a.com/", host="x@a.com"), "userinfo"),
    ("connect_userinfo", connect("user@good:443"), "userinfo"),
    ("backslash", get("http://a.com\\.evil.com/", host="a.com"), "bad-host-char"),
    ("percent", get("http://a%2ecom/", host="a.com"), "bad-host-char"),
    ("query_in_authority", get("http://a.com?x=/", host="a.com"), "bad-host-char"),
    ("fragment_in_authority", get("http://a.com#x/", host="a.com"), "bad-host-char"),
    ("bare_open_bracket", get("http://a[.com/", host="a.com"), "bad-host-char"),
    ("bare_close_bracket", get("http://a].com/", host="a.com"), "bad-host-char"),
    ("unclosed_ipv6", get("http://[::1/", host="a.com"), "bad-host-char"),
    ("ipv6_zone", connect("[fe80::1%25eth0]:443"), "bad-host-char"),
    ("ipv6_zone_host", get("http://[fe80::1%eth0]/", host="a.com"), "bad-host-char"),
    ("text_after_ipv6", connect("[::1]x:443"), "bad-host-char"),
    ("not_ipv6_in_brackets", connect("[1.2.3.4]:443"), "bad-host"),
    ("unbracketed_ipv6", connect("::1:443"), "bad-host"),
    ("empty_host", get("http:///path", host="a.com"), "bad-host"),
    ("empty_connect_host", connect(":443"), "bad-host"),
    ("nul_in_host_header", get("http://a.com/", host="a.com\x00.evil"), "bad-header"),
    ("space_in_host_header", get("http://a.com/", host="a.com evil"), "bad-host-char"),
    ("non_ascii_host_header", get("http://a.com/", host="\xe4.com"), "bad-host-char"),
    ("connect_path", connect("good:443/path"), "connect-with-path"),
    ("connect_scheme", connect("http://good:443"), "connect-with-path"),
    ("connect_query", connect("good:443?x"), "connect-with-path"),
    ("connect_fragment", connect("good:443#x"), "connect-with-path"),
    ("connect_origin_form", connect("/"), "connect-with-path"),
    ("connect_port_0", connect("good:0"), "bad-port"),
    ("connect_port_65536", connect("good:65536"), "bad-port"),
    ("connect_no_port", connect("good"), "bad-port"),
    ("connect_empty_port", connect("good:"), "bad-port"),
    ("connect_port_letters", connect("good:https"), "bad-port"),
    ("connect_port_sign", connect("good:+443"), "bad-port"),
    ("connect_port_long", connect("good:000443"), "bad-port"),
    ("connect_ipv6_no_port", connect("[::1]"), "bad-port"),
    ("http_port_0", get("http://a.com:0/", host="a.com:0"), "bad-port"),
    ("http_empty_port", get("http://a.com:/", host="a.com"), "bad-port"),
    # Host header against the absolute URI.
    ("host_mismatch", get("http://a.com/", host="b.com"), "host-mismatch"),
    ("host_port_mismatch", get("http://a.com/", host="a.com:8080"), "host-mismatch"),
    ("uri_port_mismatch", get("http://a.com:8080/", host="a.com"), "host-mismatch"),
    ("host_suffix", get("http://a.com/", host="a.com.evil"), "host-mismatch"),
    ("ipv6_mismatch", get("http://[::1]/", host="[::2]"), "host-mismatch"),
    ("connect_host_mismatch", connect("a.com:443", "Host: b.com:443"), "host-mismatch"),
    ("connect_host_port_mismatch", connect("a.com:443", "Host: a.com:8443"), "host-mismatch"),
    ("two_hosts", get("http://a.com/", "Host: a.com"), "host-mismatch"),
    ("no_host_http11", head("GET http://a.com/ HTTP/1.1"), "missing-host"),
    ("empty_host_header", get("http://a.com/", host=""), "bad-host"),
    # Forms and schemes.
    ("origin_form", get("/"), "origin-form"),
    ("origin_form_path", get("/index.html?q=1"), "origin-form"),
    ("asterisk_form", head("OPTIONS * HTTP/1.1", "Host: a.com"), "origin-form"),
    ("https_absolute", get("https://a.com/"), "bad-scheme"),
    ("ftp", get("ftp://a.com/"), "bad-scheme"),
    ("file", get("file:///etc/passwd"), "bad-scheme"),
    ("authority_form_get", get("a.com:80"), "bad-target"),
    ("mailto", get("mailto:a@a.com"), "bad-target"),
    ("fragment_in_path", get("http://a.com/x#frag"), "bad-target"),
    # The request line.
    ("http09", b"GET http://a.com/\r\n\r\n", "bad-request-line"),
    ("two_spaces", get("http://a.com/  x"), "bad-request-line"),
    ("tab_separator", head("GET\thttp://a.com/ HTTP/1.1", "Host: a.com"), "bad-request-line"),
    ("nul_in_target", get("http://a.com/\x00"), "bad-request-line"),
    ("cr_in_target", get("http://a.com/\rx"), "bad-request-line"),
    ("lf_in_request_line", head(b"GET http://a.com/\n HTTP/1.1", "Host: a.com"),
        "bad-request-line"),
    ("non_ascii_target", get("http://a.com/\xe9"), "bad-request-line"),
    ("non_ascii_host_in_uri", get("http://\xe4.com/", host="xn--4ca.com"), "bad-request-line"),
    ("utf8_method", head("G\xc3\x89T http://a.com/ HTTP/1.1", "Host: a.com"), "bad-request-line"),
    ("leading_blank_line", b"\r\n" + get("http://a.com/"), "incomplete-head"),
    ("method_paren", head("GE(T http://a.com/ HTTP/1.1", "Host: a.com"), "bad-method"),
    ("method_slash", head("G/ET http://a.com/ HTTP/1.1", "Host: a.com"), "bad-method"),
    ("http2", head("GET http://a.com/ HTTP/2.0", "Host: a.com"), "bad-version"),
    ("http09_version", head("GET http://a.com/ HTTP/0.9", "Host: a.com"), "bad-version"),
    ("lowercase_version", head("GET http://a.com/ http/1.1", "Host: a.com"), "bad-version"),
    ("version_12", head("GET http://a.com/ HTTP/1.2", "Host: a.com"), "bad-version"),
    # Headers.
    ("nul_in_value", get("http://a.com/", "X-A: a\x00b"), "bad-header"),
    ("cr_in_value", get("http://a.com/", "X-A: a\rb"), "bad-header"),
    ("esc_in_value", get("http://a.com/", "X-A: \x1b[31m"), "bad-header"),
    ("del_in_value", get("http://a.com/", "X-A: a\x7fb"), "bad-header"),
    ("no_colon", get("http://a.com/", "X-A"), "bad-header"),
    ("empty_name", get("http://a.com/", ": x"), "bad-header"),
    ("space_in_name", get("http://a.com/", "X A: x"), "bad-header"),
    ("nul_in_name", get("http://a.com/", "X\x00A: x"), "bad-header"),
    ("non_ascii_name", get("http://a.com/", "X-\xe9: x"), "bad-header"),
    # Size.
    ("head_too_large", get("http://a.com/", *[f"X-{i}: {'a' * 4000}" for i in range(9)]),
        "head-too-large"),
    ("line_too_long", get("http://a.com/", "X-A: " + "a" * MAX_LINE), "head-too-large"),
    ("uri_too_long", get("http://a.com/" + "a" * MAX_LINE), "head-too-large"),
    ("too_many_headers", get("http://a.com/", *[f"X-{i}: 1" for i in range(MAX_HEADERS)]),
        "too-many-headers"),
    ("no_blank_line", b"GET http://a.com/ HTTP/1.1\r\nHost: a.com\r\n", "incomplete-head"),
    ("empty", b"", "incomplete-head"),
    ("only_blank_line", b"\r\n\r\n", "incomplete-head"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("untrusted", "rule"), [(h, r) for _, h, r in HOSTILE], ids=[n for n, _, _ in HOSTILE]
)
def test_hostile_head_is_refused_with_its_rule(untrusted: bytes, rule: str) -> None:
    assert refused_rule(untrusted) == rule


def test_every_rule_has_a_hostile_head() -> None:
    assert {rule for _, _, rule in HOSTILE} == RULES


def test_101_headers_is_refused_100_is_served() -> None:
    hundred = [f"X-{i}: 1" for i in range(MAX_HEADERS - 1)]  # plus Host
    assert parse_request_head(get("http://a.com/", *hundred)).host == "a.com"
    assert refused_rule(get("http://a.com/", *hundred, "X-Last: 1")) == "too-many-headers"


def test_reason_names_the_detail_without_control_characters() -> None:
    with pytest.raises(RequestRefused) as caught:
        parse_request_head(get("http://a.com/\x1b]0;owned\x07" + "b" * 5_000))
    assert caught.value.rule == "bad-request-line"
    assert "\x1b" not in caught.value.reason and "\x07" not in caught.value.reason
    assert len(caught.value.reason) < 200


SERVED: list[tuple[str, bytes, tuple[str, str, str, int, str]]] = [
    ("connect", connect("a.com:443", "Host: a.com:443"), ("CONNECT", "connect", "a.com", 443, "")),
    ("connect_no_host_http10", head("CONNECT a.com:443 HTTP/1.0"),
        ("CONNECT", "connect", "a.com", 443, "")),
    ("connect_host_without_port", connect("a.com:443", "Host: a.com"),
        ("CONNECT", "connect", "a.com", 443, "")),
    ("connect_ipv6_syntax_is_fine", connect("[::1]:443"), ("CONNECT", "connect", "[::1]", 443, "")),
    ("connect_mapped_ipv6", connect("[::ffff:127.0.0.1]:443"),
        ("CONNECT", "connect", "[::ffff:127.0.0.1]", 443, "")),
    ("connect_ip_literal", connect("127.0.0.1:22"), ("CONNECT", "connect", "127.0.0.1", 22, "")),
    ("connect_odd_ipv4_left_to_policy", connect("0x7f000001:443"),
        ("CONNECT", "connect", "0x7f000001", 443, "")),
    ("connect_port_65535", connect("a.com:65535"), ("CONNECT", "connect", "a.com", 65535, "")),
    ("connect_cl_0", connect("a.com:443", "Content-Length: 0"),
        ("CONNECT", "connect", "a.com", 443, "")),
    ("get_query", get("http://a.com/search?q=x&y=%2F"),
        ("GET", "http", "a.com", 80, "/search?q=x&y=%2F")),
    ("get_no_path", get("http://a.com"), ("GET", "http", "a.com", 80, "/")),
    ("get_port", get("http://a.com:8080/x", host="a.com:8080"),
        ("GET", "http", "a.com", 8080, "/x")),
    ("host_default_port_written", get("http://a.com/", host="a.com:80"),
        ("GET", "http", "a.com", 80, "/")),
    ("uri_default_port_written", get("http://a.com:80/", host="a.com"),
        ("GET", "http", "a.com", 80, "/")),
    ("host_case_and_dot", get("http://A.Com./", host="a.com"), ("GET", "http", "A.Com.", 80, "/")),
    ("scheme_case", get("HTTP://a.com/"), ("GET", "http", "a.com", 80, "/")),
    ("ipv6_spellings", get("http://[::1]/", host="[0:0::1]:80"), ("GET", "http", "[::1]", 80, "/")),
    ("http10_without_host", head("GET http://a.com/ HTTP/1.0"), ("GET", "http", "a.com", 80, "/")),
    ("unknown_method", head("PURGE http://a.com/ HTTP/1.1", "Host: a.com"),
        ("PURGE", "http", "a.com", 80, "/")),
    ("lowercase_connect_is_not_connect", head("connect http://a.com/ HTTP/1.1", "Host: a.com"),
        ("connect", "http", "a.com", 80, "/")),
    ("underscore_name", get("http://my_host.lan/", host="my_host.lan"),
        ("GET", "http", "my_host.lan", 80, "/")),
    ("path_with_at_sign", get("http://a.com/@b.com/x"), ("GET", "http", "a.com", 80, "/@b.com/x")),
    ("path_with_backslash", get("http://a.com/x\\y"), ("GET", "http", "a.com", 80, "/x\\y")),
]  # fmt: skip


@pytest.mark.parametrize(
    ("untrusted", "expected"), [(h, e) for _, h, e in SERVED], ids=[n for n, _, _ in SERVED]
)
def test_honest_neighbour_is_served(
    untrusted: bytes, expected: tuple[str, str, str, int, str]
) -> None:
    request = parse_request_head(untrusted)
    assert (request.method, request.kind, request.host, request.port, request.path) == expected


def test_lowercase_get_is_a_token() -> None:
    assert parse_request_head(head("get http://a.com/ HTTP/1.1", "Host: a.com")).method == "get"


@pytest.mark.parametrize(
    ("untrusted", "expected"),
    [
        (get("http://a.com/"), BodyLength("none")),
        (post("Content-Length: 5"), BodyLength("length", 5)),
        (post("Content-Length: 0"), BodyLength("length", 0)),
        (post("content-length:  007 "), BodyLength("length", 7)),
        (post("Content-Length: 5", "Content-Length: 5"), BodyLength("length", 5)),
        (post("Content-Length: 5, 5"), BodyLength("length", 5)),
        (post("Transfer-Encoding: chunked"), BodyLength("chunked")),
        (post("transfer-encoding: Chunked"), BodyLength("chunked")),
        (connect("a.com:443"), BodyLength("none")),
        (connect("a.com:443", "Content-Length: 0"), BodyLength("none")),
    ],
)
def test_body_length(untrusted: bytes, expected: BodyLength) -> None:
    assert parse_request_head(untrusted).body_length() == expected


@pytest.mark.parametrize(
    ("untrusted", "keep_alive"),
    [
        (get("http://a.com/"), True),
        (get("http://a.com/", "Connection: keep-alive"), True),
        (get("http://a.com/", "Connection: close"), False),
        (get("http://a.com/", "Connection: X-Foo, Close"), False),
        (get("http://a.com/", "Connection: x-foo", "Connection: close"), False),
        (head("GET http://a.com/ HTTP/1.0"), False),
        (head("GET http://a.com/ HTTP/1.0", "Connection: keep-alive"), False),
        (connect("a.com:443"), False),
    ],
)
def test_keep_alive(untrusted: bytes, keep_alive: bool) -> None:
    assert parse_request_head(untrusted).keep_alive is keep_alive


def upstream_names(request: ProxyRequest) -> list[str]:
    return [name.lower() for name, _ in request.upstream_headers()]


def test_upstream_drops_proxy_authorization_and_every_proxy_header() -> None:
    request = parse_request_head(
        get(
            "http://a.com/",
            "Proxy-Authorization: Basic c2VjcmV0",
            "Proxy-Connection: keep-alive",
            "PROXY-X-Anything: 1",
            "proxy-authenticate: x",
            "Accept: */*",
        )
    )
    assert request.header_values("proxy-authorization") == ("Basic c2VjcmV0",)
    assert upstream_names(request) == ["host", "accept"]
    assert b"c2VjcmV0" not in format_upstream_head(request)


def test_upstream_drops_hop_by_hop_and_connection_named_headers() -> None:
    request = parse_request_head(
        get(
            "http://a.com/",
            "Connection: keep-alive, X-Secret, x-other",
            "X-Secret: 1",
            "X-Other: 2",
            "Keep-Alive: timeout=5",
            "TE: trailers",
            "Trailer: X-T",
            "Upgrade: websocket",
            "X-Kept: 3",
        )
    )
    assert request.upstream_headers() == (("Host", "a.com"), ("X-Kept", "3"))


def test_connection_cannot_strip_framing_or_host() -> None:
    request = parse_request_head(
        post("Connection: content-length, host, transfer-encoding", "Content-Length: 5")
    )
    assert request.upstream_headers() == (("Host", "a.com"), ("Content-Length", "5"))


def test_upstream_framing_is_derived_not_copied() -> None:
    chunked = parse_request_head(post("transfer-encoding: Chunked"))
    assert chunked.upstream_headers() == (("Host", "a.com"), ("Transfer-Encoding", "chunked"))
    repeated = parse_request_head(post("Content-Length: 5", "content-length: 5, 5"))
    assert repeated.upstream_headers() == (("Host", "a.com"), ("Content-Length", "5"))


def test_upstream_host_is_the_target() -> None:
    assert parse_request_head(get("http://a.com:8080/", host="A.COM:8080")).upstream_headers()[
        0
    ] == ("Host", "a.com:8080")
    http10 = parse_request_head(head("GET http://a.com/ HTTP/1.0"))
    assert http10.upstream_headers() == (("Host", "a.com"),)


def test_format_upstream_head_is_origin_form() -> None:
    request = parse_request_head(
        head(
            "POST http://a.com/x?y=1 HTTP/1.1",
            "Host: a.com",
            "User-Agent: curl/8",
            "Proxy-Authorization: Basic c2VjcmV0",
            "X-Latin: caf\xe9",
            "Content-Length: 3",
        )
    )
    assert format_upstream_head(request) == (
        b"POST /x?y=1 HTTP/1.1\r\n"
        b"Host: a.com\r\n"
        b"User-Agent: curl/8\r\n"
        b"X-Latin: caf\xe9\r\n"
        b"Content-Length: 3\r\n"
        b"Connection: keep-alive\r\n\r\n"
    )


def test_format_upstream_head_keeps_http10() -> None:
    request = parse_request_head(head("GET http://a.com/ HTTP/1.0"))
    assert format_upstream_head(request) == (
        b"GET / HTTP/1.0\r\nHost: a.com\r\nConnection: close\r\n\r\n"
    )


def test_a_connect_has_no_upstream_head() -> None:
    with pytest.raises(ValueError, match="tunnel"):
        format_upstream_head(parse_request_head(connect("a.com:443")))


def test_refusal_is_one_fixed_answer_but_the_rule_id() -> None:
    assert refusal_response("userinfo") == (
        b"HTTP/1.1 403 Forbidden\r\n"
        b"Content-Type: text/plain; charset=utf-8\r\n"
        b"Content-Length: 24\r\n"
        b"Connection: close\r\n\r\n"
        b"lnk: refused (userinfo)\n"
    )
    for rule in RULES:
        answer = refusal_response(rule)
        assert answer.startswith(b"HTTP/1.1 403 Forbidden\r\n")
        body = answer.split(b"\r\n\r\n", 1)[1]
        assert body == f"lnk: refused ({rule})\n".encode()
        assert f"Content-Length: {len(body)}\r\n".encode() in answer


@pytest.mark.parametrize("rule", ["", "Userinfo", "a b", "x\r\nSet-Cookie: y", "a" * 65])
def test_refusal_rejects_a_malformed_rule_id(rule: str) -> None:
    with pytest.raises(ValueError, match="rule id"):
        refusal_response(rule)


def test_find_head_end() -> None:
    assert find_head_end(b"GET http://a.com/ HTTP/1.1\r\nHost: a") is None
    assert find_head_end(b"CONNECT a:1 HTTP/1.1\r\n\r\nTLS") == 24
    assert find_head_end(b"x" * (MAX_HEAD_BYTES - 1)) is None
    with pytest.raises(RequestRefused) as caught:
        find_head_end(b"x" * MAX_HEAD_BYTES)
    assert caught.value.rule == "head-too-large"


def test_huge_head_is_refused_before_parsing() -> None:
    assert refused_rule(get("http://a.com/") + b"x" * MAX_HEAD_BYTES) == "head-too-large"


def test_cut_for_log_cuts_a_10kb_hostname() -> None:
    cut = cut_for_log("a" * 10_000)
    assert len(cut) == 300
    assert cut.endswith("…")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("evil.com\x1b[2J\x1b]0;title\x07", "evil.com[2J]0;title"),
        ("a\r\nb\tc\x00d\x7fe\x85f", "abcdef"),
        ("good.com\u202emoc.live", "good.commoc.live"),  # bidi override
        ("a\u2028b\u2029c", "abc"),  # line and paragraph separators
        ("GET http://a.com/ HTTP/1.1", "GET http://a.com/ HTTP/1.1"),
        ("caf\xe9 \u4e2d", "caf\xe9 \u4e2d"),
    ],
)
def test_cut_for_log_removes_control_characters(text: str, expected: str) -> None:
    assert cut_for_log(text) == expected


def test_cut_for_log_short_limits() -> None:
    assert cut_for_log("abcdef", limit=3) == "ab…"
    assert cut_for_log("abc", limit=3) == "abc"
    assert cut_for_log("abc", limit=0) == ""


@settings(max_examples=500)
@given(st.binary(max_size=400))
def test_random_bytes_are_parsed_or_refused(untrusted: bytes) -> None:
    for candidate in (untrusted, untrusted + b"\r\n\r\n"):
        try:
            parse_request_head(candidate)
        except RequestRefused as refusal:
            assert refusal.rule in RULES


PIECES = st.sampled_from(
    [b"GET", b"CONNECT", b"POST", b" ", b"http://", b"https://", b"a.com", b"[::1]", b":", b"443",
     b"/", b"?", b"#", b"@", b"\\", b"%", b"HTTP/1.1", b"HTTP/1.0", b"\r\n", b"\n", b"\r", b"\x00",
     b"Host", b"Content-Length", b"Transfer-Encoding", b"chunked", b"5", b",", b"Connection",
     b"Proxy-Authorization", b"close", b"\t", b"\xff", b"X-A"]
)  # fmt: skip


@settings(max_examples=1000)
@given(st.lists(PIECES, max_size=40))
def test_pieced_heads_are_parsed_safely_or_refused(pieces: list[bytes]) -> None:
    try:
        request = parse_request_head(b"".join(pieces) + b"\r\n\r\n")
    except RequestRefused as refusal:
        assert refusal.rule in RULES
        return
    for name, _ in request.upstream_headers():
        assert not name.lower().startswith("proxy-")
    if request.kind == "http":
        upstream = format_upstream_head(request)
        assert upstream.endswith(b"\r\n\r\n")
        assert upstream.count(b"\r\n\r\n") == 1
        assert b"\n" not in upstream.replace(b"\r\n", b"")
        assert b"\r" not in upstream.replace(b"\r\n", b"")
        assert b"\x00" not in upstream
