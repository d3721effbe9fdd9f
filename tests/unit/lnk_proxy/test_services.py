"""lnk_proxy.services: which requests to a service rule's host go upstream, the one head that
goes there (the secret at its template position only), and the secret scrubbed on the way back.
Each attack is a row: another spelling of a refused method, a path that decodes elsewhere, the
sandbox's own key in the token position or a header, a CONNECT past the rule."""

from __future__ import annotations

import random

import pytest

from lnk_proxy.http_request import ProxyRequest, RequestRefused, parse_request_head
from lnk_proxy.services import (
    SecretScrubber,
    judge_service,
    placeholder,
    refuse_connect,
    rule_for_host,
    upstream_head,
)
from lnk_shared.spec_services import TELEGRAM_HOST, ServiceRule

BOT = ServiceRule("telegram", TELEGRAM_HOST, "bot", ("getMe", "sendMessage", "getFile"))
API = ServiceRule("bearer", "api.example.com", "key", ("GET /v1/items", "POST /v1/jobs/*"))
SECRET = b"1234567890:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"
OWN_KEY = "987654321:BBHdqTcvCH1vGWJxfSeofSAs0K5PALDzzz"
P = placeholder(BOT)


def _request(target: str, *headers: str, method: str = "GET") -> ProxyRequest:
    host = target.split("/")[2] if "://" in target else target
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}", *headers, "", ""]
    return parse_request_head("\r\n".join(lines).encode("latin-1"))


def test_an_allowed_method_goes_upstream_with_the_secret_in_the_path_only() -> None:
    request = _request(f"http://api.telegram.org/bot{P}/sendMessage?chat_id=1", "X-Trace: 7")
    forward = judge_service(BOT, request)
    head = upstream_head(forward, SECRET)
    first = head.split(b"\r\n")[0]
    assert first == b"GET /bot" + SECRET + b"/sendMessage?chat_id=1 HTTP/1.1"
    assert head.count(SECRET) == 1
    assert b"Host: api.telegram.org\r\n" in head and b"X-Trace: 7\r\n" in head
    assert forward.logged_path == f"/bot{P}/sendMessage?chat_id=1"
    assert SECRET.decode() not in forward.logged_path


def test_the_method_is_compared_without_case() -> None:
    assert judge_service(BOT, _request(f"http://api.telegram.org/bot{P}/GETME"))


def test_a_file_download_needs_get_file() -> None:
    forward = judge_service(BOT, _request(f"http://api.telegram.org/file/bot{P}/photos/a.jpg"))
    assert upstream_head(forward, SECRET).startswith(
        b"GET /file/bot" + SECRET + b"/photos/a.jpg HTTP/1.1"
    )
    no_files = ServiceRule("telegram", TELEGRAM_HOST, "bot", ("getMe",))
    with pytest.raises(RequestRefused, match="getFile is not in the rule"):
        judge_service(no_files, _request(f"http://api.telegram.org/file/bot{P}/photos/a.jpg"))


@pytest.mark.parametrize(
    ("target", "rule"),
    [
        (f"/bot{P}/setWebhook", "service-never"),
        (f"/bot{P}/SETWEBHOOK", "service-never"),
        (f"/bot{P}/logOut", "service-never"),
        (f"/bot{P}/close", "service-never"),
        (f"/bot{P}/getUpdates", "service-method"),
        (f"/bot{P}/setWebho%6Fk", "service-path"),
        (f"/bot{P}/%73etWebhook", "service-path"),
        (f"/bot{P}/getMe/../setWebhook", "service-path"),
        (f"/bot{P}/./setWebhook", "service-path"),
        (f"/bot{P}//setWebhook", "service-path"),
        (f"/bot{P}/getMe/", "service-path"),
        (f"/bot{P}/getMe;x", "service-path"),
        (f"/bot{P}/sendMessage/extra", "service-path"),
        (f"/bot{OWN_KEY}/getMe", "service-own-key"),
        ("/bot/getMe", "service-own-key"),
        (f"/bot{P}x/getMe", "service-own-key"),
        ("/getMe", "service-path"),
    ],
)
def test_a_refused_telegram_request_names_its_rule(target: str, rule: str) -> None:
    with pytest.raises(RequestRefused) as raised:
        judge_service(BOT, _request(f"http://api.telegram.org{target}"))
    assert raised.value.rule == rule


