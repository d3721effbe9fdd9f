"""One sandbox's hosted model rules (`[[models]]` kinds anthropic and openai) as the proxy holds
them: the providers' hosts judged as an `[internet]` grant of exactly them (the relay dials only
an address the policy vetted: never this machine), the response ids each rule's answers gave
this sandbox (`IssuedIds`, never shared between sandboxes), and the refusal of a `CONNECT` to a
provider's host, whatever `[internet]` lists: a tunnel would carry a key of the sandbox's own
and every server tool past the rule. The refusal is by name (`refuse_connect`) and by address
(`refuse_tunnel_to`): every address a rule's host resolved to while the sandbox ran
(`hosted_tunnels` asks the resolver before each tunnel) refuses a tunnel to it, whatever name
or literal the CONNECT gave (`1.2.3.4`, `[::ffff:1.2.3.4]`, another name resolving there).

The trade-off: an address is refused for tunnels whoever else serves there, so a site sharing
the provider's CDN addresses (a front of the same CDN) is refused for tunnels too, for as long
as the sandbox runs with the rule; plain `http://` to it is judged as before.

The rules' keys are not here: they live with the sandbox's other secrets (`ServiceGrant`),
replaced when the owner sets or removes one, so a removed key refuses the next request.

Security limitations: the addresses are those this machine's resolver gave the rule's host
(at most `MAX_PROVIDER_ADDRESSES` kept). It does NOT stop a tunnel to another address of the
provider's that the resolver has not answered here (another region's, a range the provider
announces but the name does not give), nor to a front on another CDN address with the
provider's name inside the tunnel's TLS (the proxy never looks inside a tunnel). Only an
`[internet]` that does not reach the provider closes those.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from lnk_proxy.hosted_models import IssuedIds
from lnk_proxy.http_request import HTTP_PORT, ProxyRequest, RequestRefused
from lnk_proxy.policy import ProxyGrants
from lnk_proxy.policy_memo import PolicyMemo
from lnk_shared.addresses import IPAddress, effective_address
from lnk_shared.hosts import normalize_name, parse_host_pattern
from lnk_shared.spec_models import HOSTED_KINDS, ModelRule, hosted_placeholder

__all__ = ["MAX_PROVIDER_ADDRESSES", "TUNNEL_RULE", "HostedGrant", "hosted_placeholder"]

TUNNEL_RULE = "model-plain-http-only"  # a tunnel to a hosted rule's provider, by name or address
# A provider's name answers a handful of addresses at a time (a CDN's rotation over a day gives
# some dozens); kept per sandbox, the oldest dropped past this.
MAX_PROVIDER_ADDRESSES = 1024


class HostedGrant:
    """A sandbox's hosted model rules, their providers' hosts and the ids they were given."""

    def __init__(self, rules: Sequence[ModelRule] = ()) -> None:
        self.rules = tuple(r for r in rules if r.kind in HOSTED_KINDS)
        hosts = tuple(parse_host_pattern(r.host, allow_port=False) for r in self.rules)
        self.memo = PolicyMemo(ProxyGrants(internet=hosts))
        self._issued = {r: IssuedIds() for r in self.rules}
        self._addresses: dict[IPAddress, ModelRule] = {}  # insertion order: the oldest first

    def issued(self, rule: ModelRule) -> IssuedIds:
        return self._issued[rule]

    def rule_for_host(self, host: str) -> ModelRule | None:
        """The hosted rule whose provider `host` names (normalized as the policy does)."""
        if not self.rules:
            return None
        try:
            name = normalize_name(host)
        except ValueError:
            return None
        return next((r for r in self.rules if r.host == name), None)

    def learn(self, rule: ModelRule, addresses: Iterable[IPAddress]) -> None:
        """Addresses `rule`'s host resolved to: each refuses a tunnel from now on."""
        for answered in addresses:
            address = effective_address(answered)
            self._addresses.pop(address, None)
            if len(self._addresses) >= MAX_PROVIDER_ADDRESSES:
                del self._addresses[next(iter(self._addresses))]
            self._addresses[address] = rule

    def knows_addresses(self) -> bool:
        """Whether an address of every rule's host is known (else no tunnel can be judged)."""
        return set(self.rules) <= set(self._addresses.values())

    def refuse_connect(self, request: ProxyRequest) -> None:
        """RequestRefused for a CONNECT to a hosted rule's host, and for a plain request to it
        on another port than http's (its rule is served on 80 only)."""
        rule = self.rule_for_host(request.host)
        if rule is not None and request.kind == "connect":
            raise RequestRefused(TUNNEL_RULE, f"CONNECT to {_hint(rule)}")
        if rule is not None and request.port != HTTP_PORT:
            reason = f"{rule.host}:{request.port}: a rule is served on http:80"
            raise RequestRefused(TUNNEL_RULE, reason)

    def refuse_tunnel_to(self, address: IPAddress) -> None:
        """RequestRefused for a tunnel to an address a hosted rule's host resolved to, whatever
        the CONNECT named (the dial address the policy vetted)."""
        rule = self._addresses.get(effective_address(address))
        if rule is not None:
            raise RequestRefused(TUNNEL_RULE, f"a tunnel to {address}, an address of {_hint(rule)}")


def _hint(rule: ModelRule) -> str:
    return (
        f"{rule.host}, the {rule.kind} model rule's host: call its base URL "
        f"(http://127.0.0.1:{rule.port}, set for the program); the proxy adds the key "
        f"{rule.secret} and speaks TLS upstream"
    )
