"""A listener's own state: its memos are its own (no sandbox's heads or verdicts time another's),
and a refusal's one answer reaches the sandbox, or nothing when it left."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

from lnk_proxy.conn import Conn
from lnk_proxy.http_request import refusal_response
from lnk_proxy.listeners import Listener, Refusal, send_refusal
from lnk_proxy.policy import ProxyGrants


def test_each_listener_has_its_own_memos() -> None:
    grants = ProxyGrants()
    with socket.socket(socket.AF_UNIX) as one, socket.socket(socket.AF_UNIX) as two:
        first = Listener("sbx-a", Path("/tmp/a.sock"), grants, "x", one)
        second = Listener("sbx-b", Path("/tmp/b.sock"), grants, "x", two)
        assert first.heads is not second.heads and first.memo is not second.memo
        assert first.pool is not second.pool and first.answers is not second.answers


def test_a_refusal_is_answered_once_and_a_gone_sandbox_gets_nothing() -> None:
    async def main() -> None:
        ours, theirs = socket.socketpair()
        with theirs:
            client = Conn(ours)
            await send_refusal(client, Refusal("not-listed", "why"), 5.0)
            theirs.setblocking(False)
            assert theirs.recv(4096) == refusal_response("not-listed")
        await send_refusal(client, Refusal("not-listed", "why"), 5.0)  # EPIPE: suppressed
        client.close()

    asyncio.run(main())
