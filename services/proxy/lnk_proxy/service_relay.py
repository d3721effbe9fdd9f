"""A sandbox's service rules at work: the rules and their secrets' values as the controller
handed them over, and the one exchange of a judged request with the rule's host over TLS.

`ServiceGrant` holds one sandbox's `[[services]]` rules and, for each secret a rule names, its
value: in this process's memory only (never logged, never in an error, never in `repr`),
replaced when the controller says a secret changed or was removed (`replace_secrets`), and
dropped with the listener. A rule whose secret is absent refuses (`service-secret-gone`): fail
closed, never a request sent on without its credential or with the sandbox's.

`relay` sends `services.upstream_head` (the secret at its template position only) and the
request's body, re-framed, over a TLS connection dialed at the address the policy vetted, with
SNI and certificate checked against the rule's host (`tls_context`: the system's roots, or the
test CA of `unsafe_service_ca`), and streams the answer back close-delimited with the secret
scrubbed (`services.SecretScrubber`) from its head and body. The upstream connection is never
pooled nor kept: one request, one connection, `Connection: close` both ways.

Security limitations: this does NOT look at bodies either way (beyond scrubbing the secret from
answers), follow redirects (a 3xx goes to the sandbox as it came, scrubbed), bound an answer's
size or total time (only each read's and write's idle time), or stop the service itself from
doing with the owner's credential whatever the allowed routes do.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Mapping, Sequence
from pathlib import Path

from lnk_proxy.admin_rules import parse_rules
from lnk_proxy.answer_stream import stream_answer
from lnk_proxy.conn import Conn, dial
from lnk_proxy.forward import MAX_CHUNK_LINE, parse_chunk_size
from lnk_proxy.http_request import ProxyRequest, RequestRefused
from lnk_proxy.policy import ProxyGrants
from lnk_proxy.policy_memo import PolicyMemo
from lnk_proxy.services import (
    ServiceForward,
    judge_service,
    placeholder,
    refuse_connect,
    rule_for_host,
    upstream_head,
)
from lnk_proxy.upstream_tls import UpstreamTls
from lnk_shared.addresses import IPAddress
from lnk_shared.errors import UsageError
from lnk_shared.hosts import parse_host_pattern
from lnk_shared.secret_names import check_secret_name, check_secret_value
from lnk_shared.spec import MAX_ENTRIES
from lnk_shared.spec_services import ServiceRule, parse_service_table

__all__ = [
    "HTTPS_PORT",
    "ServiceGrant",
    "parse_service_secrets",
    "parse_services",
    "relay",
    "scrub_text",
    "tls_context",
]

log = logging.getLogger(__name__)

HTTPS_PORT = 443  # a rule's host is spoken to over TLS on its usual port


class ServiceGrant:
    """One sandbox's service rules and the values of the secrets they name (memory only)."""

    def __init__(
        self,
        rules: Sequence[ServiceRule] = (),
        secrets: Mapping[str, bytes] | None = None,
        *,
        also_names: Sequence[str] = (),
    ) -> None:
        self.rules = tuple(rules)
        # Secrets other rules of the sandbox name (`[[models]]` keys): kept and replaced here too.
        self.also_names = frozenset(also_names)
        self._secrets: dict[str, bytes] = {}
        # The rule hosts, judged for their addresses as an [internet] grant of exactly them
        # would be: the relay dials only an address the policy vetted (never this machine).
        hosts = tuple(parse_host_pattern(r.host, allow_port=False) for r in self.rules)
        self.memo = PolicyMemo(ProxyGrants(internet=hosts))
        self.replace_secrets(dict(secrets or {}))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ServiceGrant):
            return NotImplemented
        return self.rules == other.rules and self._secrets == other._secrets

    __hash__ = None  # type: ignore[assignment]  # its secrets change: never a dict key

    def __repr__(self) -> str:  # never the values
        return f"ServiceGrant(rules={len(self.rules)}, secrets={sorted(self._secrets)})"

    def replace_secrets(self, secrets: Mapping[str, bytes]) -> None:
        """The controller's current values: a name left out is removed (its rule refuses)."""
        names = {r.secret for r in self.rules} | self.also_names
        unknown = set(secrets) - names
        if unknown:
            raise ValueError(f"service_secrets names no rule's secret: {sorted(unknown)}")
        self._secrets = dict(secrets)

    def secret(self, name: str) -> bytes | None:
        """The value of the secret `name` now (None: removed, or never given)."""
        return self._secrets.get(name)

    def rule_for(self, request: ProxyRequest) -> ServiceRule | None:
        """The rule whose host the request names, or None (then it is an ordinary request)."""
        if not self.rules:
            return None
        return rule_for_host(self.rules, request.host)

    def judge(
        self, rule: ServiceRule, request: ProxyRequest, *, check_route: bool = True
    ) -> tuple[ServiceForward, bytes]:
        """The judged forward and the secret to put in it; RequestRefused naming why not."""
        refuse_connect(self.rules, request)
        forward = judge_service(rule, request, check_route=check_route)
        secret = self._secrets.get(rule.secret)
        if secret is None:
            raise RequestRefused(
                "service-secret-gone",
                f"the secret {rule.secret} is not set (removed while the sandbox runs, or "
                f"never): its owner sets it with `lnk secret set {rule.secret}`",
            )
        return forward, secret


