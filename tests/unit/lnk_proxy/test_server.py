"""The server in-process, with no traffic anywhere: every request here is refused (loopback is
never reached), which is what these tests check: flags that cannot be read stop a sandbox, a
slow head and a flood of connections are cut off, a sandbox id must be a file name."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from lnk_proxy import limits
from lnk_proxy.config import ProxyConfig
from lnk_proxy.policy import ProxyGrants
from lnk_proxy.server import ProxyServer
from lnk_proxy.tunnel_buffers import SMALL
from lnk_shared.addresses import IPAddress
from lnk_shared.hosts import parse_host_pattern

SECRET = "x" * 40


@pytest.fixture
def base() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="lnksrv", dir="/tmp"))  # unix socket paths are short
    yield path
    shutil.rmtree(path, ignore_errors=True)


def config_for(base: Path, max_connections: int = 512) -> ProxyConfig:
    return ProxyConfig(
        run_dir=base / "run", state_dir=base / "state", max_connections_per_sandbox=max_connections
    )


async def exchange(path: Path, request: bytes) -> bytes:
    reader, writer = await asyncio.open_unix_connection(str(path))
    writer.write(request)
    answer = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    await writer.wait_closed()
    return answer


def body(answer: bytes) -> bytes:
    return answer.partition(b"\r\n\r\n")[2]


def log_rules(config: ProxyConfig, sandbox: str) -> list[str]:
    path = config.wire_log_dir / f"{sandbox}.log"
    return [json.loads(line)["rule"] for line in path.read_text().splitlines()]


async def with_listener(
    config: ProxyConfig, grants: ProxyGrants, sandbox: str = "sbx-1"
) -> tuple[ProxyServer, Path]:
    server = ProxyServer(config)
    await server.start()
    path = config.run_dir / "sbx" / f"{sandbox}.sock"
    await server.open_listener(sandbox, path, grants, SECRET)
    return server, path


def test_loopback_is_refused_even_with_every_grant(base: Path) -> None:
    config = config_for(base)

    async def run() -> bytes:
        server, path = await with_listener(config, ProxyGrants(internet_any=True, lan_any=True))
        try:
            return await exchange(path, b"CONNECT 127.0.0.1:22 HTTP/1.1\r\n\r\n")
        finally:
            await server.close()

    assert body(asyncio.run(run())) == b"lnk: refused (never-loopback)\n"
    assert log_rules(config, "sbx-1") == ["never-loopback"]


def test_a_flag_that_cannot_be_read_counts_as_set(base: Path) -> None:
    config = config_for(base)
    config.flags_dir.mkdir(parents=True)
    loop_link = config.flags_dir / "sbx-1.pause"
    loop_link.symlink_to(loop_link)  # stat() fails with ELOOP

    async def run() -> bytes:
        server, path = await with_listener(config, ProxyGrants(internet_any=True))
        try:
            return await exchange(path, b"CONNECT 127.0.0.1:22 HTTP/1.1\r\n\r\n")
        finally:
            await server.close()

    assert body(asyncio.run(run())) == b"lnk: refused (paused)\n"


def test_a_slow_head_is_cut_off(base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "HEAD_TIMEOUT_S", 0.2)
    config = config_for(base)

    async def run() -> bytes:
        server, path = await with_listener(config, ProxyGrants())
        try:
            return await exchange(path, b"GET http://a.example/ HTTP/1.1\r\nHost: a.exa")
        finally:
            await server.close()

    assert body(asyncio.run(run())) == b"lnk: refused (head-timeout)\n"


def test_connections_past_the_limit_are_refused(base: Path) -> None:
    config = config_for(base, max_connections=2)

    async def run() -> bytes:
        server, path = await with_listener(config, ProxyGrants())
        held = [await asyncio.open_unix_connection(str(path)) for _ in range(2)]
        try:
            await asyncio.sleep(0.1)
            return await exchange(path, b"")
        finally:
            for _, writer in held:
                writer.close()
            await server.close()

    assert body(asyncio.run(run())) == b"lnk: refused (too-many-connections)\n"


@pytest.mark.parametrize("sandbox", ["../x", "", "a/b", "x" * 65])
def test_a_bad_sandbox_id_opens_nothing(base: Path, sandbox: str) -> None:
    async def run() -> None:
        server = ProxyServer(config_for(base))
        await server.start()
        try:
            with pytest.raises(ValueError, match="sandbox id"):
                await server.open_listener(sandbox, base / "s.sock", ProxyGrants(), SECRET)
        finally:
            await server.close()

    asyncio.run(run())
    assert not (base / "s.sock").exists()


def test_closing_a_listener_removes_its_socket(base: Path) -> None:
    async def run() -> tuple[bool, bool]:
        server, path = await with_listener(config_for(base), ProxyGrants())
        reader, writer = await asyncio.open_unix_connection(str(path))
        closed = await server.close_listener("sbx-1")
        gone = await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
        assert not path.exists()
        assert not await server.close_listener("sbx-1")
        await server.close()
        return closed, gone

    assert asyncio.run(run()) == (True, True)


def test_the_machine_is_read_at_start(base: Path) -> None:
    async def run() -> None:
        server = ProxyServer(config_for(base))
        await server.start()
        assert server.machine is not None
        assert any(a.is_loopback for a in server.machine.local_addresses)
        await server.close()

    asyncio.run(run())


class CountingResolver:
    """A resolver that may be cached (as the system one), answering from a table."""

    caches_answers = True

    def __init__(self, table: dict[str, tuple[str, ...]]) -> None:
        self.table = table
        self.asked: list[str] = []

    async def resolve(self, name: str) -> tuple[IPAddress, ...]:
        self.asked.append(name)
        return tuple(ipaddress.ip_address(a) for a in self.table.get(name, ()))


def test_an_answer_is_kept_per_sandbox_and_judged_on_every_request(base: Path) -> None:
    """The second request reuses the first's answer (no second lookup) but is judged again;
    another sandbox asks for itself; an empty answer is asked again; an unlisted name never."""
    config = config_for(base)
    resolver = CountingResolver({"lan.example.com": ("10.0.0.1",)})
    grants = ProxyGrants(internet=(parse_host_pattern("*.example.com"),))

    async def run() -> list[bytes]:
        server = ProxyServer(config, resolver=resolver)
        await server.start()
        paths = []
        for sandbox in ("sbx-a", "sbx-b"):
            path = config.run_dir / "sbx" / f"{sandbox}.sock"
            await server.open_listener(sandbox, path, grants, SECRET)
            paths.append(path)
        try:
            answers = []
            for path, host in [
                (paths[0], "lan.example.com"),
                (paths[0], "lan.example.com"),
                (paths[1], "lan.example.com"),
                (paths[0], "none.example.com"),
                (paths[0], "none.example.com"),
                (paths[0], "unlisted.test"),
            ]:
                answers.append(
                    await exchange(path, f"CONNECT {host}:443 HTTP/1.1\r\n\r\n".encode())
                )
            return answers
        finally:
            await server.close()

    answers = [body(answer) for answer in asyncio.run(run())]
    assert answers == [b"lnk: refused (internet-not-public)\n"] * 3 + [
        b"lnk: refused (no-address)\n"
    ] * 2 + [b"lnk: refused (not-listed)\n"]
    assert resolver.asked == ["lan.example.com"] * 2 + ["none.example.com"] * 2
    assert log_rules(config, "sbx-a").count("internet-not-public") == 2


def test_a_sandbox_taking_every_descriptor_leaves_another_its_share(base: Path) -> None:
    """Room for 10 connections in all, two sandboxes: the first gets its share (5) and is then
    refused (`too-many-descriptors`); the second still gets its 5, each one judged."""
    config = config_for(base)

    async def run() -> tuple[list[bytes], list[bytes]]:
        server = ProxyServer(config)
        server.descriptor_limit = 20  # 10 connections at 2 descriptors each
        await server.start()
        paths = []
        for sandbox in ("sbx-a", "sbx-b"):
            path = config.run_dir / "sbx" / f"{sandbox}.sock"
            await server.open_listener(sandbox, path, ProxyGrants(), SECRET)
            paths.append(path)
        held = []
        try:
            for _ in range(5):  # idle: each waits for its head, holding its descriptors
                held.append(await asyncio.open_unix_connection(str(paths[0])))
            while len(server._listeners["sbx-a"].connections) < 5:
                await asyncio.sleep(0.01)  # until the proxy accepted all five
            flooder = [await exchange(paths[0], b"") for _ in range(3)]
            for _ in range(4):  # the other's share, held at once
                held.append(await asyncio.open_unix_connection(str(paths[1])))
            while len(server._listeners["sbx-b"].connections) < 4:
                await asyncio.sleep(0.01)
            other = [await exchange(paths[1], b"CONNECT 127.0.0.1:22 HTTP/1.1\r\n\r\n")]
            return flooder, other
        finally:
            for _, writer in held:
                writer.close()
            await server.close()

    flooder, other = asyncio.run(run())
    assert [body(a) for a in flooder] == [b"lnk: refused (too-many-descriptors)\n"] * 3
    assert [body(a) for a in other] == [b"lnk: refused (never-loopback)\n"]  # its 5th
    assert "too-many-descriptors" in log_rules(config, "sbx-a")


class HeldResolver:
    """Lookups that wait until `release`: CONNECTs hold their tunnel's reservation meanwhile."""

    caches_answers = False

    def __init__(self) -> None:
        self.waiting = 0
        self.released = asyncio.Event()

    async def resolve(self, name: str) -> tuple[IPAddress, ...]:
        self.waiting += 1
        await self.released.wait()
        return ()


