"""`lnk_shared.handed_socket`: a handed socket whose sender kept a copy and made the shared file
blocking: every call that moves bytes returns at once, and waiting, binding, listening,
accepting and connecting are refused. (The proxy's loop beside such a socket:
tests/unit/lnk_proxy/test_conn_kept_copy.py.)"""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from kept_copy import kept_copy, make_blocking
from loop_stall import MAX_GAP_S

from lnk_shared import handed_sockets


@pytest.fixture(autouse=True)
def another_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    """The loopback pair is the test's own namespace: judged as another's, as a sandbox's is."""
    monkeypatch.setattr(handed_sockets, "own_netns_cookie", lambda: -1)


def test_a_handed_socket_refuses_to_wait_and_to_be_anything_but_read_and_written() -> None:
    with kept_copy() as (taken, _, _):
        with pytest.raises(ValueError, match="never waits"):
            taken.setblocking(True)
        with pytest.raises(ValueError, match="never waits"):
            taken.settimeout(1.0)
        with pytest.raises(ValueError, match="never waits"):
            taken.settimeout(None)
        taken.setblocking(False)
        taken.settimeout(0.0)
        for call in (
            lambda: taken.listen(1),
            taken.accept,
            lambda: taken.connect(("127.0.0.1", 9)),
            lambda: taken.connect_ex(("127.0.0.1", 9)),
            lambda: taken.bind(("127.0.0.1", 0)),
        ):
            with pytest.raises(OSError, match="only read and written"):
                call()


def test_every_byte_call_on_a_kept_copy_made_blocking_returns_at_once() -> None:
    """recv, recv_into, recvfrom, recvmsg with nothing to read; send, sendmsg, sendall into
    a full buffer: each raises BlockingIOError at once, never waiting BLOCKED_S."""
    with kept_copy() as (taken, kept, _):
        make_blocking(kept, taken)
        loop = asyncio.new_event_loop()
        try:
            buffer = bytearray(16)
            for call in (
                lambda: taken.recv(16),
                lambda: taken.recv_into(buffer),
                lambda: taken.recvfrom(16),
                lambda: taken.recvfrom_into(buffer),
                lambda: taken.recvmsg(16),
            ):
                started = loop.time()
                with pytest.raises(BlockingIOError):
                    call()
                assert loop.time() - started < MAX_GAP_S
            with contextlib.suppress(BlockingIOError):
                while True:
                    taken.send(b"a" * 65536)
            for call in (
                lambda: taken.send(b"a" * 65536),
                lambda: taken.sendmsg([b"a" * 65536]),
                lambda: taken.sendall(b"a" * 65536),
            ):
                started = loop.time()
                with pytest.raises(BlockingIOError):
                    call()
                assert loop.time() - started < MAX_GAP_S
        finally:
            loop.close()
