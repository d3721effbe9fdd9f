"""Each sandbox's share of the event loop: a busy sandbox runs at most `per_turn` steps in a
turn while another has work, is never held back alone, and every held step runs later."""

from __future__ import annotations

import asyncio

import pytest

from lnk_proxy.fair_share import PER_TURN, LoopShares, Share, must_wait


@pytest.mark.parametrize(
    ("used", "per_turn", "contended", "waits"),
    [
        (1, 8, True, False),
        (8, 8, True, False),
        (9, 8, True, True),
        (100, 8, True, True),
        (9, 8, False, False),  # alone on the loop: never held back
        (1000, 8, False, False),
        (2, 1, True, True),
    ],
)
def test_must_wait(used: int, per_turn: int, contended: bool, waits: bool) -> None:
    assert must_wait(used, per_turn, contended) is waits


async def _step(share: Share) -> None:
    """One wake-up of a task of `share`'s sandbox, as `Conn._wait` does it."""
    await asyncio.sleep(0)  # the readiness this step waited for
    turn = share.take()
    if turn is not None:
        await turn


class _Turns:
    """Counts the loop's turns (a callback that schedules itself once per turn)."""

    def __init__(self) -> None:
        self.now = 0
        self._running = True
        asyncio.get_running_loop().call_soon(self._tick)

    def _tick(self) -> None:
        self.now += 1
        if self._running:
            asyncio.get_running_loop().call_soon(self._tick)

    def stop(self) -> None:
        self._running = False


async def _flood_beside_one(per_turn: int, flood_tasks: int, steps: int) -> dict[str, object]:
    shares = LoopShares(per_turn)
    flood, measured = shares.share(), shares.share()
    turns = _Turns()
    flood_turns: list[int] = []
    measured_turns: list[int] = []

    async def worker(share: Share, seen: list[int]) -> None:
        for _ in range(steps):
            await _step(share)
            seen.append(turns.now)

    tasks = [asyncio.create_task(worker(flood, flood_turns)) for _ in range(flood_tasks)]
    tasks.append(asyncio.create_task(worker(measured, measured_turns)))
    await asyncio.gather(*tasks)
    turns.stop()
    return {"flood": flood_turns, "measured": measured_turns}


def test_a_flooding_sandbox_runs_at_most_twice_its_share_per_turn_beside_another() -> None:
    seen = asyncio.run(_flood_beside_one(per_turn=4, flood_tasks=48, steps=20))
    flood, measured = seen["flood"], seen["measured"]
    assert isinstance(flood, list) and isinstance(measured, list)
    per_turn: dict[int, int] = {}
    for turn in flood:
        if turn > measured[0]:  # once the measured sandbox is known to have work
            per_turn[turn] = per_turn.get(turn, 0) + 1
    assert len(flood) == 48 * 20  # every step ran in the end
    assert max(per_turn.values()) <= 2 * 4  # fresh steps plus the ones woken for this turn
    # the measured sandbox's 20 steps did not each wait for the flood's 48 tasks
    assert measured[-1] - measured[0] < 20 * 48 / 4


async def _alone(per_turn: int, tasks: int) -> int:
    shares = LoopShares(per_turn)
    share = shares.share()
    held = 0

    async def worker() -> None:
        nonlocal held
        for _ in range(5):
            await asyncio.sleep(0)
            turn = share.take()
            if turn is not None:
                held += 1
                await turn

    await asyncio.gather(*(worker() for _ in range(tasks)))
    return held


def test_a_sandbox_alone_on_the_loop_is_never_held_back() -> None:
    assert asyncio.run(_alone(per_turn=2, tasks=64)) == 0


def test_without_shares_the_flood_fills_every_turn() -> None:
    """The attack's shape: with no share (a share so large it never holds), all 48 of the
    flood's tasks run in one turn, so another sandbox's step waits behind all of them."""
    seen = asyncio.run(_flood_beside_one(per_turn=10_000, flood_tasks=48, steps=3))
    flood = seen["flood"]
    assert isinstance(flood, list)
    per_turn: dict[int, int] = {}
    for turn in flood:
        per_turn[turn] = per_turn.get(turn, 0) + 1
    assert max(per_turn.values()) >= 48


async def _cancelled_waiter() -> bool:
    shares = LoopShares(1)
    a, b = shares.share(), shares.share()
    assert b.take() is None
    assert a.take() is None
    held = a.take()
    assert held is not None
    later = a.take()
    assert later is not None
    held.cancel()  # its sandbox stopped: the next waiter still gets its turn
    await asyncio.wait_for(later, timeout=5)
    return later.done()


def test_a_cancelled_waiter_does_not_keep_the_next_one_waiting() -> None:
    assert asyncio.run(_cancelled_waiter())


def test_the_default_share_is_a_few_steps() -> None:
    assert 1 <= PER_TURN <= 16
