"""One sandbox's hosted model rules (`[[models]]` kinds anthropic and openai) as the proxy holds
them: the providers' hosts judged as an `[internet]` grant of exactly them (the relay dials only
an address the policy vetted: never this machine), the response ids each rule's answers gave
this sandbox (`IssuedIds`, never shared between sandboxes), and the refusal of a `CONNECT` to a
provider's host, whatever `[internet]` lists: a tunnel would carry a key of the sandbox's own
and every server tool past the rule.

The rules' keys are not here: they live with the sandbox's other secrets (`ServiceGrant`),
replaced when the owner sets or removes one, so a removed key refuses the next request.

Security limitations: the CONNECT refusal is by name. It does NOT stop a sandbox whose
`[internet]` reaches the provider another way from using a key of its own there: a CONNECT to
the provider's address written as a literal, to another of its names, or to a front sharing its
CDN with the provider's name inside the tunnel's TLS (the proxy never looks inside a tunnel).
Only an `[internet]` that does not reach the provider closes those.
"""

from __future__ import annotations

from collections.abc import Sequence

from lnk_proxy.hosted_models import IssuedIds
from lnk_proxy.http_request import ProxyRequest, RequestRefused
from lnk_proxy.policy import ProxyGrants
from lnk_proxy.policy_memo import PolicyMemo
from lnk_shared.hosts import normalize_name, parse_host_pattern
from lnk_shared.spec_models import HOSTED_KINDS, ModelRule, hosted_placeholder

__all__ = ["HostedGrant", "hosted_placeholder"]


class HostedGrant:
    """A sandbox's hosted model rules, their providers' hosts and the ids they were given."""

    def __init__(self, rules: Sequence[ModelRule] = ()) -> None:
        self.rules = tuple(r for r in rules if r.kind in HOSTED_KINDS)
        hosts = tuple(parse_host_pattern(r.host, allow_port=False) for r in self.rules)
        self.memo = PolicyMemo(ProxyGrants(internet=hosts))
        self._issued = {r: IssuedIds() for r in self.rules}

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

    def refuse_connect(self, request: ProxyRequest) -> None:
        """RequestRefused for a CONNECT to a hosted rule's host."""
        if request.kind != "connect":
            return
        rule = self.rule_for_host(request.host)
        if rule is not None:
            raise RequestRefused(
                "model-plain-http-only",
                f"CONNECT to {rule.host}, a {rule.kind} model rule's host: call its base URL "
                f"(http://127.0.0.1:{rule.port}, set for the program); the proxy adds the key "
                f"{rule.secret} and speaks TLS upstream",
            )