@pytest.mark.parametrize(
    "header",
    [
        f"Authorization: Bearer {OWN_KEY}",
        f"Authorization: Bearer {P}",  # telegram takes no Authorization at all
        f"X-Api-Key: {OWN_KEY}",
        "Cookie: session=theirs",
        f"Proxy-Authorization: Basic {OWN_KEY}",
    ],
)
def test_a_telegram_request_carrying_a_key_of_its_own_is_refused(header: str) -> None:
    with pytest.raises(RequestRefused) as raised:
        judge_service(BOT, _request(f"http://api.telegram.org/bot{P}/getMe", header))
    assert raised.value.rule == "service-own-key"


def test_a_bearer_request_gets_the_rules_credential_and_no_other() -> None:
    request = _request(
        "http://api.example.com/v1/items?page=2", f"Authorization: Bearer {placeholder(API)}"
    )
    head = upstream_head(judge_service(API, request), SECRET)
    assert head.startswith(b"GET /v1/items?page=2 HTTP/1.1\r\nHost: api.example.com\r\n")
    assert head.count(b"Authorization") == 1
    assert b"Authorization: Bearer " + SECRET + b"\r\n" in head
    assert placeholder(API).encode() not in head


@pytest.mark.parametrize(
    ("method", "path", "headers", "rule"),
    [
        ("GET", "/v1/items", (f"Authorization: Bearer {OWN_KEY}",), "service-own-key"),
        ("GET", "/v1/items", (f"x-api-key: {OWN_KEY}",), "service-own-key"),
        ("POST", "/v1/items", (), "service-route"),
        ("GET", "/v1/items/1", (), "service-route"),
        ("GET", "/v1/admin", (), "service-route"),
        ("POST", "/v1/jobs", (), "service-route"),
        ("POST", "/v1/jobs/%2e%2e/admin", (), "service-path"),
        ("POST", "/v1/jobs/../admin", (), "service-path"),
    ],
)
def test_a_refused_bearer_request_names_its_rule(
    method: str, path: str, headers: tuple[str, ...], rule: str
) -> None:
    with pytest.raises(RequestRefused) as raised:
        judge_service(API, _request(f"http://api.example.com{path}", *headers, method=method))
    assert raised.value.rule == rule


def test_a_prefix_rule_allows_what_is_below_it() -> None:
    assert judge_service(API, _request("http://api.example.com/v1/jobs/7/run", method="POST"))


@pytest.mark.parametrize("host", ["api.telegram.org", "API.Telegram.org.", "api.telegram.org"])
def test_a_connect_to_a_rule_host_is_refused_with_the_plain_http_way(host: str) -> None:
    request = _request(f"{host}:443", method="CONNECT")
    with pytest.raises(RequestRefused) as raised:
        refuse_connect([BOT, API], request)
    assert raised.value.rule == "service-plain-http-only"
    assert "http://api.telegram.org/" in raised.value.reason


def test_a_connect_elsewhere_is_the_policys_to_judge() -> None:
    refuse_connect([BOT], _request("pypi.org:443", method="CONNECT"))
    assert rule_for_host([BOT], "pypi.org") is None


