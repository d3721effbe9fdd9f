"""The two kernel watches the proxy's decisions read: this machine's view (`machine_watch`:
read again whenever a link, address or route changed, on its own thread) and the sandboxes'
stop and pause flags (`flag_watch`: a flag read again whenever the folder's inotify watch
says a name of its sandbox changed, and on every request while there is no watch; a flag
that cannot be checked counts as set). One poll of both, with no wait, before a decision
(`take_events`): the loop's readers would take what the kernel queued one turn later.

Each listener's watcher (`watch_stop`) polls its stop flag every `FLAG_POLL_S` and closes
every connection of that sandbox, open tunnels and requests in flight included.
"""

from __future__ import annotations

import asyncio
import logging
import os
import select
import stat
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol, TypeVar

from lnk_proxy import limits, machine
from lnk_proxy.config import ProxyConfig
from lnk_proxy.flag_watch import EVERYTHING, FlagWatch
from lnk_proxy.listeners import Listener, Refusal
from lnk_proxy.machine_watch import MachineWatch
from lnk_proxy.policy import MachineView
from lnk_proxy.route_check import RouteChecker
from lnk_proxy.wire_log import WireLog
from lnk_shared.errors import StateError

__all__ = ["Watches"]

log = logging.getLogger(__name__)

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class _KernelWatch(Protocol[T_co]):
    """A kernel watch's descriptor (`MachineWatch`, `FlagWatch`): what `drain` says changed."""

    def fileno(self) -> int: ...

    def drain(self) -> T_co: ...

    def close(self) -> None: ...


