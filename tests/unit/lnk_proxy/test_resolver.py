"""The resolver: every address of a name, deduplicated, in bounded time; no answer, a failure
or a timeout is an empty answer (which the policy refuses). The unsafe table is read anew on
every lookup and warns each time. No test here sends a DNS query: the system resolver is
replaced by a fake `getaddrinfo`, except for `localhost`, which /etc/hosts answers."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lnk_proxy.hosts_file import HostsFile
from lnk_proxy.resolver import (
    MAX_ADDRESSES,
    ResolverBusy,
    SystemResolver,
    UnsafeTableResolver,
    make_resolver,
)

ip = ipaddress.ip_address


def info(family: socket.AddressFamily, address: str) -> tuple[Any, ...]:
    sockaddr: tuple[Any, ...] = (address, 0) if family == socket.AF_INET else (address, 0, 0, 0)
    return (family, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", sockaddr)


def with_fake_getaddrinfo(
    monkeypatch: pytest.MonkeyPatch, fake: Callable[..., Any]
) -> list[tuple[Any, ...]]:
    calls: list[tuple[Any, ...]] = []

    def getaddrinfo(host: str, port: Any, **kwargs: Any) -> Any:  # on the lookup's thread
        calls.append((host, port, kwargs))
        return asyncio.run(fake(host))

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return calls


def test_both_families_are_asked_and_duplicates_removed(monkeypatch: pytest.MonkeyPatch) -> None:
    async def fake(host: str) -> list[tuple[Any, ...]]:
        return [
            info(socket.AF_INET6, "2001:db8::1"),
            info(socket.AF_INET, "198.51.100.7"),
            info(socket.AF_INET, "198.51.100.7"),
            info(socket.AF_INET6, "2001:db8::1"),
        ]

    calls = with_fake_getaddrinfo(monkeypatch, fake)
    answer = asyncio.run(SystemResolver().resolve("example.com"))
    assert answer == (ip("2001:db8::1"), ip("198.51.100.7"))
    (_, _, kwargs) = calls[0]
    assert kwargs["family"] == socket.AF_UNSPEC
    assert kwargs["type"] == socket.SOCK_STREAM


def test_a_name_with_no_answer_is_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    async def fake(host: str) -> list[tuple[Any, ...]]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    with_fake_getaddrinfo(monkeypatch, fake)
    assert asyncio.run(SystemResolver().resolve("nothing.example")) == ()


def test_a_slow_resolver_times_out_to_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    async def fake(host: str) -> list[tuple[Any, ...]]:
        await asyncio.sleep(10)
        return [info(socket.AF_INET, "198.51.100.7")]

    with_fake_getaddrinfo(monkeypatch, fake)
    assert asyncio.run(SystemResolver(timeout_s=0.05).resolve("slow.example")) == ()


def test_a_huge_answer_is_cut_one_past_the_bound_so_the_policy_refuses_it_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def fake(host: str) -> list[tuple[Any, ...]]:
        return [info(socket.AF_INET, f"198.51.100.{i}") for i in range(1, 201)]

    with_fake_getaddrinfo(monkeypatch, fake)
    assert len(asyncio.run(SystemResolver().resolve("many.example"))) == MAX_ADDRESSES + 1


def test_lookups_of_one_resolver_are_capped_until_their_threads_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A lookup that never answers keeps its slot past its timeout (its thread still runs): a
    sandbox cannot pile up threads by timing out; the same name in flight is asked once; another
    resolver (another sandbox's) answers at once."""
    release = threading.Event()
    asked: list[str] = []

    def getaddrinfo(host: str, port: Any, **kwargs: Any) -> Any:
        asked.append(host)
        if host.startswith("stuck"):
            release.wait(30)
        return [info(socket.AF_INET, "198.51.100.9")]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)

    async def run() -> None:
        stuck = SystemResolver(timeout_s=0.05, max_lookups=2)
        assert await stuck.resolve("stuck1.example") == ()  # timed out
        assert await stuck.resolve("stuck1.example") == ()  # joins the lookup still running
        assert await stuck.resolve("stuck2.example") == ()
        with pytest.raises(ResolverBusy):
            await stuck.resolve("stuck3.example")
        other = SystemResolver(timeout_s=5)
        assert await other.resolve("fine.example") == (ip("198.51.100.9"),)
        release.set()
        while stuck.running:  # the threads return, their slots come back
            await asyncio.sleep(0.01)
        assert await stuck.resolve("stuck3.example") == (ip("198.51.100.9"),)

    try:
        asyncio.run(run())
    finally:
        release.set()
    assert asked.count("stuck1.example") == 1


def test_localhost_from_the_system_resolver_is_loopback() -> None:
    answer = asyncio.run(SystemResolver().resolve("localhost"))
    assert answer
    assert all(address.is_loopback for address in answer)
    assert len(set(answer)) == len(answer)


def write_table(path: Path, table: object) -> Path:
    path.write_text(json.dumps(table), encoding="utf-8")
    return path