def test_a_rule_host_on_another_port_is_refused() -> None:
    with pytest.raises(RequestRefused, match="http:80"):
        judge_service(BOT, _request(f"http://api.telegram.org:8443/bot{P}/getMe"))


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64])
def test_the_secret_is_scrubbed_across_every_chunk_boundary(size: int) -> None:
    body = (
        b'{"url":"https://x/file/bot'
        + SECRET
        + b'/a","again":"'
        + SECRET.replace(b":", b"%3A")
        + b'"}'
    )
    scrubber = SecretScrubber(SECRET, P.encode())
    out = b"".join(scrubber.feed(body[i : i + size]) for i in range(0, len(body), size))
    out += scrubber.flush()
    assert SECRET not in out and SECRET.replace(b":", b"%3A") not in out
    assert out.count(P.encode()) == 2
    assert out.startswith(b'{"url":"https://x/file/bot') and out.endswith(b'"}')


def test_a_chunk_ending_in_nothing_like_the_secret_is_sent_whole() -> None:
    """A streamed event (SSE's blank line at its end) is never held behind the next chunk."""
    scrubber = SecretScrubber(SECRET, P.encode())
    event = b'event: delta\ndata: {"text":"hi"}\n\n'
    assert scrubber.feed(event) == event
    # Only an end that could begin the secret waits for what follows.
    assert scrubber.feed(b"data: " + SECRET[:5]) == b"data: "
    assert scrubber.feed(SECRET[5:] + b"\n\n") == P.encode() + b"\n\n"
    assert scrubber.flush() == b""


def _held_back_by_every_length(forms: list[bytes], keep: int, data: bytes) -> int:
    """The scrubber's first way of finding what it holds back: every end's length, longest
    first, against every form (kept here as the reference the fast way must agree with)."""
    for size in range(min(keep, len(data)), 0, -1):
        if any(form.startswith(data[-size:]) for form in forms):
            return size
    return 0


@pytest.mark.parametrize("seed", range(4))
def test_what_is_held_back_is_the_longest_end_that_could_begin_the_secret(seed: int) -> None:
    """The `find`-based search holds back exactly what trying every length did, over secrets
    with colons (three forms of unequal length) and data made of the secret's own bytes."""
    rng = random.Random(seed)
    for _ in range(500):
        secret = bytes(rng.choice(b"ab:%3A") for _ in range(rng.randint(1, 12)))
        if secret.startswith(b":"):
            secret = b"a" + secret
        scrubber = SecretScrubber(secret, b"<gone>")
        data = bytes(rng.choice(b"ab:%3Ax") for _ in range(rng.randint(0, 30)))
        forms, keep = scrubber._forms, scrubber._keep
        assert scrubber._partial(data) == _held_back_by_every_length(forms, keep, data)


def test_a_long_secret_is_searched_for_only_where_its_first_byte_is() -> None:
    """The longest key a secret may be (4 KiB) costs a chunk a few `find`s, not 4,095 slices:
    an end that begins it is still held back whole, an end that does not is sent."""
    secret = b"k" * 4000 + b":" + b"z" * 95
    scrubber = SecretScrubber(secret, b"<gone>")
    assert scrubber.feed(b"data: x\n\n" + secret[:3000]) == b"data: x\n\n"
    assert scrubber.feed(secret[3000:]) == b"<gone>"
    assert scrubber.flush() == b""
    assert scrubber.feed(b"k" * 50 + b"y") == b"k" * 50 + b"y"


@pytest.mark.parametrize("rule", [BOT, API])
def test_the_answer_is_asked_for_uncompressed_whatever_the_client_accepts(
    rule: ServiceRule,
) -> None:
    """A gzipped answer would carry an echoed secret past the scrubber, which reads bytes."""
    target = (
        f"http://api.telegram.org/bot{P}/getMe"
        if rule is BOT
        else "http://api.example.com/v1/items"
    )
    auth = () if rule is BOT else (f"Authorization: Bearer {placeholder(API)}",)
    request = _request(target, "Accept-Encoding: gzip, br", "accept-encoding: deflate", *auth)
    head = upstream_head(judge_service(rule, request), SECRET).lower()
    assert head.count(b"accept-encoding") == 1
    assert b"accept-encoding: identity\r\n" in head
