"""The descriptor share as a table: a sandbox always gets its reserve, past it only what no
other sandbox's reserve holds, and the whole never passes the limit."""

from __future__ import annotations

import pytest

from lnk_proxy.descriptors import HEADROOM, may_accept, usable_limit

CASES = [
    # own, others, limit (descriptors for connections), reserve, may it open one more
    (0, [], 1000, 64, True),
    (499, [], 1000, 64, True),  # alone: the whole limit
    (500, [], 1000, 64, False),
    (63, [436], 1000, 64, True),  # its reserve, even with another one near the whole
    (64, [436], 1000, 64, False),  # past it: 65 + 436 = 501 connections > 500
    (100, [0], 1000, 64, True),  # the other's reserve (64) kept: 101 + 64 <= 500
    (436, [0], 1000, 64, False),  # 437 + 64 > 500: the idle sandbox keeps its 64
    (0, [100] * 20, 1000, 64, True),  # 21 sandboxes: a share of 1000 // 42 = 23 each
    (23, [100] * 20, 1000, 64, False),
    (0, [0] * 600, 1000, 64, True),  # more sandboxes than connections: none reserved, room
    (0, [1] * 500, 1000, 64, False),  # ... and the room taken
]


@pytest.mark.parametrize(("own", "others", "limit", "reserve", "allowed"), CASES)
def test_may_accept(own: int, others: list[int], limit: int, reserve: int, allowed: bool) -> None:
    assert may_accept(own, others, limit, reserve) is allowed


def test_the_whole_never_passes_the_limit() -> None:
    """Sandboxes taking turns to open all they may: the total stays within the limit and each
    got at least its share."""
    counts = [0] * 7
    limit = 900
    progress = True
    while progress:
        progress = False
        for i in range(len(counts)):
            others = counts[:i] + counts[i + 1 :]
            if may_accept(counts[i], others, limit, 64):
                counts[i] += 1
                progress = True
    assert sum(counts) * 2 <= limit
    assert min(counts) >= min(64, limit // (2 * len(counts)))


def test_the_usable_limit_keeps_the_proxys_own_headroom() -> None:
    assert usable_limit(HEADROOM + 10) == 10
    assert usable_limit(10) == 0
