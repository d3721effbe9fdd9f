"""The stop and pause flags through the flags folder's inotify watch (`flag_watch`), with real
files and a real origin on loopback (a `[localhost]` grant): a flag set or cleared between two
requests on one keep-alive connection decides the second, however it is set (made, renamed
over, a link); the folder missing at start, or removed and made again, still stops nothing
from being seen; and while the watch is on, a request reads no flag at all."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from lnk_proxy import watches as watches_module
from lnk_proxy.config import ProxyConfig
from lnk_proxy.flag_watch import EVERYTHING, FlagWatch
from lnk_proxy.policy import ProxyGrants
from lnk_proxy.server import ProxyServer

SECRET = "x" * 40
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n"
SANDBOX = "sbx-flags"


@pytest.fixture
def base() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="lnkflag", dir="/tmp"))  # unix socket paths are short
    yield path
    shutil.rmtree(path, ignore_errors=True)


def set_flag(folder: Path, name: str) -> None:
    """As the controller's `proxy_link.set_flag` makes one."""
    folder.mkdir(mode=0o755, exist_ok=True)
    os.close(os.open(folder / f"{SANDBOX}.{name}", os.O_CREAT | os.O_WRONLY | os.O_NOFOLLOW))


def test_the_watch_names_each_change_and_says_everything_when_the_folder_goes(base: Path) -> None:
    folder = base / "flags"
    watch = FlagWatch(folder)
    try:
        assert not watch.arm()  # not there yet
        folder.mkdir()
        assert watch.arm()
        set_flag(folder, "pause")
        assert watch.drain() == {f"{SANDBOX}.pause"}
        os.rename(folder / f"{SANDBOX}.pause", folder / f"{SANDBOX}.stop")
        assert watch.drain() == {f"{SANDBOX}.pause", f"{SANDBOX}.stop"}
        (folder / f"{SANDBOX}.stop").unlink()
        assert watch.drain() == {f"{SANDBOX}.stop"}
        assert watch.drain() == set()
        folder.chmod(0o700)  # a mode change: a stat could now fail
        assert watch.drain() is EVERYTHING and watch.armed
        folder.rename(base / "moved")
        assert watch.drain() is EVERYTHING and not watch.armed
        (base / "moved").rmdir()
        folder.mkdir()
        assert watch.arm()
        folder.rmdir()
        assert watch.drain() is EVERYTHING and not watch.armed
    finally:
        watch.close()


class Origin:
    """Answers OK to every request, on 127.0.0.1."""

    def __init__(self) -> None:
        self.requests = 0
        self.port = 0

    async def start(self) -> asyncio.Server:
        server = await asyncio.start_server(self.serve, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        return server

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                self.requests += 1
                writer.write(OK)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


Step = Callable[[Path], None]
OK_LINE, REFUSED = b"HTTP/1.1 200 OK", b"HTTP/1.1 403 Forbidden"


async def answers_around(
    base: Path, step: Step, *, make_folder: bool = True, before: Step | None = None
) -> list[bytes]:
    """Two GETs on one keep-alive connection with `step(flags folder)` between them, then one
    on a new connection; each answer's status line. Also checks the origin saw only what
    was answered 200."""
    origin = Origin()
    origin_server = await origin.start()
    config = ProxyConfig(run_dir=base / "run", state_dir=base / "state")
    if make_folder:
        config.flags_dir.mkdir(parents=True)
    if before is not None:
        before(config.flags_dir)
    proxy = ProxyServer(config)
    await proxy.start()
    path = config.run_dir / "sbx" / f"{SANDBOX}.sock"
    await proxy.open_listener(SANDBOX, path, ProxyGrants(localhost_ports={origin.port}), SECRET)
    get = f"GET http://localhost:{origin.port}/ HTTP/1.1\r\nHost: localhost:{origin.port}\r\n\r\n"
    statuses: list[bytes] = []
    try:
        reader, writer = await asyncio.open_unix_connection(str(path))
        for turn in range(3):
            if turn == 2 or (turn == 1 and statuses[0] != OK_LINE):  # a refusal closes it
                writer.close()
                reader, writer = await asyncio.open_unix_connection(str(path))
            writer.write(get.encode())
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            statuses.append(head.split(b"\r\n")[0])
            if statuses[-1] == OK_LINE:
                await asyncio.wait_for(reader.readexactly(len(b"ok\n")), 5)
            if turn == 0:
                step(config.flags_dir)
        writer.close()
    finally:
        await proxy.close()
        origin_server.close()
    assert origin.requests == sum(b" 200 " in status for status in statuses)
    return statuses


def run(
    step: Step, base: Path, *, make_folder: bool = True, before: Step | None = None
) -> list[bytes]:
    return asyncio.run(answers_around(base, step, make_folder=make_folder, before=before))


def test_a_pause_made_between_two_requests_refuses_the_second(base: Path) -> None:
    assert run(lambda folder: set_flag(folder, "pause"), base) == [OK_LINE, REFUSED, REFUSED]


def test_a_flag_renamed_into_place_refuses_the_next_request(base: Path) -> None:
    def rename_in(folder: Path) -> None:
        (folder / "staged").write_bytes(b"")
        os.rename(folder / "staged", folder / f"{SANDBOX}.stop")

    assert run(rename_in, base) == [OK_LINE, REFUSED, REFUSED]


def test_a_flag_that_is_a_link_is_read_by_path_every_time(base: Path) -> None:
    target = base / "elsewhere"

    def link(folder: Path) -> None:  # there from the start, to nothing: not set
        (folder / f"{SANDBOX}.pause").symlink_to(target)

    def fill(folder: Path) -> None:  # no event in the flags folder: only a stat sees it
        target.write_bytes(b"")

    assert run(fill, base, before=link) == [OK_LINE, REFUSED, REFUSED]


def test_the_folder_made_after_the_proxy_started_is_read(base: Path) -> None:
    assert run(lambda folder: set_flag(folder, "pause"), base, make_folder=False) == [
        OK_LINE,
        REFUSED,
        REFUSED,
    ]


def test_the_folder_removed_and_made_again_is_read(base: Path) -> None:
    def replace(folder: Path) -> None:
        folder.rmdir()
        set_flag(folder, "stop")  # a new folder, not yet watched: read by path meanwhile

    assert run(replace, base) == [OK_LINE, REFUSED, REFUSED]


def test_a_cleared_pause_lets_the_next_request_go(base: Path) -> None:
    def clear(folder: Path) -> None:
        (folder / f"{SANDBOX}.pause").unlink()

    paused = run(clear, base, before=lambda folder: set_flag(folder, "pause"))
    assert paused == [REFUSED, OK_LINE, OK_LINE]


def test_while_the_watch_is_on_a_request_reads_no_flag(
    base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[str] = []
    real = watches_module._flag_state

    def counted(path: str) -> tuple[bool, bool]:
        reads.append(path)
        return real(path)

    monkeypatch.setattr(watches_module, "_flag_state", counted)

    def between(folder: Path) -> None:
        reads.clear()  # the first request read both flags; the rest must read none

    assert run(between, base) == [OK_LINE, OK_LINE, OK_LINE]
    assert reads == []
