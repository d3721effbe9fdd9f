"""A tunnel's last judgement while a sandbox has hosted model rules: never to an address its
providers' hosts resolve to (`HostedGrant.refuse_tunnel_to`), whatever the CONNECT named.

Before each tunnel the rules' hosts are looked up (the sandbox's own resolver, its answer
cache where it keeps one) and every address learned is kept for the sandbox's life, so a
provider's rotating answers add up rather than replace each other. Fails closed: while no
address of a rule's host is known (its lookup gave none, or the sandbox's lookups are all in
use), no tunnel is opened, since none could be told apart from one to the provider.

`unsafe_hosted_tunnel_by_address` (the proxy's test-only setting) skips the judgement and logs
a warning on every tunnel it lets through: `lnk sandbox check` reports the class `leaked`.

Security limitations: see `hosted_grant` (the addresses are what this machine's resolver said;
a site sharing the provider's CDN addresses is refused for tunnels too). This does NOT judge
plain http requests (a hosted rule's host in an `http://` URL goes to its rule, and another
name's plain http carries no TLS to the provider), nor look inside a tunnel.
"""

from __future__ import annotations

import logging
from typing import Protocol

from lnk_proxy.hosted_grant import TUNNEL_RULE, HostedGrant
from lnk_proxy.http_request import RequestRefused
from lnk_proxy.listeners import Refusal
from lnk_proxy.policy import Allowed
from lnk_proxy.resolver import AnswerCache, Resolver, ResolverBusy

__all__ = ["TunnelOwner", "TunnelRefusal", "judge_tunnel"]

log = logging.getLogger(__name__)


# A tunnel refused: the proxy's one refusal (`rule` to the sandbox, `reason` to the wire's log).
TunnelRefusal = Refusal


class TunnelOwner(Protocol):
    """What a sandbox's listener holds that this reads (`listeners.Listener`)."""

    hosted: HostedGrant
    resolver: Resolver | None
    answers: AnswerCache


class _Unsafe(Protocol):
    unsafe_hosted_tunnel_by_address: bool


async def judge_tunnel(
    owner: TunnelOwner, allowed: Allowed, config: _Unsafe
) -> Allowed | TunnelRefusal:
    """`allowed` when its address is no hosted provider's, else the refusal naming the rule."""
    grant, resolver, answers = owner.hosted, owner.resolver, owner.answers
    if not grant.rules:
        return allowed
    assert resolver is not None  # set when the listener opened
    if config.unsafe_hosted_tunnel_by_address:
        log.warning(
            "unsafe_hosted_tunnel_by_address: a tunnel to %s not judged against the hosted "
            "model rules' providers",
            allowed.address,
        )
        return allowed
    for rule in grant.rules:
        cached = answers.get(rule.host) if resolver.caches_answers else None
        try:
            addresses = cached if cached is not None else await resolver.resolve(rule.host)
        except ResolverBusy:
            addresses = ()
        if resolver.caches_answers and cached is None:
            answers.put(rule.host, addresses)
        grant.learn(rule, addresses)
    if not grant.knows_addresses():
        hosts = ", ".join(r.host for r in grant.rules)
        reason = f"no address known for the hosted model rules' hosts ({hosts}): no tunnel"
        return TunnelRefusal(TUNNEL_RULE, reason)
    try:
        grant.refuse_tunnel_to(allowed.address)
    except RequestRefused as exc:
        return TunnelRefusal(exc.rule, exc.reason)
    return allowed
