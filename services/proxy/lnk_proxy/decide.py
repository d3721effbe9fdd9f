"""The verdict on a request's host, as the server's paths ask it: the gate (room in the wire's
log, the stop and pause flags as they are now), `judge_localhost`, the policy memo's target,
the sandbox's resolver (its kept answers first; a lookup takes one of the sandbox's
`MAX_WAITING_LOOKUPS` slots before its await), `judge_addresses`, then the kernel's route to
the vetted address (`route_check`). Judging is `policy`'s and `policy_memo`'s: this only
orders the checks and moves the answers between them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from lnk_proxy.http_request import ProxyRequest
from lnk_proxy.listeners import Listener, Refusal
from lnk_proxy.model_relay import loopback_address
from lnk_proxy.policy import Allowed, Refused, Rule, Target, judge_localhost
from lnk_proxy.policy_memo import PolicyMemo
from lnk_proxy.reservations import reserve_lookup
from lnk_proxy.resolver import ResolverBusy
from lnk_proxy.route_check import RouteChecker
from lnk_proxy.watches import Watches
from lnk_proxy.wire_log import WireLog
from lnk_shared.addresses import IPAddress
from lnk_shared.spec_models import ModelRule

__all__ = ["Decider"]


class Decider:
    """The proxy's decisions on its sandboxes' requests, by their listeners' state."""

    def __init__(self, wire_log: WireLog, watches: Watches, routes: RouteChecker | None) -> None:
        self.wire_log = wire_log
        self.watches = watches
        self.routes = routes

    def gate(self, listener: Listener) -> Refusal | None:
        """What refuses every request before its host is judged: no room in the wire's log,
        the stop or pause flag."""
        if not self.wire_log.can_admit(listener.sandbox):  # never an exchange it cannot log
            reason = "no room for its line in the sandbox's wire log or in the box's wire logs"
            return Refusal("log-full", reason)
        return self.watches.flags(listener)

    async def decide_model(
        self, listener: Listener, request: ProxyRequest, rule: ModelRule
    ) -> Allowed | Refusal:
        """A runtime on this machine: its loopback address and port, by the rule (the one
        exception to "never this machine"); elsewhere: the rule's host judged as a `[lan]`
        grant of exactly it (a private address), as the kernel routes it."""
        if not rule.on_this_machine:
            upstream = replace(request, host=rule.host)
            return await self.decide(listener, upstream, listener.models.memo, rule.upstream_port)
        gate = self.gate(listener)
        if gate is not None:
            return gate
        reason = f"[[models]] {rule.kind} on this machine's {rule.upstream}"
        return Allowed(loopback_address(rule), rule.upstream_port, Rule.ALLOWED_MODEL, reason)

    def decide_now(
        self, listener: Listener, request: ProxyRequest, memo: PolicyMemo, port: int
    ) -> Allowed | Refusal | Target:
        """The verdict on the request's host by `memo` at `port`, with no await: the name's
        `Target` when it needs a lookup (not a literal, not in the sandbox's kept answers)."""
        gate = self.gate(listener)
        if gate is not None:
            return gate
        local = judge_localhost(memo.grants, request.host, port)
        if local is not None:
            return local
        target = memo.target(request.host, port)
        if isinstance(target, Refused):
            return Refusal(target.rule, target.reason)
        resolver = listener.resolver
        assert resolver is not None  # set by open_listener
        if target.literal is not None:
            return self._judge_addresses(memo, target, (target.literal,))
        if resolver.caches_answers and (cached := listener.answers.get(target.host)):
            return self._judge_addresses(memo, target, cached)
        return target

    async def decide(
        self,
        listener: Listener,
        request: ProxyRequest,
        memo: PolicyMemo | None = None,
        port: int | None = None,
    ) -> Allowed | Refusal:
        """The verdict on the request's host, by `memo` (the sandbox's own grants unless a
        service rule's) at `port` (the request's unless a service rule's)."""
        memo = memo or listener.memo
        target = self.decide_now(listener, request, memo, request.port if port is None else port)
        if not isinstance(target, Target):
            return target
        resolver = listener.resolver
        assert resolver is not None  # set by open_listener
        refused = reserve_lookup(listener)
        if refused is not None:
            return refused
        try:
            addresses = await resolver.resolve(target.host)
        except ResolverBusy as exc:
            return Refusal("too-many-lookups", str(exc))
        finally:
            listener.lookups -= 1
        share = listener.share  # the answer's wake-up is a step of the sandbox's share
        if share is not None and (turn := share.take()) is not None:
            await turn
        if resolver.caches_answers:
            listener.answers.put(target.host, addresses)
        # An await: the loop ran other work since the flags' look. Change messages taken again
        # (as at `Watches.flags`): an interface's kept answer is never older than a change
        # queued before this decision's last look.
        self.watches.take_events()
        return self._judge_addresses(memo, target, addresses)

    def _judge_addresses(
        self, memo: PolicyMemo, target: Target, addresses: Sequence[IPAddress]
    ) -> Allowed | Refusal:
        """The addresses judged, then the vetted one as the kernel routes it now."""
        machine = self.watches.machine
        if machine is None:
            raise RuntimeError("ProxyServer.start() was not called: this machine is unknown")
        verdict = memo.addresses(target, addresses, machine)
        if isinstance(verdict, Refused):
            return Refusal(verdict.rule, verdict.reason)
        routed = self.routes.check(verdict.address) if self.routes is not None else None
        if routed is not None:
            return Refusal(routed.rule, routed.reason)
        return verdict
