"""A tunnel's buffer sizes and each sandbox's budget for them, as a table."""

from __future__ import annotations

import pytest

from lnk_proxy.tunnel_buffers import (
    BUDGET,
    HOSTED_USER_SPACE,
    LARGE,
    LARGE_SHARE,
    PLAIN,
    SMALL,
    TunnelBuffers,
    buffers_for,
    hosted_buffers,
    hosted_worst_case,
    tcp_send_max,
)
from lnk_shared.errors import StateError

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


@pytest.mark.parametrize(
    ("tcp_wmem", "send_max"),
    [
        ("4096\t16384\t4194304\n", 4194304),  # the kernel's usual: autotuning grows to the max
        ("4096 16384 33554432", 33554432),  # a raised maximum is counted whole
        ("4096\t8388608\t4194304\n", 8388608),  # a default above the max: a socket starts there
        ("4096\t4096\t4096\n", 4096),
    ],
)
def test_the_send_side_is_counted_by_the_most_autotuning_lets_it_hold(
    tcp_wmem: str, send_max: int
) -> None:
    assert tcp_send_max(tcp_wmem) == send_max


@pytest.mark.parametrize("tcp_wmem", ["", "4096 16384", "4096 16384 4194304 1", "a b c", "-1 2 3"])
def test_a_tcp_wmem_that_is_not_three_sizes_is_refused(tcp_wmem: str) -> None:
    with pytest.raises(StateError, match=r"net\.ipv4\.tcp_wmem"):
        tcp_send_max(tcp_wmem)


@pytest.mark.parametrize("send_max", [4 * MiB, 32 * MiB, 4096])
def test_a_hosted_exchange_counts_its_fixed_receive_its_autotuned_send_and_its_body(
    send_max: int,
) -> None:
    hosted = hosted_buffers(send_max)
    # The receive buffer fixed (doubled as the kernel counts it), the send buffer not set
    # (SO_SNDBUF would cost ~1 ms of a 1 MiB request) and counted at its autotuned maximum,
    # as is; the unix side's default.
    assert hosted.tcp_send == 0
    assert hosted.worst_case() == 2 * 256 * 1024 + send_max + 212_992
    assert hosted.pipe == 0  # bodies go through user space, never splice
    assert hosted_worst_case(0, hosted) == hosted.worst_case() + HOSTED_USER_SPACE
    assert hosted_worst_case(6 * MiB, hosted) - hosted_worst_case(0, hosted) == 6 * MiB


def test_the_default_budget_holds_six_hosted_exchanges_of_the_largest_body() -> None:
    hosted = hosted_buffers(4 * MiB)
    assert (
        6 * hosted_worst_case(32 * MiB, hosted) <= BUDGET < 7 * hosted_worst_case(32 * MiB, hosted)
    )
