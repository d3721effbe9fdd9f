"""A stand-in for `lnk_proxy.server.ProxyServer` as the coroutine path's modules see it
(`connections`, `one_request`, `rule_exchange`): the real config and listeners, a decider
whose verdicts a test sets, and the refusals and wire lines recorded instead of written."""

from __future__ import annotations

import socket
from pathlib import Path

from lnk_proxy.config import ProxyConfig
from lnk_proxy.conn import Conn
from lnk_proxy.listeners import Exchange, Listener, Refusal, send_refusal
from lnk_proxy.policy import Allowed, ProxyGrants
from lnk_proxy.tunnel_buffers import PLAIN
from lnk_proxy.wire_log import WireEntry


class FakeDecider:
    """Every gate and verdict is `verdict` (a refusal, or None to pass the gate); `asked`
    counts the decisions that reached it."""

    def __init__(self, verdict: Refusal | None = None) -> None:
        self.verdict, self.asked = verdict, 0

    def gate(self, listener: Listener) -> Refusal | None:
        del listener
        self.asked += 1
        return self.verdict

    async def decide(self, *args: object) -> Allowed | Refusal:
        del args
        self.asked += 1
        assert self.verdict is not None, "a test that lets a request through sets no fake"
        return self.verdict

    async def decide_model(self, *args: object) -> Allowed | Refusal:
        return await self.decide(*args)


class FakeWireLog:
    def __init__(self) -> None:
        self.entries: list[WireEntry] = []

    def write(self, entry: WireEntry) -> None:
        self.entries.append(entry)


class FakeHost:
    def __init__(self, base: Path, verdict: Refusal | None = None, **settings: object) -> None:
        self.config = ProxyConfig(run_dir=base / "run", state_dir=base / "state", **settings)  # type: ignore[arg-type]
        self.decider = FakeDecider(verdict)
        self.wire_log = FakeWireLog()
        self.descriptor_limit = 1 << 20
        self.service_tls = None
        self.hosted_buffers = PLAIN
        self.refused: list[tuple[str, str, Refusal]] = []
        self.allowed: list[tuple[Exchange, str]] = []

    async def refuse(
        self, listener: Listener, client: Conn, method: str, target: str, refusal: Refusal
    ) -> None:
        del listener
        self.refused.append((method, target, refusal))
        await send_refusal(client, refusal, 5.0)

    def log_allowed(self, exchange: Exchange, error: str) -> None:
        self.allowed.append((exchange, error))


def listener_at(base: Path, sock: socket.socket | None = None) -> Listener:
    """A sandbox's listener state around `sock` (an unbound one when None)."""
    sock = sock or socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    return Listener("sbx-a", base / "a.sock", ProxyGrants(), "x" * 40, sock)