def test_a_sandbox_at_its_buffer_budget_is_refused_and_another_keeps_its_own(base: Path) -> None:
    """A budget of two small tunnels: two CONNECTs waiting on their lookup hold it, the third
    is refused at once (`too-much-buffer`, logged) before any lookup; another sandbox's CONNECT
    is still judged; once the two end, the budget is free again."""
    budget = 2 * SMALL.worst_case()
    config = ProxyConfig(
        run_dir=base / "run", state_dir=base / "state", tunnel_buffer_budget_bytes=budget
    )
    resolver = HeldResolver()
    grants = ProxyGrants(internet=(parse_host_pattern("*.example.com"),))
    connect = b"CONNECT a.example.com:443 HTTP/1.1\r\n\r\n"

    async def run() -> tuple[bytes, bytes, list[bytes], bytes, int]:
        server = ProxyServer(config, resolver=resolver)
        await server.start()
        paths = []
        for sandbox in ("sbx-a", "sbx-b"):
            path = config.run_dir / "sbx" / f"{sandbox}.sock"
            await server.open_listener(sandbox, path, grants, SECRET)
            paths.append(path)
        try:
            held = [asyncio.create_task(exchange(paths[0], connect)) for _ in range(2)]
            while resolver.waiting < 2:
                await asyncio.sleep(0.01)
            third = await exchange(paths[0], connect)
            other = asyncio.create_task(exchange(paths[1], connect))
            while resolver.waiting < 3:  # the other sandbox's reached its lookup
                await asyncio.sleep(0.01)
            resolver.released.set()
            ended = [await task for task in held]
            reserved = server._listeners["sbx-a"].buffers
            again = await exchange(paths[0], connect)
            return third, await other, ended, again, reserved
        finally:
            await server.close()

    third, other, ended, again, reserved = asyncio.run(run())
    assert body(third) == b"lnk: refused (too-much-buffer)\n"
    assert [body(a) for a in ended] == [b"lnk: refused (no-address)\n"] * 2
    assert body(other) == b"lnk: refused (no-address)\n"  # judged: not at sbx-a's budget
    assert reserved == 0  # given back when the exchanges ended
    assert body(again) == b"lnk: refused (no-address)\n"
    assert log_rules(config, "sbx-a")[0] == "too-much-buffer"
    assert "too-much-buffer" not in log_rules(config, "sbx-b")


