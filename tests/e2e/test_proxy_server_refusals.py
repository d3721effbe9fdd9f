"""The filtering proxy alone (`proxy_alone.py`, no sandbox), refusing: every refusal comes back as
the one 403 with its rule id AND leaves every host of the test internet (`net.py`) without a new
connection: targets off the grants, this machine, the metadata service and private addresses by
any spelling; malformed requests before any lookup; a rebinding name on every request; and
`[lan]` grants reaching only what they name."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from net import LOOP, META, MIXED, NAS, OTHER, PRIVATE, REBIND, WWW, TestInternet
from proxy_alone import MAIN, Proxy, alone_proxy, ask, connect_request, counts, get

pytestmark = [pytest.mark.needs_root, pytest.mark.e2e]


@pytest.fixture(scope="module")
def proxy(internet: TestInternet) -> Iterator[Proxy]:
    with alone_proxy(internet) as built:
        yield built


# -- refused ---------------------------------------------------------------------------------

REFUSALS: list[tuple[str, str, str]] = [
    # (test id, CONNECT authority or http:// URL with {www}/{nas}/{gateway} filled in, rule)
    ("unlisted_host", f"{OTHER}:443", "not-listed"),
    ("unlisted_lan_name", f"{NAS}:80", "not-listed"),
    ("public_ip_literal", "{www}:443", "literal-not-allowed"),
    ("public_ip_literal_http", "http://{www}/", "literal-not-allowed"),
    ("private_by_name", f"{PRIVATE}:443", "internet-not-public"),
    ("private_by_literal", "{nas}:80", "literal-not-allowed"),
    ("mixed_answer", f"{MIXED}:443", "internet-not-public"),
    ("loopback_by_name", f"{LOOP}:443", "never-loopback"),
    ("localhost", "localhost:443", "never-this-machine"),
    ("localhost_trailing_dot", "http://LOCALHOST./", "never-this-machine"),
    ("loopback_literal", "127.0.0.1:443", "never-loopback"),
    ("loopback_short", "127.1:443", "never-loopback"),
    ("loopback_hex", "http://0x7f000001/", "never-loopback"),
    ("loopback_decimal", "2130706433:80", "never-loopback"),
    ("loopback_octal", "0177.0.0.1:80", "never-loopback"),
    ("loopback_v6", "[::1]:443", "never-loopback"),
    ("loopback_v4_mapped", "[::ffff:127.0.0.1]:443", "never-loopback"),
    ("loopback_nat64", "[64:ff9b::7f00:1]:443", "never-loopback"),
    ("this_machine_zero", "0.0.0.0:443", "never-this-machine"),
    ("this_machines_gateway", "{gateway}:80", "literal-not-allowed"),
    ("metadata_by_name", f"{META}:80", "never-metadata"),
    ("metadata_literal", "169.254.169.254:80", "never-metadata"),
    ("metadata_google_name", "http://metadata.google.internal/", "never-metadata"),
    ("metadata_aws_v6", "[fd00:ec2::254]:80", "never-metadata"),
    ("metadata_alibaba", "100.100.100.200:80", "never-metadata"),
]


def refused_request(template: str, internet: TestInternet) -> bytes:
    filled = template.format(
        www=internet.www.address, nas=internet.nas.address, gateway=internet.public_gateway
    )
    if filled.startswith("http://"):
        host = filled.removeprefix("http://").split("/")[0]
        return f"GET {filled} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
    return connect_request(filled)


@pytest.mark.parametrize(
    ("template", "rule"), [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS]
)
def test_refused_targets_get_the_rule_and_no_connection(
    proxy: Proxy, internet: TestInternet, template: str, rule: str
) -> None:
    before = counts(internet)
    lines = len(proxy.log(MAIN))
    head, body = ask(proxy.socket_of(MAIN), refused_request(template, internet))
    assert head.startswith(b"HTTP/1.1 403 Forbidden")
    assert body == f"lnk: refused ({rule})\n".encode()
    assert counts(internet) == before
    new = proxy.log(MAIN, lines + 1)[lines:]  # a line of the test before may land here too
    (entry,) = [e for e in new if e["decision"] == "refused"]
    assert (entry["decision"], entry["rule"], entry["address"]) == ("refused", rule, "")
    assert entry["reason"]


@pytest.mark.parametrize(
    ("request_bytes", "rule"),
    [
        (f"GET / HTTP/1.1\r\nHost: {WWW}\r\n\r\n", "origin-form"),
        (f"GET https://{WWW}/ HTTP/1.1\r\nHost: {WWW}\r\n\r\n", "bad-scheme"),
        (f"CONNECT {WWW}:443/x HTTP/1.1\r\n\r\n", "connect-with-path"),
        (f"GET http://{WWW}/ HTTP/1.1\r\nHost: {OTHER}\r\n\r\n", "host-mismatch"),
        (f"CONNECT user@{WWW}:443 HTTP/1.1\r\n\r\n", "userinfo"),
        (
            f"POST http://{WWW}/ HTTP/1.1\r\nHost: {WWW}\r\nContent-Length: 3\r\n"
            "Transfer-Encoding: chunked\r\n\r\n",
            "ambiguous-framing",
        ),
    ],
    ids=["origin_form", "https_scheme", "connect_path", "host_mismatch", "userinfo", "cl_te"],
)
def test_malformed_requests_are_refused_before_any_lookup(
    proxy: Proxy, internet: TestInternet, request_bytes: str, rule: str
) -> None:
    before = counts(internet)
    head, body = ask(proxy.socket_of(MAIN), request_bytes.encode())
    assert head.startswith(b"HTTP/1.1 403") and body == f"lnk: refused ({rule})\n".encode()
    assert counts(internet) == before


def test_a_rebinding_name_is_judged_on_every_request(proxy: Proxy, internet: TestInternet) -> None:
    try:
        internet.rebind(private=False)
        _, body = ask(proxy.socket_of(MAIN), get(REBIND))
        assert body == f"{WWW}\n".encode()
        internet.rebind(private=True)
        before = counts(internet)
        _, body = ask(proxy.socket_of(MAIN), get(REBIND))
        assert body == b"lnk: refused (internet-not-public)\n"
        assert counts(internet) == before
    finally:
        internet.rebind(private=False)


# -- [lan] -----------------------------------------------------------------------------------


def test_lan_grants_reach_the_lan_host_by_name_and_address_only(
    proxy: Proxy, internet: TestInternet
) -> None:
    nas = internet.nas.address
    path = proxy.open("sbx-lan", lan=[NAS, nas])
    try:
        assert ask(path, get(NAS))[1] == f"{NAS}\n".encode()
        assert ask(path, get(nas))[1] == f"{NAS}\n".encode()
        before = counts(internet)
        for target, rule in ((WWW, "not-listed"), (PRIVATE, "not-listed")):
            assert ask(path, get(target))[1] == f"lnk: refused ({rule})\n".encode()
        assert counts(internet) == before
    finally:
        assert proxy.admin({"op": "close", "sandbox": "sbx-lan"}) == {"ok": True}


def test_lan_any_dials_a_name_only_at_a_private_address(
    proxy: Proxy, internet: TestInternet
) -> None:
    path = proxy.open("sbx-lan-any", lan_any=True)
    try:
        assert ask(path, get(PRIVATE))[1] == f"{NAS}\n".encode()  # answers the LAN host
        before = counts(internet)
        assert ask(path, get(WWW))[1] == b"lnk: refused (lan-not-private)\n"
        assert ask(path, get(MIXED))[1] == b"lnk: refused (lan-not-private)\n"
        assert counts(internet) == before
    finally:
        proxy.admin({"op": "close", "sandbox": "sbx-lan-any"})


def test_empty_grants_open_nothing(proxy: Proxy, internet: TestInternet) -> None:
    path = proxy.open("sbx-empty")
    try:
        before = counts(internet)
        assert ask(path, get(WWW))[1] == b"lnk: refused (not-listed)\n"
        assert ask(path, connect_request(f"{internet.nas.address}:80"))[1] == (
            b"lnk: refused (literal-not-allowed)\n"
        )
        assert counts(internet) == before
    finally:
        proxy.admin({"op": "close", "sandbox": "sbx-empty"})
