"""Each sandbox's share of the proxy's one event loop: at most `PER_TURN` of a sandbox's steps
run in one turn of the loop while another sandbox has work too; the rest wait for later turns.

Why: every sandbox's exchanges are tasks on one loop, and a loop turn runs every callback that
was ready when it began. A sandbox with 48 exchanges ready (a flood of refusals, lookups or
tunnels) made each turn up to 48 steps long (~50-100 µs of Python each), and another sandbox's
next step waited behind all of them. With a share, a turn holds at most `PER_TURN` steps of
each busy sandbox, so a step of a sandbox with little work waits for a few of the flood's, not
for all of them (bench/README.md: a refusal flood saturating the loop, the measuring sandbox's
median 1.9 ms before, 0.61 ms with shares).

How: a step is counted where a task of a sandbox wakes up (`Conn`'s readiness waits, a
lookup's answer, a connection's first step, the accept loop: `take`). The first count in a
turn schedules `_next_turn` with `call_soon`, which the loop runs in the following turn
(callbacks scheduled during a turn never run in it), so the counts are per turn without any
hook in the loop itself. Past `PER_TURN` in one turn, and only while another sandbox took a
step in this turn or in the last `RECENT_S` (`must_wait`), the step waits: `take` gives a
future, resolved from `_next_turn` in first-come order, `PER_TURN` per sandbox per turn,
round-robin across sandboxes. A sandbox alone on the loop is never held back (the c=64 bench
rows pay no extra wake-up).

Limits: this module does NOT
- bound one step's own length: a step that parses a large head or judges a long DNS answer
  runs to its end (the heads and answers are bounded elsewhere);
- share the CPU outside the loop, nor the GIL: a sandbox's lookup threads (`lookup_workers`,
  16 per sandbox, for the names /etc/hosts does not settle: `hosts_file` answers the rest on
  the loop) each take the GIL to hand their answer back, and under a flood of such lookups
  the loop thread waits for them at its own syscalls; the kernel's work for a
  sandbox's sockets and other processes (a flood's own client) are the kernel's to schedule
  (`cgroup_limits.weigh_all` weighs sandboxes below the services);
- count work the loop runs without a task of a sandbox waking (timers, the watches' readers,
  the admin socket): those are the proxy's own and few;
- make the bound exact: steps woken by `_next_turn` run one turn later, beside that turn's
  fresh `PER_TURN`, so a busy sandbox has at most 2 x `PER_TURN` steps in one turn.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections import deque

__all__ = ["CURRENT", "PER_TURN", "RECENT_S", "LoopShares", "Share", "must_wait"]

# Steps of one sandbox per loop turn while another has work: a turn then lasts at most a few
# hundred µs per busy sandbox, while 8 still lets a sandbox's burst (a page's requests) through
# in a few turns.
PER_TURN = 8
# How long a sandbox's step keeps the others held to their share: longer than a c=1 client's
# round trip through the proxy and the origin (a few ms loaded), so a sandbox waiting for its
# origin's answer still counts as having work; short enough that one alone soon runs freely.
RECENT_S = 0.1


def must_wait(used: int, per_turn: int, contended: bool) -> bool:
    """Whether a sandbox's step, the `used`-th of this turn (counting it), waits for a later
    turn. Pure: table-tested."""
    return contended and used > per_turn


class Share:
    """One sandbox's count of steps in the current turn, and its steps waiting for a turn."""

    __slots__ = ("loop_shares", "turn", "used", "waiting")

    def __init__(self, loop_shares: LoopShares) -> None:
        self.loop_shares = loop_shares
        self.turn = -1
        self.used = 0
        self.waiting: deque[asyncio.Future[None]] = deque()

    def take(self) -> asyncio.Future[None] | None:
        """Count a step that is about to run: None to run it now, else a future to await
        first (its turn comes in a later loop turn)."""
        return self.loop_shares.take(self)


class LoopShares:
    """The shares of one event loop (one per proxy). The event loop's thread only.

    Cheap while one sandbox has the loop to itself (the common case, and every bench row but
    the fairness one): a step is then a clock read and a few comparisons, with no callback
    scheduled; the per-turn counting starts only once another sandbox took a step in the last
    `recent_s`."""

    def __init__(self, per_turn: int = PER_TURN, recent_s: float = RECENT_S) -> None:
        self.per_turn = per_turn
        self.recent_s = recent_s
        self.turn = 0
        self._latest: Share | None = None  # the share that took the latest step
        self._latest_at = float("-inf")  # when
        self._other_at = float("-inf")  # the latest step of any other share than `_latest`
        self._waiting: deque[Share] = deque()  # shares with steps waiting, in order of arrival
        self._scheduled = False

    def share(self) -> Share:
        return Share(self)

    def take(self, share: Share) -> asyncio.Future[None] | None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        if share is not self._latest:
            self._other_at, self._latest = self._latest_at, share
        self._latest_at = now
        if not share.waiting and now - self._other_at > self.recent_s:
            return None  # alone on the loop lately: nothing to share
        if not self._scheduled:
            loop.call_soon(self._next_turn)
            self._scheduled = True
        if share.turn != self.turn:
            share.turn, share.used = self.turn, 0
        share.used += 1
        if not share.waiting and not must_wait(share.used, self.per_turn, contended=True):
            return None
        future: asyncio.Future[None] = loop.create_future()
        if not share.waiting:
            self._waiting.append(share)
        share.waiting.append(future)
        return future

    def _next_turn(self) -> None:
        self.turn += 1
        self._scheduled = False
        for _ in range(len(self._waiting)):
            share = self._waiting.popleft()
            woken = 0
            while share.waiting and woken < self.per_turn:
                future = share.waiting.popleft()
                if not future.done():  # a cancelled waiter (its sandbox stopped) takes none
                    future.set_result(None)
                    woken += 1
            if share.waiting:
                self._waiting.append(share)  # round-robin: after the others
        if self._waiting and not self._scheduled:
            asyncio.get_running_loop().call_soon(self._next_turn)
            self._scheduled = True


# The share of the sandbox whose exchange the running task serves: set at the start of each
# connection's task (tasks it starts inherit it); None outside any sandbox's work.
CURRENT: contextvars.ContextVar[Share | None] = contextvars.ContextVar("lnk_share", default=None)
