"""Each sandbox's share of the proxy's one event loop while another sandbox has work: at most
`PER_TURN` of its steps in one turn of the loop, and at most its share of the proxy's time
(`time_share`); the rest of its work waits, held, never refused and never dropped.

Why by turns: every sandbox's exchanges are tasks on one loop, and a loop turn runs every
callback that was ready when it began. A sandbox with 48 exchanges ready (a flood of refusals,
lookups or tunnels) made each turn up to 48 steps long (~50-100 µs of Python each), and another
sandbox's next step waited behind all of them. With a share, a turn holds at most `PER_TURN`
steps of each busy sandbox (bench/README.md: a refusal flood saturating the loop, the
measuring sandbox's median 1.9 ms before, 0.61 ms with shares).

Why by time too: turns shared by steps are never left idle, so a flood still took most of the
proxy's core, which on a two-core machine the other sandbox's own client and origin need (its
flooded p99 4-5x its quiet one, session 11). So while sandboxes share the loop, its CPU
(`time.thread_time`, which a wait in epoll does not count) is read where a sandbox's step
begins (`take`, a held step's resumption, `begin`/`owns` for steps resumed otherwise) and
charged to that sandbox up to the next such point, with its lookup threads' CPU (`charge`);
each `_next_turn` takes the charges from the buckets, and a sandbox whose bucket is empty
has its new steps held until the bucket refills
(`time_share.held_for`), which may leave the loop idle while the others have had work in the
last `RECENT_S`. Held work is the sandbox's own: its accept loop (new connections wait in its
listener's backlog), its connections' reads (their bytes wait in the socket; the loop stops
watching them), its lookups' answers. A sandbox alone is never held (no idle holding when
nobody else wants the proxy).

How: a step is counted where a task of a sandbox wakes up (`Conn`'s readiness waits, a
lookup's answer, a connection's first step, the accept loop: `take`). The first count in a
turn schedules `_next_turn` with `call_soon`, which the loop runs in the following turn
(callbacks scheduled during a turn never run in it), so the counts are per turn without any
hook in the loop itself. Past `PER_TURN` steps or `time_share.TURN_SLICE_S` of CPU in one
turn (a flood's 8 steps of ~0.2 ms made a turn too long for another's step ready in it), or
while its bucket is empty, and only while another sandbox took a step in this turn or in the
last `RECENT_S` (`must_wait`), the step waits: `take` gives a future, resolved from
`_next_turn` in first-come order, `PER_TURN` per sandbox per turn (fewer when its steps cost
more: `time_share.wakes`), round-robin across sandboxes, a held sandbox's once its hold ends
(a timer when every waiting sandbox is held). A sandbox alone on the loop is never held back
(the c=64 bench rows pay no extra wake-up, no clock of the thread's CPU).

Limits: this module does NOT
- bound one step's own length: a step that parses a large head or judges a long DNS answer
  runs to its end (the heads and answers are bounded elsewhere), charged after it ran;
- charge exactly: the loop's work from a `_next_turn` to the next step's beginning (its epoll
  call, readiness callbacks, timers, the watches, the admin socket) is no one's, and a task
  resumed by a future no one marked runs on the previous owner's count until its next wait
  (not measured apart since `begin`/`owns`); work outside the loop and
  the lookup threads (the kernel's for a
  sandbox's sockets, other processes such as a flood's own client) is the kernel's to
  schedule (`cgroup_limits.weigh_all` weighs sandboxes below the services);
- share the GIL: a sandbox's lookup threads (`lookup_workers`, 16 per sandbox, for the names
  /etc/hosts does not settle: `hosts_file` answers the rest on the loop) each take the GIL to
  hand their answer back; their CPU is charged, not the loop thread's wait for the GIL;
- hold work already running: a held sandbox's steps in flight run to their next wait, and
  its tunnels' bytes already read are sent;
- make the turn bound exact: steps woken by `_next_turn` run one turn later, beside that
  turn's fresh steps, so a busy sandbox has at most 2 x `PER_TURN` steps in one turn, and its
  CPU there may reach about twice the slice and a step (a step's cost is known after it ran).
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections import deque
from functools import partial
from typing import Any

from lnk_proxy.time_share import (
    BURST_S,
    LOOP_SHARE,
    TURN_SLICE_S,
    averaged,
    charged,
    held_for,
    rate_of,
    refilled,
    wakes,
)

__all__ = ["CURRENT", "PER_TURN", "RECENT_S", "LoopShares", "Share", "must_wait"]

# Steps of one sandbox per loop turn while another has work: a turn then lasts at most a few
# hundred µs per busy sandbox, while 8 still lets a sandbox's burst (a page's requests) through
# in a few turns.
PER_TURN = 8
# How long a sandbox's step keeps the others held to their share: longer than a c=1 client's
# round trip through the proxy and the origin (a few ms loaded), so a sandbox waiting for its
# origin's answer still counts as having work; short enough that one alone soon runs freely.
RECENT_S = 0.1


def must_wait(
    used: int,
    per_turn: int,
    contended: bool,
    turn_s: float = 0.0,
    slice_s: float = float("inf"),
) -> bool:
    """Whether a sandbox's step, the `used`-th of this turn (counting it), after its steps
    took `turn_s` of CPU in this turn, waits for a later turn. Pure: table-tested."""
    return contended and (used > per_turn or turn_s >= slice_s)


class Share:
    """One sandbox's count of steps in the current turn, its steps waiting for a turn, and its
    bucket of the proxy's time (`time_share`)."""

    __slots__ = (
        "balance",
        "charged_s",
        "held_s",
        "held_until",
        "holds",
        "last_at",
        "loop_shares",
        "ran",
        "refilled_at",
        "spent",
        "step_s",
        "turn",
        "used",
        "waiting",
    )

    def __init__(self, loop_shares: LoopShares) -> None:
        self.loop_shares = loop_shares
        self.turn = -1
        self.used = 0
        self.waiting: deque[asyncio.Future[None]] = deque()
        self.spent = 0.0  # CPU seconds of its steps (and lookup threads) not yet charged
        self.ran = 0  # its steps that ran since the last charge (`take`'s and held ones)
        self.step_s = 0.0  # its CPU per step lately (`time_share.averaged`): 0 not known yet
        self.balance = loop_shares.burst_s  # CPU seconds it may still use (`time_share`)
        self.refilled_at = 0.0  # `time.monotonic()` of its bucket's last fill
        self.held_until = 0.0  # its new work waits until then (`time.monotonic()`)
        self.last_at = float("-inf")  # its latest step while sharing (the loop's clock)
        # In all, for the admin socket's `stats` (tests, benches): CPU seconds charged while
        # sharing, holds and their seconds.
        self.charged_s = 0.0
        self.holds = 0
        self.held_s = 0.0

    def take(self) -> asyncio.Future[None] | None:
        """Count a step that is about to run: None to run it now, else a future to await
        first (its turn comes in a later loop turn)."""
        return self.loop_shares.take(self)

    def charge(self, cpu_s: float) -> None:
        """CPU one of its lookup threads spent for it (handed to the loop's thread first)."""
        self.loop_shares.charge(self, cpu_s)

    def begin(self) -> None:
        """A step of this sandbox runs from here though no `take` counted it (a task resumed
        by another future: a dial's connect, the callback path's hand-over): its CPU is
        this sandbox's, not the loop's own."""
        self.loop_shares.begin(self)

    def owns(self, future: asyncio.Future[Any]) -> None:
        """The step that `future`'s completion resumes is this sandbox's (call before anyone
        awaits it: the first of its callbacks runs just before that step)."""
        future.add_done_callback(partial(self.loop_shares.resumed, self))


