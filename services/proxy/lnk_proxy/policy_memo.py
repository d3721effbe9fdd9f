"""One sandbox's policy verdicts, remembered: the same host, port and answer are judged once
per view of this machine instead of once per request (parsing names and classifying
addresses was a fifth of a small request's cost).

Exact, not an approximation: `judge_target` and `judge_addresses` are pure functions of
immutable arguments (frozen grants, the request's host and port, the resolver's answer, the
frozen `MachineView`), so a remembered verdict is the one a new call would give. A new machine
view (read again on every netlink change message) forgets every address
verdict. One memo per listener: what one sandbox asked never shows in another's timing.

Limits: at most `MAX_ENTRIES` verdicts of each kind; when full, all are forgotten at once.
"""

from __future__ import annotations

from collections.abc import Sequence

from lnk_proxy.policy import (
    MachineView,
    ProxyGrants,
    Target,
    TargetDecision,
    Verdict,
    judge_addresses,
    judge_target,
)
from lnk_shared.addresses import IPAddress

__all__ = ["MAX_ENTRIES", "PolicyMemo"]

MAX_ENTRIES = 256  # hosts (and answers) one sandbox uses at once; a crawler just recomputes


class PolicyMemo:
    def __init__(self, grants: ProxyGrants) -> None:
        self.grants = grants
        self._targets: dict[tuple[str, int], TargetDecision] = {}
        self._verdicts: dict[tuple[Target, tuple[IPAddress, ...]], Verdict] = {}
        self._machine: MachineView | None = None

    def target(self, host_text: str, port: int) -> TargetDecision:
        """`judge_target(grants, host_text, port)`."""
        key = (host_text, port)
        decision = self._targets.get(key)
        if decision is None:
            decision = judge_target(self.grants, host_text, port)
            if len(self._targets) >= MAX_ENTRIES:
                self._targets.clear()
            self._targets[key] = decision
        return decision

    def addresses(
        self, target: Target, addresses: Sequence[IPAddress], machine: MachineView
    ) -> Verdict:
        """`judge_addresses(grants, target, addresses, machine)`."""
        if machine is not self._machine:
            self._verdicts.clear()
            self._machine = machine
        key = (target, tuple(addresses))
        verdict = self._verdicts.get(key)
        if verdict is None:
            verdict = judge_addresses(self.grants, target, addresses, machine)
            if len(self._verdicts) >= MAX_ENTRIES:
                self._verdicts.clear()
            self._verdicts[key] = verdict
        return verdict
