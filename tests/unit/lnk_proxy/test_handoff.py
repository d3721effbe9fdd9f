"""lnk_proxy.handoff: a unix connection's first read, with the descriptors it carries. An
ordinary client's bytes become the head's start (nothing else changes for it); a hand-off's
never reach the head parser; a refused one is the proxy's `Refusal` with the rule, and every
descriptor it carried is closed. (The judgement's tables: tests/unit/lnk_shared/
test_handed_sockets.py; real sandboxes and forged senders: tests/e2e/test_proxy_handoff.py.)"""

from __future__ import annotations

import array
import asyncio
import os
import socket

from lnk_proxy.conn import Conn
from lnk_proxy.handoff import first_read, take_handed
from lnk_proxy.listeners import Refusal
from lnk_shared.handed_sockets import HEADER

WAIT_S = 5.0
REQUEST = b"GET http://www.example/ HTTP/1.1\r\nHost: www.example\r\n\r\n"


def _send(sender: socket.socket, data: bytes, fds: list[int]) -> None:
    rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    sender.sendmsg([data], rights)


def test_an_ordinary_clients_first_bytes_are_the_start_of_its_head() -> None:
    async def run() -> None:
        far, near = socket.socketpair()
        with far:
            client = Conn(near)
            try:
                far.sendall(REQUEST)
                received = await asyncio.wait_for(first_read(client), WAIT_S)
                assert not received.is_handoff
                assert bytes(client.buffer) == REQUEST and client.received == len(REQUEST)
            finally:
                client.close()

    asyncio.run(run())


def test_the_first_read_waits_for_the_first_message() -> None:
    async def run() -> None:
        far, near = socket.socketpair()
        with far:
            client = Conn(near)
            try:
                reading = asyncio.ensure_future(first_read(client))
                await asyncio.sleep(0.05)
                assert not reading.done()
                with socket.socket() as carried:
                    _send(far, HEADER, [carried.fileno()])
                received = await asyncio.wait_for(reading, WAIT_S)
                assert received.is_handoff and len(received.fds) == 1
                assert not client.buffer  # never the head parser's
                received.close()
            finally:
                client.close()

    asyncio.run(run())


def test_a_request_sent_with_a_descriptor_is_refused_and_the_descriptor_closed() -> None:
    async def run() -> None:
        far, near = socket.socketpair()
        with far:
            client = Conn(near)
            try:
                with socket.socket() as carried:
                    _send(far, HEADER + REQUEST, [carried.fileno()])
                received = await asyncio.wait_for(first_read(client), WAIT_S)
                refused = take_handed(received)
                assert isinstance(refused, Refusal) and refused.rule == "handoff-bytes"
                assert not client.buffer
                for fd in received.fds:
                    try:
                        os.fstat(fd)
                    except OSError:
                        continue
                    raise AssertionError(f"descriptor {fd} left open")
            finally:
                client.close()

    asyncio.run(run())
