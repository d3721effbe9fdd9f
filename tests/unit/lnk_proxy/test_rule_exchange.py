"""A request to a rule (`rule_exchange`) with a stand-in server: a model rule's CONNECT while
the sandbox is paused gets the refusal alone (never its 200 first), and a hosted rule's request
past the sandbox's buffer budget is refused before its body is read or a decision asked."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

from proxy_fake_host import FakeHost, listener_at

from lnk_proxy.conn import Conn
from lnk_proxy.http_request import parse_request_head, refusal_response
from lnk_proxy.listeners import Refusal
from lnk_proxy.model_relay import ModelGrant
from lnk_proxy.rule_exchange import hosted_exchange, model_exchange
from lnk_shared.spec import Origin
from lnk_shared.spec_models import parse_model_table

ORIGIN = Origin("t", "models")
OLLAMA = parse_model_table(
    {"kind": "ollama", "models": ["llama3.2:3b"], "upstream": "http://127.0.0.1:1"}, ORIGIN
)
CLAUDE = parse_model_table({"kind": "anthropic", "models": ["claude-x"], "secret": "c"}, ORIGIN)
PAUSED = Refusal("paused", "the sandbox's pause flag is set")


def test_a_paused_sandboxs_model_connect_gets_no_200(tmp_path: Path) -> None:
    host = FakeHost(tmp_path, verdict=PAUSED)
    head = f"CONNECT localhost:{OLLAMA.port} HTTP/1.1\r\nHost: localhost:{OLLAMA.port}\r\n\r\n"
    request = parse_request_head(head.encode())

    async def run() -> bytes:
        ours, theirs = socket.socketpair()
        listener = listener_at(tmp_path)
        listener.models = ModelGrant([OLLAMA])
        assert listener.models.rule_for(request) is OLLAMA
        try:
            client = Conn(ours)
            assert not await model_exchange(host, listener, client, request, "t", consumed=0)
            ours.close()
            theirs.settimeout(5)
            return b"".join(iter(lambda: theirs.recv(65536), b""))
        finally:
            ours.close()
            theirs.close()
            listener.sock.close()

    assert asyncio.run(run()) == refusal_response("paused")
    assert [r for _, _, r in host.refused] == [PAUSED]


def test_a_hosted_request_past_the_budget_is_refused_before_its_body(tmp_path: Path) -> None:
    host = FakeHost(tmp_path)
    body = b'{"model": "claude-x"}'
    head = (
        b"POST http://api.anthropic.com/v1/messages HTTP/1.1\r\nHost: api.anthropic.com\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    )
    request = parse_request_head(head)

    async def run() -> tuple[bytes, int]:
        ours, theirs = socket.socketpair()
        listener = listener_at(tmp_path)
        listener.buffers = host.config.tunnel_buffer_budget_bytes  # the budget all taken
        # no body sent: an exchange that read it before its budget would wait here
        try:
            client = Conn(ours)
            exchange = hosted_exchange(
                host, listener, client, request, "t", consumed=0, rule=CLAUDE
            )
            kept = await asyncio.wait_for(exchange, 5)
            assert not kept
            ours.close()
            theirs.settimeout(5)
            return b"".join(iter(lambda: theirs.recv(65536), b"")), client.received
        finally:
            ours.close()
            theirs.close()
            listener.sock.close()

    answer, received = asyncio.run(run())
    assert answer == refusal_response("too-much-buffer")
    assert received == 0  # its body never waited for
    assert host.decider.asked == 0
