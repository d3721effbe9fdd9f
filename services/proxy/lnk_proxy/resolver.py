"""Resolve a name the policy let through to every address it has, once per request.

`SystemResolver` asks this machine's resolver (`getaddrinfo`, IPv4 and IPv6 together), in
bounded time, on threads of its own, kept between lookups (`lookup_workers`: the event loop
never waits for a thread to start), except for the answers /etc/hosts settles, which
`hosts_file` reads on the loop itself as getaddrinfo would give them (no thread, no GIL
hand-back: a flood of such lookups cost other sandboxes' requests most of their tail). The
proxy keeps one resolver per sandbox, so one sandbox's lookups
never wait for, nor hold, a pool another sandbox or the proxy's own work needs. At most
`MAX_LOOKUPS` of its lookups run at once, counted until their thread ends (not until the wait
for it gave up): past that `resolve` raises `ResolverBusy` at once, which the server refuses
(`too-many-lookups`). Lookups of one name in flight are shared. `UnsafeTableResolver` (test
boxes only) answers from a JSON file instead, read anew on every lookup so a test can change a
name's answer. Either way a name with no answer,
a failed lookup or a timeout gives an empty tuple, which the policy refuses (`no-address`).

Trusts: the caller to pass only a normalized name that `judge_target` accepted; a name the
policy refused must never reach a resolver (it would leak the name to whoever serves DNS).

Security limitations: this module does NOT
- judge the answer: every address goes to `judge_addresses`, which refuses the whole answer
  if any one of them is refused;
- judge a cached answer: `AnswerCache` (the proxy keeps one per sandbox, for the system
  resolver only) reuses a name's answer for `ANSWER_CACHE_S`, but every request judges the
  answer it gets again and dials exactly the address it judged, never the name, so a changed
  answer (DNS rebinding) is at most seen `ANSWER_CACHE_S` late and nothing unjudged is dialed;
  the test table is never cached (tests change answers between two requests);
- stop a lookup's thread: `getaddrinfo` cannot be interrupted, so a thread outlives a timeout
  or a cancelled request (bounded by the system resolver's own timeouts in /etc/resolv.conf);
  the caller's wait ends at `RESOLVE_TIMEOUT_S` or when cancelled, and the thread keeps its
  sandbox's slot until it returns: a dead DNS server stalls only the sandboxes that ask it,
  each holding at most `MAX_LOOKUPS` threads;
- see /etc/hosts entries pointing a listed name at this machine any differently: they are
  answers like any other and judged as such.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from lnk_proxy.hosts_file import HostsFile
from lnk_proxy.lookup_workers import LookupWorkers
from lnk_proxy.policy import MAX_ANSWER_ADDRESSES
from lnk_shared.addresses import IPAddress
from lnk_shared.errors import StateError
from lnk_shared.hosts import normalize_name

__all__ = [
    "ANSWER_CACHE_S",
    "MAX_ADDRESSES",
    "MAX_LOOKUPS",
    "RESOLVE_TIMEOUT_S",
    "AnswerCache",
    "Resolver",
    "ResolverBusy",
    "SystemResolver",
    "UnsafeTableResolver",
    "make_resolver",
]

log = logging.getLogger(__name__)

RESOLVE_TIMEOUT_S = 5.0  # glibc's default per-server timeout: a slower answer is a dead server
# The policy's bound; a longer answer is kept one past it, so the policy refuses it whole
# (`answer-too-long`) rather than judge a part.
MAX_ADDRESSES = MAX_ANSWER_ADDRESSES
# Lookups of one sandbox's resolver running at once: a browser opens ~6 names at a time; a
# thread each (~100 KiB of stack committed at most), held until getaddrinfo returns.
MAX_LOOKUPS = 16
MAX_TABLE_BYTES = 1 << 20  # a test table is a few lines; a larger file is a mistake
# Far below the TTLs names are published with (minutes): a cached answer is one the name's DNS
# still gives. Saves a worker-thread hop and a lookup per request (a third of a small one).
ANSWER_CACHE_S = 5.0
MAX_CACHED_NAMES = 256  # per sandbox; the oldest entry goes first


class Resolver(Protocol):
    caches_answers: bool  # whether a caller may keep its answers for ANSWER_CACHE_S

    async def resolve(self, name: str) -> tuple[IPAddress, ...]:
        """Every address of `name`, deduplicated, in the resolver's order; () for none."""
        ...


