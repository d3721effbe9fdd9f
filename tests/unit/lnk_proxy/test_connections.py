"""A sandbox connection accepted (`connections.accept_forever`) with a stand-in server: past
the sandbox's connection cap, or with the proxy's descriptors taken and this sandbox's share
in use, a new connection gets its refusal and one wire line at once, and is never served."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from proxy_fake_host import FakeHost, listener_at

from lnk_proxy.conn import bind_listener
from lnk_proxy.connections import accept_forever, cancel_all, spawn
from lnk_proxy.http_request import refusal_response
from lnk_proxy.listeners import Listener


@pytest.fixture
def base() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="lnkconn", dir="/tmp"))  # unix socket paths are short
    yield path
    shutil.rmtree(path, ignore_errors=True)


def answer_to_one_more(host: FakeHost, base: Path, others: dict[str, Listener], held: int) -> bytes:
    """What a new connection gets while `held` connections of this sandbox are open."""

    async def run() -> bytes:
        listener = listener_at(base, bind_listener(base / "a.sock", 0o600))
        listeners = {**others, listener.sandbox: listener}
        for _ in range(held):  # open connections, as the accept loop counts them
            listener.connections.add(asyncio.create_task(asyncio.sleep(60)))
        spawn(listener.background, accept_forever(host, listener, listeners, None))
        reader, writer = await asyncio.open_unix_connection(str(base / "a.sock"))
        try:
            writer.write_eof()  # no request: a served connection ends with no answer
            return await asyncio.wait_for(reader.read(), 5)
        finally:
            writer.close()
            await writer.wait_closed()
            await cancel_all(listener)
            listener.sock.close()

    return asyncio.run(run())


def test_a_connection_past_the_sandbox_cap_is_refused_and_logged(base: Path) -> None:
    host = FakeHost(base, max_connections_per_sandbox=2)
    answer = answer_to_one_more(host, base, {}, held=2)
    assert answer == refusal_response("too-many-connections")
    assert [(e.sandbox, e.rule, e.reason) for e in host.wire_log.entries] == [
        ("sbx-a", "too-many-connections", "2 already open")
    ]


def test_a_connection_past_the_descriptors_is_refused_when_its_share_is_in_use(
    base: Path,
) -> None:
    host = FakeHost(base)
    host.descriptor_limit = 8  # 4 connections at 2 descriptors each: a share of 2 for 2 sandboxes
    other = listener_at(base)
    other.sandbox = "sbx-b"
    for _ in range(2):
        other.connections.add(object())  # type: ignore[arg-type]
    try:
        answer = answer_to_one_more(host, base, {"sbx-b": other}, held=2)
    finally:
        other.sock.close()
    assert answer == refusal_response("too-many-descriptors")
    assert [e.rule for e in host.wire_log.entries] == ["too-many-descriptors"]


def test_a_connection_under_the_caps_is_served(base: Path) -> None:
    host = FakeHost(base)
    answer = answer_to_one_more(host, base, {}, held=0)  # its empty head: closed, no answer
    assert answer == b""
    assert host.wire_log.entries == []


def test_cancel_all_ends_the_listeners_tasks(base: Path) -> None:
    async def run() -> list[bool]:
        listener = listener_at(base)
        spawn(listener.connections, asyncio.sleep(60))
        spawn(listener.background, asyncio.sleep(60))
        tasks = [*listener.connections, *listener.background]
        await cancel_all(listener)
        listener.sock.close()
        return [task.cancelled() for task in tasks]

    assert asyncio.run(run()) == [True, True]
