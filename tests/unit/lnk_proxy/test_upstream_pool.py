"""The upstream pool (one sandbox's idle origin connections), the per-sandbox answer cache and
the policy memo: what the proxy keeps between requests to make them cheaper, and why none of
it changes a decision. Real socketpairs stand for origin connections."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import time
from collections.abc import Iterator

import pytest

from lnk_proxy.conn import Conn
from lnk_proxy.policy import (
    Allowed,
    MachineView,
    ProxyGrants,
    Refused,
    judge_addresses,
    judge_target,
)
from lnk_proxy.policy_memo import MAX_ENTRIES, PolicyMemo
from lnk_proxy.resolver import AnswerCache, SystemResolver, UnsafeTableResolver
from lnk_proxy.upstream_pool import PoolKey, UpstreamPool
from lnk_shared.hosts import parse_host_pattern
from lnk_shared.spec import LanEntry

ip = ipaddress.ip_address
TEST_MACHINE = MachineView(
    frozenset({ip("127.0.0.1"), ip("192.168.1.10")}), (), (ipaddress.ip_network("198.18.0.0/15"),)
)


def grants(internet: tuple[str, ...] = (), lan: tuple[str, ...] = ()) -> ProxyGrants:
    return ProxyGrants(
        internet_any=internet == ("*",),
        internet=tuple(parse_host_pattern(h) for h in internet if h != "*"),
        lan=tuple(LanEntry(network=ipaddress.ip_network(n)) for n in lan),
    )


WWW: PoolKey = ("www.example.com", 80, ip("198.18.0.10"))


class Origins:
    """Socketpairs: the proxy's end as a `Conn`, the origin's end kept to act as the origin."""

    def __init__(self) -> None:
        self.far: list[socket.socket] = []
        self.near: list[Conn] = []

    def conn(self) -> Conn:
        near, far = socket.socketpair()
        self.far.append(far)
        self.near.append(Conn(near))
        return self.near[-1]

    def closed(self, conn: Conn) -> bool:
        return conn.sock.fileno() == -1

    def close(self) -> None:
        for conn in self.near:
            conn.close()
        for sock in self.far:
            sock.close()


@pytest.fixture
def origins() -> Iterator[Origins]:
    made = Origins()
    try:
        yield made
    finally:
        made.close()


def run(coroutine_function: object) -> None:
    async def main() -> None:
        await coroutine_function()  # type: ignore[operator]

    asyncio.run(main())


def test_a_connection_given_back_is_taken_for_the_same_key_only(origins: Origins) -> None:
    async def check() -> None:
        pool = UpstreamPool()
        conn = origins.conn()
        pool.give(WWW, conn)
        assert pool.take(("www.example.com", 80, ip("198.18.0.11"))) is None  # other address
        assert pool.take(("www.example.com", 8080, ip("198.18.0.10"))) is None  # other port
        assert pool.take(("other.example.com", 80, ip("198.18.0.10"))) is None  # other host
        assert pool.take(WWW) is conn
        assert pool.take(WWW) is None  # taken: in use by one request only
        assert len(pool) == 0

    run(check)


def test_a_connection_the_origin_closed_is_never_taken(origins: Origins) -> None:
    async def check() -> None:
        pool = UpstreamPool()
        conn = origins.conn()
        pool.give(WWW, conn)
        origins.far[-1].close()
        assert pool.take(WWW) is None
        assert origins.closed(conn)

    run(check)


def test_a_connection_with_bytes_no_one_asked_for_is_never_taken(origins: Origins) -> None:
    """An origin that sends a forged 'next answer' while idle: that line is dropped."""

    async def check() -> None:
        pool = UpstreamPool()
        conn = origins.conn()
        pool.give(WWW, conn)
        origins.far[-1].sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nforged")
        await asyncio.sleep(0)
        assert pool.take(WWW) is None
        assert origins.closed(conn)

    run(check)


def test_a_connection_with_unread_bytes_is_closed_not_kept(origins: Origins) -> None:
    async def check() -> None:
        pool = UpstreamPool()
        conn = origins.conn()
        conn.buffer += b"leftover"
        pool.give(WWW, conn)
        assert origins.closed(conn) and len(pool) == 0

    run(check)


def test_idle_connections_expire(origins: Origins) -> None:
    async def check() -> None:
        pool = UpstreamPool(idle_s=0.05)
        first, second = origins.conn(), origins.conn()
        pool.give(WWW, first)
        time.sleep(0.1)
        assert pool.take(WWW) is None and origins.closed(first)
        pool.give(WWW, second)
        time.sleep(0.1)
        pool.sweep()
        assert origins.closed(second) and len(pool) == 0

    run(check)


def test_limits_per_key_and_per_sandbox_close_the_rest(origins: Origins) -> None:
    async def check() -> None:
        pool = UpstreamPool(per_key=2, per_sandbox=3)
        kept = [origins.conn() for _ in range(3)]
        for conn in kept:
            pool.give(WWW, conn)
        assert len(pool) == 2 and origins.closed(kept[2])
        other: PoolKey = ("b.example.com", 80, ip("198.18.0.12"))
        more = [origins.conn() for _ in range(2)]
        for conn in more:
            pool.give(other, conn)
        assert len(pool) == 3 and origins.closed(more[1])

    run(check)


def test_closing_the_pool_closes_every_idle_connection(origins: Origins) -> None:
    async def check() -> None:
        pool = UpstreamPool()
        conns = [origins.conn() for _ in range(3)]
        for conn in conns:
            pool.give(WWW, conn)
        pool.close()
        assert all(origins.closed(conn) for conn in conns) and len(pool) == 0
        assert pool.take(WWW) is None

    run(check)


def test_the_answer_cache_keeps_answers_for_a_while_and_never_an_empty_one() -> None:
    cache = AnswerCache(ttl_s=0.05, max_names=2)
    answer = (ip("198.18.0.10"),)
    cache.put("a.example.com", answer)
    cache.put("none.example.com", ())
    assert cache.get("a.example.com") == answer
    assert cache.get("none.example.com") is None  # asked again next time
    time.sleep(0.1)
    assert cache.get("a.example.com") is None
    for name in ("1.example", "2.example", "3.example"):
        cache.put(name, answer)
    assert cache.get("1.example") is None and cache.get("3.example") == answer


def test_only_the_system_resolver_may_be_cached() -> None:
    """The test table changes answers between two requests (rebinding tests): never cached."""
    assert SystemResolver.caches_answers
    assert not UnsafeTableResolver.caches_answers


HOSTS = ["www.example.com", "WWW.Example.com.", "other.example.com", "localhost", "10.0.0.1"]


def test_the_policy_memo_gives_the_policy_functions_own_verdicts() -> None:
    granted = grants(internet=("www.example.com",), lan=("10.0.0.0/8",))
    memo = PolicyMemo(granted)
    for _ in range(2):  # computed, then remembered
        for host in HOSTS:
            assert memo.target(host, 80) == judge_target(granted, host, 80)
    target = judge_target(granted, "www.example.com", 80)
    assert not isinstance(target, Refused)
    for answer in [(ip("198.18.0.10"),), (ip("10.0.0.5"),), (ip("198.18.0.10"), ip("127.0.0.1"))]:
        for _ in range(2):
            verdict = memo.addresses(target, answer, TEST_MACHINE)
            assert verdict == judge_addresses(granted, target, answer, TEST_MACHINE)
    assert isinstance(memo.addresses(target, (ip("198.18.0.10"),), TEST_MACHINE), Allowed)


def test_a_new_machine_view_is_judged_anew() -> None:
    """The machine gained 198.18.0.10 (say, a new interface): the remembered 'allowed' goes."""
    granted = grants(internet=("www.example.com",))
    memo = PolicyMemo(granted)
    target = judge_target(granted, "www.example.com", 80)
    assert not isinstance(target, Refused)
    answer = (ip("198.18.0.10"),)
    assert isinstance(memo.addresses(target, answer, TEST_MACHINE), Allowed)
    grown = MachineView(
        TEST_MACHINE.local_addresses | {ip("198.18.0.10")},
        TEST_MACHINE.local_networks,
        TEST_MACHINE.unsafe_public_networks,
    )
    verdict = memo.addresses(target, answer, grown)
    assert isinstance(verdict, Refused) and verdict.rule == "never-this-machine"


def test_the_policy_memo_is_bounded() -> None:
    memo = PolicyMemo(grants(internet=("*",)))
    for index in range(MAX_ENTRIES + 10):
        memo.target(f"h{index}.example.com", 80)
    assert len(memo._targets) <= MAX_ENTRIES