class AnswerCache:
    """A name's non-empty answer for `ttl_s` (no answer is never kept: asked again each time)."""

    def __init__(self, ttl_s: float = ANSWER_CACHE_S, max_names: int = MAX_CACHED_NAMES) -> None:
        self.ttl_s = ttl_s
        self.max_names = max_names
        self._answers: dict[str, tuple[float, tuple[IPAddress, ...]]] = {}

    def get(self, name: str) -> tuple[IPAddress, ...] | None:
        entry = self._answers.get(name)
        if entry is None:
            return None
        if time.monotonic() >= entry[0]:
            del self._answers[name]
            return None
        return entry[1]

    def put(self, name: str, answer: tuple[IPAddress, ...]) -> None:
        if not answer:
            return
        self._answers.pop(name, None)
        if len(self._answers) >= self.max_names:
            del self._answers[next(iter(self._answers))]  # insertion order: the oldest
        self._answers[name] = (time.monotonic() + self.ttl_s, answer)

    def clear(self) -> None:
        self._answers.clear()


def _dedupe(addresses: list[IPAddress]) -> tuple[IPAddress, ...]:
    return tuple(dict.fromkeys(addresses))[: MAX_ADDRESSES + 1]


class ResolverBusy(StateError):
    """A sandbox's resolver has `MAX_LOOKUPS` lookups running: the request is refused."""


def _getaddrinfo(name: str) -> list[tuple[Any, ...]]:
    return socket.getaddrinfo(
        name, None, family=socket.AF_UNSPEC, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
    )


_Outcome = tuple[list[tuple[Any, ...]], BaseException | None]  # getaddrinfo's list, or its error


class SystemResolver:
    """This machine's resolver, `getaddrinfo` on kept threads, one lookup each; one per sandbox."""

    caches_answers = True

    def __init__(
        self,
        timeout_s: float = RESOLVE_TIMEOUT_S,
        max_lookups: int = MAX_LOOKUPS,
        hosts_file: HostsFile | None = None,
    ) -> None:
        self.hosts_file = hosts_file if hosts_file is not None else HostsFile()
        self.timeout_s = timeout_s
        self.max_lookups = max_lookups
        self.running = 0  # lookups not yet returned, timed-out ones included
        # Given each lookup thread's CPU for its job, on the loop (`fair_share.Share.charge`:
        # the sandbox's share of the proxy's time counts its threads too).
        self.charge: Callable[[float], None] | None = None
        self._pending: dict[str, asyncio.Future[_Outcome]] = {}
        self._workers = LookupWorkers(max_lookups)

    def _start(self, name: str) -> asyncio.Future[_Outcome]:
        pending = self._pending.get(name)
        if pending is not None:
            return pending  # the same name in flight: one lookup serves every asker
        if self.running >= self.max_lookups:
            raise ResolverBusy(f"{self.running} lookups of this sandbox are still running")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[_Outcome] = loop.create_future()

        def done(
            infos: list[tuple[Any, ...]] | None, error: BaseException | None, cpu_s: float
        ) -> None:
            self.running -= 1
            if self.charge is not None:
                self.charge(cpu_s)
            if self._pending.get(name) is future:
                del self._pending[name]
            if not future.done():  # an error is a result: no waiter may be left to read it
                future.set_result((infos or [], error))

        def work() -> None:
            started = time.thread_time()  # this thread's own CPU, not the lookup's wait
            try:
                infos, error = _getaddrinfo(name), None
            except BaseException as exc:  # handed to the loop, never lost
                infos, error = None, exc
            cpu_s = time.thread_time() - started
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
                loop.call_soon_threadsafe(done, infos, error, cpu_s)

        # queued for a kept thread, never started here (`lookup_workers`); RuntimeError (no
        # thread could be started) reaches the caller: nothing counted
        self._workers.submit(work, self.running + 1)
        self.running += 1
        self._pending[name] = future
        return future

    async def resolve(self, name: str) -> tuple[IPAddress, ...]:
        settled = self.hosts_file.answer(name)
        if settled is not None:
            return settled  # no address: refused as `no-address`, as getaddrinfo's would be
        future = self._start(name)
        try:
            # shield: a timed-out or cancelled wait leaves the lookup to its other askers
            infos, error = await asyncio.wait_for(asyncio.shield(future), self.timeout_s)
            if error is not None:
                raise error
        except (OSError, TimeoutError, UnicodeError) as exc:  # gaierror is an OSError
            log.info("resolving %r gave no address: %s", name[:80], exc)
            return ()
        addresses: list[IPAddress] = []
        for family, _, _, _, sockaddr in infos:
            if family not in (socket.AF_INET, socket.AF_INET6):
                continue
            try:
                addresses.append(ipaddress.ip_address(sockaddr[0]))
            except ValueError:
                log.warning("the resolver answered %r with a non-address: skipped", name[:80])
        return _dedupe(addresses)