def parse_services(untrusted: object) -> tuple[ServiceRule, ...]:
    """The rules of an admin command, each read by the spec model's own rules."""
    return parse_rules(
        untrusted, "services", parse_service_table, lambda r: r.host, "two rules for one host"
    )


def parse_service_secrets(
    untrusted: object, rules: Sequence[ServiceRule] | None, also_names: Sequence[str] = ()
) -> dict[str, bytes]:
    """`{name: value}` for the rules' secrets (any secret's name when `rules` is None: the
    listener checks them). The errors name a secret, never its value."""
    if not isinstance(untrusted, dict) or len(untrusted) > MAX_ENTRIES:
        raise ValueError("service_secrets must be an object of secret names to values")
    values = {}
    for name, value in untrusted.items():
        try:
            check_secret_name(name)
        except (TypeError, UsageError):
            raise ValueError("service_secrets: a key is not a secret's name") from None
        if rules is not None and name not in {r.secret for r in rules} | set(also_names):
            raise ValueError(f"service_secrets.{name}: no rule of this sandbox uses it")
        if not isinstance(value, str):
            raise ValueError(f"service_secrets.{name}: expected a string")
        try:
            values[name] = check_secret_value(value.encode("ascii"))
        except (UnicodeEncodeError, UsageError):
            raise ValueError(f"service_secrets.{name}: not a secret's shape") from None
    return values


def tls_context(ca_file: Path | None) -> ssl.SSLContext:
    """Full verification (chain and name) against the system's roots, or only `ca_file`."""
    context = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


async def relay(
    forward: ServiceForward,
    secret: bytes,
    request: ProxyRequest,
    client: Conn,
    address: IPAddress,
    *,
    context: ssl.SSLContext,
    connect_timeout_s: float,
    io_timeout_s: float,
    port: int = HTTPS_PORT,
) -> None:
    """One exchange with the rule's host at the vetted `address`; the answer, scrubbed, goes to
    `client` close-delimited. OSError, TimeoutError, ssl.SSLError, BadResponse or
    RequestRefused (a body the client framed badly) when it cannot be completed; their texts
    never hold the secret (`scrub_text` is applied by the caller's log line)."""
    host = forward.rule.host
    sock = await dial(address, port, connect_timeout_s)
    upstream = await UpstreamTls.open(sock, context, host, connect_timeout_s)
    upstream.conn.timeout = io_timeout_s  # each wait's idle bound, reads and writes alike
    try:
        framing: tuple[tuple[str, str], ...] = ()
        if request.framing.kind == "length":
            framing = (("Content-Length", str(request.framing.length)),)
        elif request.framing.kind == "chunked":
            framing = (("Transfer-Encoding", "chunked"),)
        await upstream.write(upstream_head(forward, secret, framing))
        await _send_body(request, client, upstream)
        replacement = placeholder(forward.rule).encode()
        await stream_answer(request, upstream, client, (secret, replacement), None)
    finally:
        upstream.close()


async def _send_body(request: ProxyRequest, client: Conn, upstream: UpstreamTls) -> None:
    """The client's body as it framed it, to the upstream in the same framing."""
    framing = request.framing
    if framing.kind == "length" and framing.length:
        await _copy(client, upstream, framing.length)
    elif framing.kind == "chunked":
        while True:
            size = parse_chunk_size(await client.read_line(MAX_CHUNK_LINE))
            if size == 0:
                while await client.read_line(MAX_CHUNK_LINE) != b"\r\n":
                    pass  # trailers: read and dropped
                await upstream.write(b"0\r\n\r\n")
                break
            await upstream.write(b"%x\r\n" % size)
            await _copy(client, upstream, size)
            if await client.read_exact(2) != b"\r\n":
                raise RequestRefused("bad-chunk", "a chunk not followed by CRLF")
            await upstream.write(b"\r\n")


async def _copy(client: Conn, upstream: UpstreamTls, count: int) -> None:
    while count:
        if not client.buffer and not await client.recv_some():
            raise EOFError("the client's body ended early")
        part = bytes(client.buffer[:count])
        del client.buffer[: len(part)]
        count -= len(part)
        await upstream.write(part)


def scrub_text(text: str, secret: bytes) -> str:
    """An error's text with the secret (should an exception ever carry it) replaced."""
    value = secret.decode("ascii")
    return text.replace(value, "<secret>") if value and value in text else text
