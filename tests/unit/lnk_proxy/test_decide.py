"""The order of a decision's checks (`decide.Decider`), with no sockets: the wire log's room
before the flags, the flags before any judging, a lookup's slot before its await; and no
verdict on an address before this machine is known."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lnk_proxy.decide import Decider
from lnk_proxy.http_request import parse_request_head
from lnk_proxy.limits import MAX_WAITING_LOOKUPS
from lnk_proxy.listeners import Listener, Refusal
from lnk_proxy.policy import ProxyGrants
from lnk_shared.addresses import IPAddress

PAUSED = Refusal("paused", "the sandbox's pause flag is set")


class FakeLog:
    def __init__(self, room: bool) -> None:
        self.room = room

    def can_admit(self, sandbox: str) -> bool:
        del sandbox
        return self.room


class FakeWatches:
    def __init__(self, flag: Refusal | None) -> None:
        self.flag, self.looks, self.machine = flag, 0, None

    def flags(self, listener: Listener) -> Refusal | None:
        del listener
        self.looks += 1
        return self.flag

    def take_events(self) -> None:
        pass


class CountingResolver:
    caches_answers = False

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def resolve(self, name: str) -> tuple[IPAddress, ...]:
        self.asked.append(name)
        return (ipaddress.ip_address("93.184.216.34"),)


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[Listener]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    grants = ProxyGrants(internet_any=True)
    listener = Listener("sbx-a", tmp_path / "a.sock", grants, "x" * 40, sock)
    listener.resolver = CountingResolver()
    yield listener
    sock.close()


def decider(room: bool = True, flag: Refusal | None = None) -> tuple[Decider, FakeWatches]:
    watches = FakeWatches(flag)
    fakes: Any = (FakeLog(room), watches)
    return Decider(fakes[0], fakes[1], None), watches


def request(target: bytes) -> Any:
    host = target.partition(b"/")[0].partition(b":")[0]
    return parse_request_head(b"GET http://" + target + b" HTTP/1.1\r\nHost: " + host + b"\r\n\r\n")


def test_a_full_wire_log_refuses_before_the_flags_are_read(listener: Listener) -> None:
    judge, watches = decider(room=False, flag=PAUSED)
    refusal = judge.gate(listener)
    assert isinstance(refusal, Refusal)
    assert refusal.rule == "log-full"
    assert watches.looks == 0


def test_a_set_flag_refuses_before_the_host_is_judged(listener: Listener) -> None:
    judge, _ = decider(flag=PAUSED)
    verdict = judge.decide_now(listener, request(b"a.example/"), listener.memo, 80)
    assert verdict == PAUSED


def test_an_address_is_never_judged_before_the_machine_is_known(listener: Listener) -> None:
    judge, _ = decider()
    with pytest.raises(RuntimeError, match=r"start\(\) was not called"):
        asyncio.run(judge.decide(listener, request(b"a.example/")))
    assert listener.lookups == 0  # its slot given back


def test_a_lookup_past_the_sandbox_cap_is_refused_before_it_is_asked(listener: Listener) -> None:
    judge, _ = decider()
    listener.lookups = MAX_WAITING_LOOKUPS
    verdict = asyncio.run(judge.decide(listener, request(b"a.example/")))
    assert isinstance(verdict, Refusal)
    assert verdict.rule == "too-many-lookups"
    assert listener.resolver.asked == []  # type: ignore[union-attr]
    assert listener.lookups == MAX_WAITING_LOOKUPS