class UnsafeTableResolver:
    """Answers from a JSON object `{"name": ["address", ...]}`: test boxes only.

    Checked on every lookup (a test changes answers while the proxy runs): the file is parsed
    again whenever its inode, size or modification time changed. Each lookup is logged. A
    missing, unreadable or malformed table answers nothing, so every name is refused.
    """

    caches_answers = False  # a test changes an answer and expects the next request to see it

    def __init__(self, path: Path, *, kept: bool = False) -> None:
        self.path = path
        self.caches_answers = kept  # `unsafe_dns_table_kept`: kept as real lookups' are
        self._parsed: tuple[tuple[int, int, int], dict[str, tuple[IPAddress, ...]]] | None = None

    async def resolve(self, name: str) -> tuple[IPAddress, ...]:
        log.warning("unsafe_dns_table: %r answered from %s, not the resolver", name[:80], self.path)
        try:
            info = self.path.stat()
            version = (info.st_ino, info.st_size, info.st_mtime_ns)
            if self._parsed is None or self._parsed[0] != version:
                self._parsed = (version, read_table(self.path))
            table = self._parsed[1]
        except (OSError, ValueError) as exc:
            self._parsed = None
            log.error("unsafe_dns_table %s is unusable, nothing resolves: %s", self.path, exc)
            return ()
        return table.get(name, ())


def read_table(path: Path) -> dict[str, tuple[IPAddress, ...]]:
    """The table at `path`, names normalized; ValueError naming what is wrong."""
    with path.open("rb") as file:
        raw = file.read(MAX_TABLE_BYTES + 1)
    if len(raw) > MAX_TABLE_BYTES:
        raise ValueError(f"over {MAX_TABLE_BYTES} bytes")
    document = json.loads(raw.decode("utf-8"))
    if not isinstance(document, dict):
        raise ValueError("not a JSON object of name -> [addresses]")
    table: dict[str, tuple[IPAddress, ...]] = {}
    for key, value in document.items():
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"{key!r}: not a list of address strings")
        table[normalize_name(key)] = _dedupe([ipaddress.ip_address(v) for v in value])
    return table


def make_resolver(unsafe_dns_table: Path | None, *, kept: bool = False) -> Resolver:
    """A sandbox's own system resolver, or the test table when the config names one (its
    answers kept as the system resolver's when `kept`)."""
    if unsafe_dns_table is not None:
        return UnsafeTableResolver(unsafe_dns_table, kept=kept)
    return SystemResolver()
