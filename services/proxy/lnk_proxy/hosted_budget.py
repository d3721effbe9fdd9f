"""A hosted model exchange's share of its sandbox's buffer budget (`tunnel_buffers.BUDGET`, the
one its tunnels and plain http exchanges reserve from): taken before any await, resized when
the body it holds is known, given back however the exchange ends.

- `reserve` (before the body is read): `tunnel_buffers.hosted_worst_case` of the body the
  request's head announces, with the upstream socket's buffers (`hosted_relay.upstream_buffers`,
  read at the proxy's start): its Content-Length, `MAX_BODY_BYTES` for a chunked body (its size
  is known only once read), none without one. A Content-Length past `MAX_BODY_BYTES` counts as
  that much: such a body is refused before a byte of it is read.
- `HostedReservation.settle` (once the body is judged, before the next await): the body held
  from then on is the proxy's serialisation alone (the caller drops the client's bytes), which
  may be larger than the client's (`1e9` is written `1000000000.0`): the reservation follows
  it, and a growth past the budget refuses the exchange then.
- `HostedReservation.release` (in the caller's `finally`): once, whatever happened.

Refused past the budget: `too-much-buffer`, the rule a tunnel or a plain http exchange is
refused by there, with the reason for the wire's log. `unbounded` (the proxy's test-only
`unsafe_unbounded_tunnels`, which lifts the budget for tunnels too) reserves past it with a
warning, still counted so that its release balances.

Pure bookkeeping on the sandbox's `buffers` counter: no I/O, no await. Does NOT bound (see
`tunnel_buffers`): the parse of the body while it is judged, the allocator's keeping of freed
memory, the answer's size (streamed, never held whole).
"""

from __future__ import annotations

import logging
from typing import Protocol

from lnk_proxy.http_request import ProxyRequest
from lnk_proxy.listeners import Refusal
from lnk_proxy.strict_json import MAX_BODY_BYTES
from lnk_proxy.tunnel_buffers import TunnelBuffers, hosted_worst_case

__all__ = ["BudgetOwner", "HostedReservation", "announced_body", "reserve"]

log = logging.getLogger(__name__)
RULE = "too-much-buffer"  # the budget's rule for tunnels and plain http alike


class BudgetOwner(Protocol):
    """What a sandbox's listener holds that this counts in (`listeners.Listener`)."""

    sandbox: str
    buffers: int  # bytes reserved by its tunnels and exchanges now


def announced_body(request: ProxyRequest) -> int:
    """The most body bytes the request's framing lets it bring (see the module)."""
    framing = request.framing
    if framing.kind == "length":
        return min(framing.length or 0, MAX_BODY_BYTES)
    return MAX_BODY_BYTES if framing.kind == "chunked" else 0


class HostedReservation:
    """The bytes one hosted exchange holds of its sandbox's budget."""

    def __init__(
        self, owner: BudgetOwner, held: int, budget: int, buffers: TunnelBuffers, unbounded: bool
    ) -> None:
        self._owner = owner
        self.held = held  # counted in owner.buffers until `release`
        self._budget, self._buffers, self._unbounded = budget, buffers, unbounded

    def settle(self, body: int) -> Refusal | None:
        """The reservation resized to an exchange holding `body` bytes from now on; a refusal
        (and nothing changed) when the growth does not fit in the budget."""
        wanted = hosted_worst_case(body, self._buffers)
        owner = self._owner
        if owner.buffers - self.held + wanted > self._budget:
            if not self._unbounded:
                return _refusal(self._budget, f"its serialisation of {body} B")
            _warn(owner)
        owner.buffers += wanted - self.held
        self.held = wanted
        return None

    def release(self) -> None:
        """Give the bytes back (a second call gives nothing)."""
        self._owner.buffers -= self.held
        self.held = 0


def reserve(
    owner: BudgetOwner,
    request: ProxyRequest,
    budget: int,
    buffers: TunnelBuffers,
    unbounded: bool = False,
) -> HostedReservation | Refusal:
    """The worst case of an exchange dialing with `buffers` taken from `owner`'s budget, or the
    refusal past it."""
    wanted = hosted_worst_case(announced_body(request), buffers)
    if owner.buffers + wanted > budget:
        if not unbounded:
            return _refusal(budget, f"a body of up to {announced_body(request)} B")
        _warn(owner)
    owner.buffers += wanted
    return HostedReservation(owner, wanted, budget, buffers, unbounded)


def _refusal(budget: int, what: str) -> Refusal:
    reason = (
        f"the sandbox's open exchanges hold its {budget} bytes of buffers: no room for a hosted "
        f"model exchange with {what}"
    )
    return Refusal(RULE, reason)


def _warn(owner: BudgetOwner) -> None:
    log.warning("unsafe_unbounded_tunnels: %s's hosted exchange past its budget", owner.sandbox)