def test_the_table_answers_every_address(tmp_path: Path) -> None:
    table = write_table(
        tmp_path / "dns.json", {"www.Example.COM.": ["198.18.0.2", "2001:db8::2", "198.18.0.2"]}
    )
    resolver = UnsafeTableResolver(table)
    assert asyncio.run(resolver.resolve("www.example.com")) == (ip("198.18.0.2"), ip("2001:db8::2"))
    assert asyncio.run(resolver.resolve("other.example.com")) == ()


def test_the_table_is_read_on_every_lookup(tmp_path: Path) -> None:
    table = write_table(tmp_path / "dns.json", {"rebind.example": ["198.18.0.2"]})
    resolver = UnsafeTableResolver(table)
    assert asyncio.run(resolver.resolve("rebind.example")) == (ip("198.18.0.2"),)
    write_table(table, {"rebind.example": ["10.77.0.2"]})
    assert asyncio.run(resolver.resolve("rebind.example")) == (ip("10.77.0.2"),)


@pytest.mark.parametrize(
    "content",
    [
        "not json",
        json.dumps(["198.18.0.2"]),
        json.dumps({"a.example": "198.18.0.2"}),
        json.dumps({"a.example": ["not an address"]}),
        json.dumps({"a.example": [1]}),
        json.dumps({"bad name!": ["198.18.0.2"]}),
    ],
)
def test_a_malformed_table_answers_nothing(tmp_path: Path, content: str) -> None:
    table = tmp_path / "dns.json"
    table.write_text(content, encoding="utf-8")
    assert asyncio.run(UnsafeTableResolver(table).resolve("a.example")) == ()


def test_a_missing_table_answers_nothing(tmp_path: Path) -> None:
    assert asyncio.run(UnsafeTableResolver(tmp_path / "none.json").resolve("a.example")) == ()


def test_every_table_lookup_warns(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    table = write_table(tmp_path / "dns.json", {"a.example": ["198.18.0.2"]})
    with caplog.at_level(logging.WARNING, logger="lnk_proxy.resolver"):
        asyncio.run(UnsafeTableResolver(table).resolve("a.example"))
        asyncio.run(UnsafeTableResolver(table).resolve("a.example"))
    assert sum("unsafe_dns_table" in r.getMessage() for r in caplog.records) == 2


def test_make_resolver_picks_the_table_only_when_configured(tmp_path: Path) -> None:
    assert isinstance(make_resolver(None), SystemResolver)
    assert isinstance(make_resolver(tmp_path / "dns.json"), UnsafeTableResolver)


@pytest.mark.parametrize("kept", [False, True])
def test_the_table_is_kept_only_when_the_config_says(tmp_path: Path, kept: bool) -> None:
    """`unsafe_dns_table_kept`: the table's answers kept like the system resolver's (the
    e2e tests of the callback path); by default a changed answer is seen at once."""
    table = tmp_path / "dns.json"
    table.write_text("{}")
    assert make_resolver(table, kept=kept).caches_answers is kept
    assert make_resolver(table).caches_answers is False
    assert UnsafeTableResolver(table).caches_answers is False


def hosts_files(tmp_path: Path, nsswitch: str) -> HostsFile:
    (tmp_path / "hosts").write_text("198.51.100.7 www.test\n")
    (tmp_path / "nsswitch.conf").write_text(nsswitch)
    return HostsFile(tmp_path / "hosts", tmp_path / "nsswitch.conf")


def test_a_flood_of_names_hosts_settles_takes_no_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fairness attack's lookups (a new name each time, `hosts: files`): answered on the
    loop, no lookup thread started, getaddrinfo never asked; before `hosts_file` each one went
    to a thread, and the threads' wake-ups stretched other sandboxes' requests."""

    def getaddrinfo(host: str, port: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"getaddrinfo asked for {host}")

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    resolver = SystemResolver(hosts_file=hosts_files(tmp_path, "hosts: files\n"))

    async def run() -> list[tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, ...]]:
        names = [f"nx-{n}.flood.example" for n in range(500)] + ["www.test"]
        return list(await asyncio.gather(*(resolver.resolve(name) for name in names)))

    answers = asyncio.run(run())
    assert answers[:-1] == [()] * 500  # no address: the policy refuses each (`no-address`)
    assert answers[-1] == (ip("198.51.100.7"),)
    assert resolver._workers.alive == 0
    assert resolver.running == 0


def test_a_name_hosts_does_not_settle_still_asks_getaddrinfo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def fake(host: str) -> list[tuple[Any, ...]]:
        return [info(socket.AF_INET, "203.0.113.5")]

    calls = with_fake_getaddrinfo(monkeypatch, fake)
    resolver = SystemResolver(hosts_file=hosts_files(tmp_path, "hosts: files dns\n"))
    assert asyncio.run(resolver.resolve("elsewhere.example")) == (ip("203.0.113.5"),)
    assert asyncio.run(resolver.resolve("www.test")) == (ip("198.51.100.7"),)
    assert [call[0] for call in calls] == ["elsewhere.example"]
