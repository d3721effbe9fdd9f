"""How long an event loop stalls while some work runs beside a heartbeat (`longest_stall`):
the attack tests of handed sockets (a call that waits in the kernel stalls the whole loop)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable

__all__ = ["BEAT_S", "MAX_GAP_S", "longest_stall"]

BEAT_S = 0.01
MAX_GAP_S = 0.3  # the loop never stalls this long: a blocked call stalls it far longer


async def longest_stall(work: Awaitable[object], run_s: float) -> float:
    """Run `work` for at most `run_s` beside a heartbeat; the heartbeat's longest gap."""
    loop = asyncio.get_running_loop()
    gaps: list[float] = []
    last = [loop.time()]

    async def beat() -> None:
        while True:
            await asyncio.sleep(BEAT_S)
            now = loop.time()
            gaps.append(now - last[0])
            last[0] = now

    beating = asyncio.create_task(beat())
    task = asyncio.ensure_future(work)
    await asyncio.wait([task], timeout=run_s)
    gaps.append(loop.time() - last[0])  # since the last beat: work that ended in a stall
    task.cancel()
    with contextlib.suppress(BaseException):
        await task
    beating.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await beating
    return max(gaps)
