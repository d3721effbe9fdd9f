"""A tunnel's buffer sizes and each sandbox's budget for them, as a table."""

from __future__ import annotations

import pytest

from lnk_proxy.tunnel_buffers import (
    BUDGET,
    LARGE,
    LARGE_SHARE,
    PLAIN,
    SMALL,
    TunnelBuffers,
    buffers_for,
)

MiB = 1024 * 1024
L, S = LARGE.worst_case(), SMALL.worst_case()


def test_the_worst_case_counts_every_buffer_as_the_kernel_does() -> None:
    sizes = TunnelBuffers("t", tcp_receive=1, tcp_send=10, unix_send=100, pipe=1000)
    assert sizes.worst_case() == 2 * (1 + 10 + 100) + 2 * 1000  # doubled; a pipe each way
    assert LARGE.worst_case() == 8 * MiB
    assert SMALL.worst_case() == 512 * 1024


@pytest.mark.parametrize(
    ("reserved_large", "reserved", "budget", "expected"),
    [
        (0, 0, BUDGET, LARGE),  # the first tunnel: large
        (BUDGET // LARGE_SHARE - L, BUDGET // LARGE_SHARE - L, BUDGET, LARGE),  # the last large
        (BUDGET // LARGE_SHARE, BUDGET // LARGE_SHARE, BUDGET, SMALL),  # large share used
        (0, BUDGET - L + 1, BUDGET, SMALL),  # room for a small one only
        (0, BUDGET - S, BUDGET, SMALL),  # exactly the last small one
        (0, BUDGET - S + 1, BUDGET, None),  # at the budget: refused
        (0, 0, 4 * L - 1, SMALL),  # a budget whose quarter holds no large one
        (0, 0, S - 1, None),  # a budget below one small tunnel
    ],
)
def test_buffers_for(
    reserved_large: int, reserved: int, budget: int, expected: TunnelBuffers | None
) -> None:
    assert buffers_for(reserved_large, reserved, budget) is expected


def test_the_default_budget_opens_the_default_tunnel_cap() -> None:
    """256 tunnels (`max_tunnels_per_sandbox`'s default) fit: the budget refuses no sandbox
    that stays under the tunnel cap."""
    reserved_large = reserved = 0
    kinds = []
    for _ in range(256):
        sizes = buffers_for(reserved_large, reserved)
        assert sizes is not None
        kinds.append(sizes.name)
        reserved += sizes.worst_case()
        reserved_large += sizes.worst_case() if sizes is LARGE else 0
    assert kinds.count("large") == BUDGET // LARGE_SHARE // L == 8
    assert reserved <= BUDGET


def test_plain_http_counts_its_fixed_origin_buffers_and_the_kernels_default_unix_send() -> None:
    assert PLAIN.pipe == 0  # bodies go through a user-space buffer: no splice pipe
    assert PLAIN.worst_case() == 2 * (256 + 256) * 1024 + 212_992
    assert PLAIN.worst_case() < LARGE.worst_case()


def test_a_hosted_exchange_counts_its_upstream_socket_its_fixed_buffers_and_its_body() -> None:
    from lnk_proxy.tunnel_buffers import HOSTED, HOSTED_USER_SPACE, hosted_worst_case

    # Doubled as the kernel counts: 256 KiB received, 1 MiB sent, the unix side's default.
    assert HOSTED.worst_case() == 2 * (256 * 1024 + MiB) + 212_992
    assert HOSTED.pipe == 0  # bodies go through user space, never splice
    assert hosted_worst_case(0) == HOSTED.worst_case() + HOSTED_USER_SPACE
    assert hosted_worst_case(6 * MiB) - hosted_worst_case(0) == 6 * MiB
    assert hosted_worst_case(32 * MiB) * 7 < BUDGET  # the default budget: 7 at the largest body