class Watches:
    """This machine's view and the flags as they are now, for `listeners` (the server's)."""

    def __init__(
        self, config: ProxyConfig, routes: RouteChecker | None, listeners: dict[str, Listener]
    ) -> None:
        self.config = config
        self.routes = routes
        self._listeners = listeners
        self.machine: MachineView | None = None
        self._watch: MachineWatch | None = None
        self._flag_watch: FlagWatch | None = None
        self._events = select.poll()  # the two watches: one poll, with no wait, per decision
        self._stale = False
        self._refresher: asyncio.Task[None] | None = None
        # Reads the machine view: its own thread, never behind sandboxes' lookups.
        self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="machine-view")

    async def start(self) -> None:
        """Read this machine (StateError if it cannot), and read it again whenever the kernel
        says a link, address or route changed; watch the flags folder where it can."""
        self._watch = MachineWatch()
        await self.refresh_machine(fatal=True)
        self._follow(self._watch, self._machine_changed)
        try:
            self._flag_watch = FlagWatch(self.config.flags_dir)
        except StateError as exc:
            log.warning("%s", exc)
        else:
            self._flag_watch.arm()
            self._follow(self._flag_watch, self._flags_changed)

    async def close(self) -> None:
        if self._watch is not None:
            self._unfollow(self._watch)
            self._watch = None
        if self._flag_watch is not None:
            self._unfollow(self._flag_watch)
            self._flag_watch = None
        if self._refresher is not None:
            self._refresher.cancel()
            await asyncio.gather(self._refresher, return_exceptions=True)
        self._reader.shutdown(wait=False, cancel_futures=True)

    def _follow(self, watch: _KernelWatch[object], changed: Callable[[], None]) -> None:
        """`changed` runs when the loop sees `watch` ready, and from `take_events`' poll."""
        asyncio.get_running_loop().add_reader(watch.fileno(), changed)
        self._events.register(watch.fileno(), select.POLLIN)

    def _unfollow(self, watch: _KernelWatch[object]) -> None:
        """Neither the loop nor `take_events` reads `watch` again; it is closed."""
        asyncio.get_running_loop().remove_reader(watch.fileno())
        self._events.unregister(watch.fileno())
        watch.close()

    async def refresh_machine(self, *, fatal: bool = False) -> None:
        """Read the view on the proxy's own thread: never queued behind sandboxes' lookups."""
        try:
            networks = self.config.public_networks
            loop = asyncio.get_running_loop()
            self.machine = await loop.run_in_executor(
                self._reader, machine.read_machine_view, networks
            )
        except Exception:
            if fatal or self.machine is None:
                raise
            log.exception("reading this machine's addresses failed; the previous view is kept")

    def _machine_changed(self) -> None:
        if self._watch is None:
            return
        failed = "reading netlink change messages failed; reading the view again"
        changed = _drained(self._watch, True, failed)
        if not changed:
            return
        if self.routes is not None:
            self.routes.invalidate()
        self._stale = True
        if self._refresher is None or self._refresher.done():
            self._refresher = asyncio.create_task(self._refresh_while_stale())

    def _flags_changed(self) -> None:
        """The flags watch said something: forget the flags of the sandboxes it names (of all,
        when it cannot say), so their next decision reads them again."""
        if self._flag_watch is None:
            return
        failed = "reading the flags watch failed; every flag is read again"
        changed = _drained(self._flag_watch, EVERYTHING, failed)
        if changed is EVERYTHING:
            self._flags_changed_everywhere()
            return
        for name in changed:
            listener = self._listeners.get(name.rpartition(".")[0])
            if listener is not None:
                listener.flags_known = False

    def take_events(self) -> None:
        """What the kernel queued on the two watches, taken now: before a decision uses the
        flags or the kernel's routes (the loop's readers would take it one turn later)."""
        if not self._events.poll(0):
            return
        self._machine_changed()
        self._flags_changed()

    async def _refresh_while_stale(self) -> None:
        # Changes that arrive during a read make it stale again: one more read follows.
        while self._stale:
            self._stale = False
            await self.refresh_machine()

    async def watch_stop(self, listener: Listener, wire_log: WireLog) -> None:
        stop_flag = self.config.flags_dir / f"{listener.sandbox}.stop"
        while True:
            await asyncio.sleep(limits.FLAG_POLL_S)
            if _flag_set(stop_flag):
                listener.pool.close()
                for task in list(listener.connections):
                    task.cancel()
            listener.pool.sweep()
            wire_log.flush(listener.sandbox)  # the counts of ended refusal windows
            watch = self._flag_watch
            if watch is not None and not watch.armed and watch.arm():  # the folder is back
                self._flags_changed_everywhere()

    def _flags_changed_everywhere(self) -> None:
        for listener in self._listeners.values():
            listener.flags_known = False

    def flags(self, listener: Listener) -> Refusal | None:
        """The stop and pause flags as they are now: as last read while the watch has said
        no name of this sandbox changed since, else read (and kept while the watch is on)."""
        self.take_events()
        if listener.flags_known:
            return listener.flag_refusal
        refusal, by_path = None, False
        for path, name, rule in listener.flags:
            is_set, link = _flag_state(path)
            by_path = by_path or link
            if is_set:
                refusal = Refusal(rule, f"the sandbox's {name} flag is set")
                break
        watch = self._flag_watch
        if watch is not None and watch.armed and not by_path:
            listener.flag_refusal, listener.flags_known = refusal, True
        return refusal


def _drained(watch: _KernelWatch[T], lost: T, failed: str) -> T:
    """What `watch` says changed; `lost` (everything may have) when it cannot be read, logged
    as `failed`: a read that fails never counts as no change."""
    try:
        return watch.drain()
    except OSError:
        log.exception("%s", failed)
        return lost


def _flag_set(path: Path | str) -> bool:
    """Whether a flag file exists; one that cannot be checked (EACCES, ELOOP) counts as set,
    so a flags folder the proxy cannot read stops sandboxes instead of freeing them."""
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as exc:
        log.error("cannot check the flag %s (%s): taken as set", path, exc)
    return True


def _flag_state(path: str) -> tuple[bool, bool]:
    """Whether a flag is set, and whether it is a link (then read by path every time: a
    change to its target is not a change the folder's watch sees)."""
    try:
        info = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False, False
    except OSError as exc:
        log.error("cannot check the flag %s (%s): taken as set", path, exc)
        return True, False
    if stat.S_ISLNK(info.st_mode):
        return _flag_set(path), True
    return True, False