def test_unsafe_unbounded_tunnels_lets_a_sandbox_past_its_tunnel_cap_and_buffer_budget(
    base: Path,
) -> None:
    """The switch `lnk sandbox check` names when it reports the tunnel class leaked: with a cap
    of one tunnel and a budget of one small one, three CONNECTs waiting on their lookup are all
    judged (none refused at the caps), and their reservations are all given back."""
    config = ProxyConfig(
        run_dir=base / "run",
        state_dir=base / "state",
        max_tunnels_per_sandbox=1,
        tunnel_buffer_budget_bytes=SMALL.worst_case(),
        unsafe_unbounded_tunnels=True,
    )
    resolver = HeldResolver()
    grants = ProxyGrants(internet=(parse_host_pattern("*.example.com"),))
    connect = b"CONNECT a.example.com:443 HTTP/1.1\r\n\r\n"

    async def run() -> tuple[list[bytes], int, int]:
        server = ProxyServer(config, resolver=resolver)
        await server.start()
        path = config.run_dir / "sbx" / "sbx-a.sock"
        await server.open_listener("sbx-a", path, grants, SECRET)
        try:
            held = [asyncio.create_task(exchange(path, connect)) for _ in range(3)]
            while resolver.waiting < 3:  # all three reached their lookup: none was refused
                await asyncio.sleep(0.01)
            resolver.released.set()
            ended = [await task for task in held]
            listener = server._listeners["sbx-a"]
            return ended, listener.tunnels, listener.buffers
        finally:
            await server.close()

    ended, tunnels, reserved = asyncio.run(run())
    assert [body(a) for a in ended] == [b"lnk: refused (no-address)\n"] * 3
    assert (tunnels, reserved) == (0, 0)
    assert not {"too-many-tunnels", "too-much-buffer"} & set(log_rules(config, "sbx-a"))
