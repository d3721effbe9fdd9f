"""A sandbox's slots and buffers (`reservations`), with no sockets: each cap refuses at once
with its rule, a release balances its reservation, and one sandbox's count is its own."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from lnk_proxy.config import ProxyConfig
from lnk_proxy.limits import MAX_WAITING_LOOKUPS
from lnk_proxy.listeners import Listener, Refusal
from lnk_proxy.policy import ProxyGrants
from lnk_proxy.reservations import release_tunnel, reserve_lookup, reserve_plain, reserve_tunnel
from lnk_proxy.tunnel_buffers import LARGE, PLAIN, SMALL


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[Listener]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    yield Listener("sbx-a", tmp_path / "a.sock", ProxyGrants(), "x" * 40, sock)
    sock.close()


def config_for(tmp_path: Path, **settings: object) -> ProxyConfig:
    return ProxyConfig(run_dir=tmp_path / "run", state_dir=tmp_path / "state", **settings)  # type: ignore[arg-type]


def test_a_tunnel_past_the_cap_is_refused_and_takes_nothing(
    tmp_path: Path, listener: Listener
) -> None:
    config = config_for(tmp_path, max_tunnels_per_sandbox=1)
    assert reserve_tunnel(listener, config) is LARGE
    refused = reserve_tunnel(listener, config)
    assert isinstance(refused, Refusal)
    assert refused.rule == "too-many-tunnels"
    assert (listener.tunnels, listener.buffers) == (1, LARGE.worst_case())


def test_a_tunnel_past_the_budget_is_refused_and_a_release_balances(
    tmp_path: Path, listener: Listener
) -> None:
    config = config_for(tmp_path, tunnel_buffer_budget_bytes=SMALL.worst_case())
    taken = reserve_tunnel(listener, config)
    assert taken is SMALL  # no room for a large one in this budget
    refused = reserve_tunnel(listener, config)
    assert isinstance(refused, Refusal)
    assert refused.rule == "too-much-buffer"
    release_tunnel(listener, taken)
    assert (listener.tunnels, listener.buffers, listener.large_buffers) == (0, 0, 0)


def test_a_large_tunnel_counts_its_large_buffers_until_released(
    tmp_path: Path, listener: Listener
) -> None:
    taken = reserve_tunnel(listener, config_for(tmp_path))
    assert taken is LARGE
    assert listener.large_buffers == LARGE.worst_case()
    release_tunnel(listener, taken)
    assert listener.large_buffers == 0


def test_unsafe_unbounded_tunnels_passes_both_caps_still_counted(
    tmp_path: Path, listener: Listener
) -> None:
    small = SMALL.worst_case()
    config = config_for(
        tmp_path,
        max_tunnels_per_sandbox=1,
        tunnel_buffer_budget_bytes=small,
        unsafe_unbounded_tunnels=True,
    )
    assert [reserve_tunnel(listener, config) for _ in range(3)] == [SMALL, SMALL, SMALL]
    assert (listener.tunnels, listener.buffers) == (3, 3 * small)


def test_a_plain_exchange_past_the_budget_is_refused(tmp_path: Path, listener: Listener) -> None:
    config = config_for(tmp_path, tunnel_buffer_budget_bytes=SMALL.worst_case())
    listener.buffers = SMALL.worst_case() - PLAIN.worst_case() + 1  # one byte short
    refused = reserve_plain(listener, config)
    assert isinstance(refused, Refusal)
    assert refused.rule == "too-much-buffer"
    listener.buffers -= 1
    assert reserve_plain(listener, config) is None
    assert listener.buffers == SMALL.worst_case()


def test_lookups_past_the_cap_are_refused(listener: Listener) -> None:
    for _ in range(MAX_WAITING_LOOKUPS):
        assert reserve_lookup(listener) is None
    refused = reserve_lookup(listener)
    assert refused == Refusal("too-many-lookups", f"{MAX_WAITING_LOOKUPS} lookups already waiting")
    assert listener.lookups == MAX_WAITING_LOOKUPS
