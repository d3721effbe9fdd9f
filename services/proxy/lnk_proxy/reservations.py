"""A sandbox's slots and kernel buffers, taken before any await so concurrent requests cannot
pass a cap together: a tunnel's slot and buffers (`tunnel_buffers`: large ones for the first,
small ones after), a plain http exchange's buffers (`tunnel_buffers.PLAIN`) from the same
budget, a lookup's place among `MAX_WAITING_LOOKUPS`. Each refusal is the request's 403.

Counts only what the listener records (`listeners.Listener`); the caller gives back what it
took (`release_tunnel`, the listener's `buffers` and `lookups` counts).
"""

from __future__ import annotations

import logging

from lnk_proxy.config import ProxyConfig
from lnk_proxy.limits import MAX_WAITING_LOOKUPS
from lnk_proxy.listeners import Listener, Refusal
from lnk_proxy.tunnel_buffers import LARGE, PLAIN, SMALL, TunnelBuffers, buffers_for

__all__ = ["release_tunnel", "reserve_lookup", "reserve_plain", "reserve_tunnel"]

log = logging.getLogger(__name__)


def reserve_tunnel(listener: Listener, config: ProxyConfig) -> TunnelBuffers | Refusal:
    """One of the sandbox's tunnel slots and its tunnel's buffers, taken before any await."""
    unbounded = config.unsafe_unbounded_tunnels  # a test box's: `check` shows the leak
    if listener.tunnels >= config.max_tunnels_per_sandbox and not unbounded:
        limit = config.max_tunnels_per_sandbox
        return Refusal("too-many-tunnels", f"{limit} tunnels already open")
    budget = config.tunnel_buffer_budget_bytes
    buffers = buffers_for(listener.large_buffers, listener.buffers, budget)
    if buffers is None and unbounded:
        log.warning("unsafe_unbounded_tunnels: %s's tunnel past its caps", listener.sandbox)
        buffers = SMALL  # still counted, so its release balances
    if buffers is None:
        reason = f"the sandbox's open tunnels hold its {budget} bytes of kernel buffers"
        return Refusal("too-much-buffer", reason)
    listener.tunnels += 1
    listener.buffers += buffers.worst_case()
    if buffers is LARGE:
        listener.large_buffers += buffers.worst_case()
    return buffers


def reserve_plain(listener: Listener, config: ProxyConfig) -> Refusal | None:
    """A plain http exchange's buffers (`tunnel_buffers.PLAIN`) from the sandbox's budget,
    taken before any await, shared with its tunnels."""
    budget = config.tunnel_buffer_budget_bytes
    over = listener.buffers + PLAIN.worst_case() > budget
    if over and not config.unsafe_unbounded_tunnels:
        reason = f"the sandbox's open exchanges hold its {budget} bytes of kernel buffers"
        return Refusal("too-much-buffer", reason)
    listener.buffers += PLAIN.worst_case()
    return None


def release_tunnel(listener: Listener, buffers: TunnelBuffers) -> None:
    listener.tunnels -= 1
    listener.buffers -= buffers.worst_case()
    if buffers is LARGE:
        listener.large_buffers -= buffers.worst_case()


def reserve_lookup(listener: Listener) -> Refusal | None:
    """One of the sandbox's `MAX_WAITING_LOOKUPS` slots, taken before the await."""
    if listener.lookups >= MAX_WAITING_LOOKUPS:
        return Refusal("too-many-lookups", f"{listener.lookups} lookups already waiting")
    listener.lookups += 1
    return None