class LoopShares:
    """The shares of one event loop (one per proxy). The event loop's thread only.

    Cheap while one sandbox has the loop to itself (the common case, and every bench row but
    the fairness one): a step is then a clock read and a few comparisons, with no callback
    scheduled and no clock of the thread's CPU; the per-turn counting and the time accounting
    start only once another sandbox took a step in the last `recent_s`."""

    def __init__(
        self,
        per_turn: int = PER_TURN,
        recent_s: float = RECENT_S,
        *,
        loop_share: float = LOOP_SHARE,
        burst_s: float = BURST_S,
        slice_s: float = TURN_SLICE_S,
    ) -> None:
        self.per_turn = per_turn
        self.slice_s = slice_s
        self.recent_s = recent_s
        self.loop_share = loop_share
        self.burst_s = burst_s
        self.turn = 0
        self._latest: Share | None = None  # the share that took the latest step
        self._latest_at = float("-inf")  # when (the loop's clock)
        self._other_at = float("-inf")  # the latest step of any other share than `_latest`
        self._other: Share | None = None  # whose
        self._waiting: deque[Share] = deque()  # shares with steps waiting, in order of arrival
        self._scheduled = False
        self._active: set[Share] = set()  # shares with a step in the last `recent_s`
        self._spent: list[Share] = []  # shares with CPU not yet charged
        self._owner: Share | None = None  # whose step the loop runs since `_mark`
        self._mark = 0.0  # the loop thread's CPU then (`time.thread_time()`)
        self._release: asyncio.TimerHandle | None = None  # a turn when a held share refills
        self._release_due = 0.0  # when (the loop's clock)

    def share(self) -> Share:
        return Share(self)

    def take(self, share: Share) -> asyncio.Future[None] | None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        if share is not self._latest:
            self._other_at, self._other, self._latest = self._latest_at, self._latest, share
        self._latest_at = now
        if not share.waiting and now - self._other_at > self.recent_s:
            self._owner = None  # alone on the loop lately: nothing to share, nothing counted
            return None
        at = time.monotonic()
        share.last_at = now
        self._active.add(share)
        other = self._other
        if other is not None and other.last_at < self._other_at:  # it had work as well
            other.last_at = self._other_at
            self._active.add(other)
        if not self._scheduled:
            loop.call_soon(self._next_turn)
            self._scheduled = True
        if share.turn != self.turn:
            share.turn, share.used = self.turn, 0
        share.used += 1
        if not share.waiting and share.held_until <= at:
            turn_s = share.spent  # its CPU in this turn so far (charged at each turn's end)
            if self._owner is share:
                turn_s += time.thread_time() - self._mark
            if not must_wait(share.used, self.per_turn, True, turn_s, self.slice_s):
                self._switch(share)  # its step runs from here
                share.ran += 1
                return None
        future: asyncio.Future[None] = loop.create_future()
        # first of its callbacks: run just before the waiting step resumes (a task's wake-up,
        # `fast_exchange`'s callback), so that step's CPU is this share's
        future.add_done_callback(partial(self._resumed, share))
        if not share.waiting:
            self._waiting.append(share)
        share.waiting.append(future)
        return future

    def charge(self, share: Share, cpu_s: float) -> None:
        if share.last_at < asyncio.get_running_loop().time() - self.recent_s:
            return  # not sharing now: nothing is accounted
        self._add(share, cpu_s)

    def _add(self, share: Share, cpu_s: float) -> None:
        if share.spent == 0.0:
            self._spent.append(share)
        share.spent += cpu_s

    def _switch(self, share: Share | None) -> None:
        """The loop's CPU since the last switch is its owner's; from now on `share`'s."""
        cpu = time.thread_time()
        if self._owner is not None and cpu > self._mark:
            self._add(self._owner, cpu - self._mark)
        self._owner, self._mark = share, cpu

    def begin(self, share: Share) -> None:
        now = asyncio.get_running_loop().time()
        if self._owner is not share and now - share.last_at <= self.recent_s:
            self._switch(share)  # sharing now: the step's CPU is counted

    def resumed(self, share: Share, future: asyncio.Future[Any]) -> None:
        if not future.cancelled():
            self.begin(share)

    def _resumed(self, share: Share, future: asyncio.Future[None]) -> None:
        if not future.cancelled():  # a held step: sharing, by how it came to wait
            self._switch(share)
            share.ran += 1

    def _next_turn(self) -> None:
        self.turn += 1
        self._scheduled = False
        self._switch(None)  # what runs next is the loop's own until a step begins
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        busy = self._busy(loop.time())
        rate = rate_of(busy, self.loop_share)
        self._account(now, busy, rate)
        waiting = 0  # shares left with steps that may run in the next turn
        for _ in range(len(self._waiting)):
            share = self._waiting.popleft()
            woken = 0
            if share.held_until <= now or busy <= 1:
                # a slice's worth by its steps' cost, so the turn they run in stays short
                most = wakes(share.step_s, self.slice_s, self.per_turn)
                while share.waiting and woken < most:
                    future = share.waiting.popleft()
                    if not future.done():  # a cancelled waiter (its sandbox stopped) takes none
                        future.set_result(None)
                        woken += 1
            if share.waiting:
                self._waiting.append(share)  # round-robin: after the others
                waiting += share.held_until <= now or busy <= 1
        if waiting:
            loop.call_soon(self._next_turn)
            self._scheduled = True
        elif self._waiting:  # every share left is held: a turn when the first refills
            first = min(share.held_until for share in self._waiting)
            self._release_at(loop, max(first - now, 0.0))

    def _busy(self, now: float) -> int:
        """Shares with a step (or a step waiting) in the last `recent_s`; the rest dropped."""
        horizon = now - self.recent_s
        self._active = {s for s in self._active if s.last_at >= horizon or s.waiting}
        return len(self._active)

    def _account(self, now: float, busy: int, rate: float) -> None:
        """The CPU spent since the last turn charged to its shares; their holds."""
        spent, self._spent = self._spent, []
        for share in spent:
            share.balance = refilled(share.balance, now - share.refilled_at, rate, self.burst_s)
            share.refilled_at = now
            if busy <= 1:
                share.balance = self.burst_s  # alone: nothing owed, the whole proxy its own
            else:
                share.balance = charged(share.balance, share.spent)
                share.charged_s += share.spent
            share.step_s = averaged(share.step_s, share.spent, share.ran)
            share.spent, share.ran = 0.0, 0
            hold = held_for(share.balance, rate, busy)
            share.held_until = now + hold
            if hold > 0.0:
                share.holds += 1
                share.held_s += hold

    def _release_at(self, loop: asyncio.AbstractEventLoop, delay: float) -> None:
        due = loop.time() + delay
        if self._release is not None:
            if self._release_due <= due:
                return  # an earlier one comes first and looks again
            self._release.cancel()
        self._release, self._release_due = loop.call_later(delay, self._released), due

    def _released(self) -> None:
        self._release = None
        if not self._scheduled:
            asyncio.get_running_loop().call_soon(self._next_turn)
            self._scheduled = True


# The share of the sandbox whose exchange the running task serves: set at the start of each
# connection's task (tasks it starts inherit it); None outside any sandbox's work.
CURRENT: contextvars.ContextVar[Share | None] = contextvars.ContextVar("lnk_share", default=None)
