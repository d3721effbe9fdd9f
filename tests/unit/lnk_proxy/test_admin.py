"""The admin socket: only the controller's uid gets an answer; every field of a command is
checked as hostile; grants are read by the spec model's own rules; open and close work on a
real listener."""

from __future__ import annotations

import asyncio
import copy
import os
import shutil
import socket
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lnk_proxy.admin import (
    CloseCommand,
    OpenCommand,
    PingCommand,
    StatsCommand,
    handle_admin_connection,
    parse_command,
    parse_grants,
)
from lnk_proxy.config import ProxyConfig
from lnk_proxy.server import ProxyServer
from lnk_shared.unix import recv_frame, send_frame

SECRET = "s3cr3t-" + "x" * 40


@pytest.fixture
def run_dir() -> Iterator[Path]:
    # Short: a unix socket's path holds 107 bytes, and pytest's tmp_path can be longer.
    path = Path(tempfile.mkdtemp(prefix="lnkadm", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def grants(**changes: object) -> dict[str, Any]:
    base: dict[str, Any] = {"internet_any": False, "internet": [], "lan_any": False, "lan": []}
    base.update(changes)
    return base


def open_command(run_dir: Path, **changes: object) -> dict[str, Any]:
    base: dict[str, Any] = {
        "op": "open",
        "sandbox": "sbx-0a1b",
        "socket": str(run_dir / "sbx" / "sbx-0a1b.sock"),
        "grants": grants(internet=["www.example.com", "*.example.org:443"]),
        "secret": SECRET,
    }
    base.update(changes)
    return base


def test_a_valid_open_is_parsed(run_dir: Path) -> None:
    command = parse_command(open_command(run_dir), run_dir)
    assert isinstance(command, OpenCommand)
    assert command.sandbox == "sbx-0a1b"
    assert command.socket == run_dir / "sbx" / "sbx-0a1b.sock"
    assert [str(p) for p in command.grants.internet] == ["*.example.org:443", "www.example.com"]
    assert command.secret == SECRET


def test_close_and_ping_are_parsed(run_dir: Path) -> None:
    assert parse_command({"op": "close", "sandbox": "sbx-1"}, run_dir) == CloseCommand("sbx-1")
    assert parse_command({"op": "ping"}, run_dir) == PingCommand()


def hostile_opens(run_dir: Path) -> list[tuple[str, dict[str, Any]]]:
    long_socket = str(run_dir / ("s" * 120))
    cases: list[tuple[str, dict[str, Any]]] = [
        ("op", {"op": "OPEN"}),
        ("op", {"op": ["open"]}),
        ("unknown keys", {"extra": 1}),
        ("sandbox", {"sandbox": "../../etc/passwd"}),
        ("sandbox", {"sandbox": ""}),
        ("sandbox", {"sandbox": 12}),
        ("sandbox", {"sandbox": "sbx\n1"}),
        ("secret", {"secret": "short"}),
        ("secret", {"secret": "x" * 40 + " y"}),
        ("secret", {"secret": None}),
        ("socket", {"socket": "relative.sock"}),
        ("socket", {"socket": "/etc/lnk/proxy.sock"}),
        ("socket", {"socket": str(run_dir / "a" / ".." / ".." / "x.sock")}),
        ("socket", {"socket": str(run_dir) + "//x.sock"}),
        ("socket", {"socket": str(run_dir / "x\x00.sock")}),
        ("socket", {"socket": str(run_dir)}),
        ("socket", {"socket": long_socket}),
        ("grants", {"grants": []}),
        ("grants", {"grants": {"internet_any": True}}),
        ("grants", {"grants": {**grants(), "browser": []}}),
        ("grants.internet_any", {"grants": grants(internet_any="yes")}),
        ("grants.lan_any", {"grants": grants(lan_any=1)}),
        ("grants.internet", {"grants": grants(internet="www.example.com")}),
        ("grants.internet", {"grants": grants(internet=["*"])}),
        ("grants.internet", {"grants": grants(internet=[5])}),
        ("grants.internet", {"grants": grants(internet=["http://example.com/"])}),
        ("grants.internet", {"grants": grants(internet=["exa\r\nmple.com"])}),
        ("grants.internet", {"grants": grants(internet=["x.example"] * 300)}),
        ("grants.lan", {"grants": grants(lan=["8.8.8.8"])}),
        ("grants.lan", {"grants": grants(lan=["169.254.169.254"])}),
        ("grants.lan", {"grants": grants(lan=["100.64.0.0/10"])}),
        ("grants.lan", {"grants": grants(lan=["0.0.0.0/0"])}),
        ("grants.lan", {"grants": grants(lan=["*"])}),
    ]
    return cases


@pytest.mark.parametrize("index", range(33))
def test_every_hostile_field_is_refused(run_dir: Path, index: int) -> None:
    cases = hostile_opens(run_dir)
    assert len(cases) == 33
    named, changes = cases[index]
    command = open_command(run_dir)
    command.update(copy.deepcopy(changes))
    with pytest.raises(ValueError) as info:
        parse_command(command, run_dir)
    assert named.split(".")[0] in str(info.value)


@pytest.mark.parametrize(
    "command",
    [{}, {"op": "close"}, {"op": "close", "sandbox": "a", "x": 1}, {"op": "ping", "sandbox": "a"}],
)
def test_missing_or_unknown_keys_are_refused(run_dir: Path, command: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        parse_command(command, run_dir)


def test_lan_entries_are_read_as_the_spec_reads_them() -> None:
    parsed = parse_grants(grants(lan=["nas.home.arpa", "192.168.1.0/24", "100.100.1.2", "fd00::5"]))
    assert sorted(str(e) for e in parsed.lan) == [
        "100.100.1.2",
        "192.168.1.0/24",
        "fd00::5",
        "nas.home.arpa",
    ]


def test_any_drops_the_list() -> None:
    parsed = parse_grants(grants(internet_any=True, internet=["a.example"], lan_any=True))
    assert parsed.internet_any
    assert parsed.internet == ()
    assert parsed.lan_any


def test_any_keeps_the_entries_it_does_not_cover() -> None:
    listed = ["a.example", "git.example:22", "b.example:443"]
    parsed = parse_grants(grants(internet_any=True, internet=listed))
    assert parsed.internet_any
    assert [str(p) for p in parsed.internet] == ["git.example:22"]  # `*` never opens 22


def test_empty_grants_open_nothing() -> None:
    parsed = parse_grants(grants())
    assert not parsed.internet_any and not parsed.lan_any
    assert parsed.internet == () and parsed.lan == ()


def exchange(config: ProxyConfig, frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Send `frames` over a socketpair to `handle_admin_connection`; the replies."""

    async def run() -> list[dict[str, Any]]:
        server = ProxyServer(config)
        await server.start()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        handler = asyncio.create_task(handle_admin_connection(server, theirs, config))

        def client() -> list[dict[str, Any]]:
            replies = []
            ours.settimeout(5)
            try:
                for frame in frames:
                    send_frame(ours, frame)
                    replies.append(recv_frame(ours)[0])
            except (EOFError, OSError):
                pass
            ours.close()
            return replies

        try:
            return await asyncio.to_thread(client)
        finally:
            await handler
            await server.close()

    return asyncio.run(run())


def config_for(run_dir: Path, controller_uid: int) -> ProxyConfig:
    return ProxyConfig(run_dir=run_dir, state_dir=run_dir / "state", controller_uid=controller_uid)


def test_another_uid_gets_no_answer(run_dir: Path) -> None:
    config = config_for(run_dir, os.getuid() + 1)
    assert exchange(config, [{"op": "ping"}]) == []


def test_the_controller_opens_and_closes_a_listener(run_dir: Path) -> None:
    config = config_for(run_dir, os.getuid())
    command = open_command(run_dir)
    path = Path(command["socket"])
    replies = exchange(
        config,
        [
            {"op": "ping"},
            command,
            command,  # the same sandbox twice
            {"op": "close", "sandbox": "sbx-0a1b"},
            {"op": "close", "sandbox": "sbx-0a1b"},  # closing again is not an error
            {"op": "open", "sandbox": "x"},
        ],
    )
    assert replies[:2] == [{"ok": True}, {"ok": True}]
    assert replies[2]["ok"] is False and "already has a listener" in replies[2]["error"]
    assert replies[3:5] == [{"ok": True}, {"ok": True}]
    assert replies[5]["ok"] is False and "missing keys" in replies[5]["error"]
    assert not path.exists()


def test_the_listener_socket_is_mode_0666(run_dir: Path) -> None:
    config = config_for(run_dir, os.getuid())
    command = open_command(run_dir)

    async def run() -> int:
        server = ProxyServer(config)
        await server.start()
        parsed = parse_command(command, run_dir)
        assert isinstance(parsed, OpenCommand)
        await server.open_listener(parsed.sandbox, parsed.socket, parsed.grants, parsed.secret)
        mode = stat.S_IMODE(parsed.socket.stat().st_mode)
        assert server.secret_matches(parsed.sandbox, SECRET)
        assert not server.secret_matches(parsed.sandbox, SECRET[:-1] + "y")
        await server.close()
        return mode

    assert asyncio.run(run()) == 0o666


def _ask(sock: socket.socket, frame: dict[str, Any], fds: list[int] | None = None) -> Any:
    send_frame(sock, frame, fds)
    return recv_frame(sock, want_fds=True)


async def _admin(server: ProxyServer, config: ProxyConfig) -> tuple[socket.socket, Any]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    ours.settimeout(5)
    return ours, asyncio.create_task(handle_admin_connection(server, theirs, config))


def test_a_restarted_proxy_adopts_the_listener_the_controller_kept(run_dir: Path) -> None:
    """The reply to open carries the listener; a new proxy serves it when handed back, and a
    connection made while no proxy ran is answered then (judged: loopback is refused)."""
    config = config_for(run_dir, os.getuid())
    command = open_command(run_dir)
    path = Path(command["socket"])

    async def first() -> int:
        server = ProxyServer(config)
        await server.start()
        ours, handler = await _admin(server, config)
        reply, fds = await asyncio.to_thread(_ask, ours, command)
        ours.close()
        await handler
        assert reply == {"ok": True} and len(fds) == 1
        # The proxy dies (kill -9): its descriptors close, nothing is unlinked.
        for listener in server._listeners.values():
            for task in [*listener.background, *listener.connections]:
                task.cancel()
            await asyncio.gather(*listener.background, return_exceptions=True)
            if listener.watch is not None:
                listener.watch.close()
            listener.sock.close()
        server._listeners.clear()
        await server.close()
        return fds[0]

    kept = asyncio.run(first())
    waiting = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    waiting.settimeout(5)
    waiting.connect(str(path))  # queued in the kept listener's backlog: no proxy runs now
    waiting.sendall(b"CONNECT 127.0.0.1:9 HTTP/1.1\r\n\r\n")

    async def second() -> list[Any]:
        server = ProxyServer(config)
        await server.start()
        ours, handler = await _admin(server, config)
        wrong = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        adopt = {**command, "op": "adopt"}
        replies = [
            (await asyncio.to_thread(_ask, ours, {"op": "list"}))[0],
            (await asyncio.to_thread(_ask, ours, adopt, [wrong.fileno()]))[0],
            (await asyncio.to_thread(_ask, ours, adopt))[0],
            (await asyncio.to_thread(_ask, ours, adopt, [kept]))[0],
            (await asyncio.to_thread(_ask, ours, {"op": "list"}))[0],
        ]
        replies.append(await asyncio.to_thread(waiting.recv, 4096))
        wrong.close()
        ours.close()
        await handler
        await server.close()
        return replies

    try:
        listed, not_listening, no_socket, adopted, now, answer = asyncio.run(second())
    finally:
        waiting.close()
        os.close(kept)
    assert listed == {"ok": True, "sandboxes": []}
    assert not_listening["ok"] is False and "not a listening unix socket" in not_listening["error"]
    assert no_socket == {"ok": False, "error": "adopt takes exactly one listening socket"}
    assert adopted == {"ok": True}
    assert now == {"ok": True, "sandboxes": [command["sandbox"]]}
    assert answer.startswith(b"HTTP/1.1 403") and b"never-loopback" in answer


@pytest.mark.parametrize(
    ("frame", "expected"),
    [
        ({"op": "stats", "sandbox": "sbx-1"}, StatsCommand("sbx-1")),
        ({"op": "stats"}, "sandbox"),  # the sandbox is required
        ({"op": "stats", "sandbox": "../x"}, "sandbox must be an id"),
        ({"op": "stats", "sandbox": "sbx-1", "extra": 1}, "extra"),
    ],
)
def test_stats_is_parsed_or_refused(run_dir: Path, frame: dict[str, Any], expected: Any) -> None:
    if isinstance(expected, StatsCommand):
        assert parse_command(frame, run_dir) == expected
        return
    with pytest.raises(ValueError, match=expected):
        parse_command(frame, run_dir)
