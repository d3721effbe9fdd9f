"""The API socket's uvicorn server, awake only when there is work.

uvicorn's `Server.main_loop` wakes ten times a second (`asyncio.sleep(0.1)`, then `on_tick`)
to see whether it should exit, to renew the `Date` header once a second, to call a gunicorn
worker's `callback_notify` and to check `limit_max_requests`: at rest that was most of the
controller's CPU (bench/README.md, "The controller at rest"). Here each of those happens when
its cause does, and the loop otherwise sleeps in the kernel:

- `should_exit`, set by uvicorn's own SIGTERM/SIGINT handler (`handle_exit`) or by anyone who
  stops the server, wakes the main loop through `call_soon_threadsafe` (a signal handler runs
  between bytecodes of the main thread; the self-pipe's byte wakes the loop's epoll, which
  otherwise sleeps with no timeout).
- The `Date` header is computed when a response reads the default headers (`_DatedState`):
  the second it is sent, not the last tick's.
- `limit_max_requests` is checked as each request is counted (`total_requests`).
- `callback_notify` is a heartbeat, which needs a timer: with one configured, uvicorn's own
  ticking loop runs (the controller configures none).

Does NOT: change how uvicorn shuts down once asked (its `shutdown`, with its own 0.1 s steps
while connections close, is unchanged).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from email.utils import formatdate

import uvicorn
from uvicorn.server import ServerState

__all__ = ["RestingServer"]

log = logging.getLogger("uvicorn.error")  # where uvicorn says its own limit was reached


class _DatedState(ServerState):
    """The server's shared state, its default headers made when read: the `Date` of the
    current second (cached for that second) and the config's own headers."""

    def __init__(self, config: uvicorn.Config, on_request: Callable[[int], None]) -> None:
        self._config = config
        self._on_request = on_request
        self._second = -1
        self._headers: list[tuple[bytes, bytes]] = []
        self._requests = 0
        super().__init__()

    @property
    def default_headers(self) -> list[tuple[bytes, bytes]]:
        now = time.time()
        if int(now) != self._second:
            self._second = int(now)
            dated = [(b"date", formatdate(now, usegmt=True).encode())]
            self._headers = (dated if self._config.date_header else []) + list(
                self._config.encoded_headers
            )
        return self._headers

    @default_headers.setter
    def default_headers(self, _value: list[tuple[bytes, bytes]]) -> None:
        self._second = -1  # uvicorn's own assignment (at start): made again when next read

    @property
    def total_requests(self) -> int:
        return self._requests

    @total_requests.setter
    def total_requests(self, value: int) -> None:
        self._requests = value
        self._on_request(value)


class RestingServer(uvicorn.Server):
    """uvicorn's server, its main loop one wait for `should_exit` (or the request limit)."""

    def __init__(self, config: uvicorn.Config) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._exit = asyncio.Event()  # made again by each main_loop, in its own loop
        self._should_exit = False
        super().__init__(config)
        self.server_state = _DatedState(config, self._counted)

    @property
    def should_exit(self) -> bool:
        return self._should_exit

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        self._should_exit = value
        if value:
            self._wake()

    def _counted(self, total: int) -> None:
        """A request counted: past uvicorn's `limit_max_requests` (with its jitter), stop."""
        limit = self.limit_max_requests
        if limit is not None and total >= limit and not self._exit.is_set():
            log.info("Maximum request limit of %d exceeded. Terminating process.", limit)
            self._wake()

    def _wake(self) -> None:
        loop = self._loop
        if loop is None:  # not serving yet: main_loop sees should_exit when it starts
            return
        with contextlib.suppress(RuntimeError):  # a closed loop: the server has ended already
            loop.call_soon_threadsafe(self._exit.set)

    async def main_loop(self) -> None:
        if self.config.callback_notify is not None:  # a heartbeat needs uvicorn's timer
            await super().main_loop()
            return
        self._exit = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        try:
            limit = self.limit_max_requests
            if self.should_exit or (
                limit is not None and self.server_state.total_requests >= limit
            ):
                return
            await self._exit.wait()
        finally:
            self._loop = None
