"""What `lnk sandbox check` tries against each `[[services]]` rule: the attacks a program holding
only the placeholder would make on the owner's secret, each of which the proxy must refuse
before anything reaches the service.

Per rule, through the sandbox's proxy:
- a method (Telegram) or route (bearer) the rule does not list, with the placeholder: the
  proxy must answer 403 and its log show no allowed decision for it (the
  `unsafe_skip_service_method_check` proxy setting reopens exactly this: `leaked`);
- a `CONNECT` to the rule's host: an opaque tunnel would skip every path rule;
- a request carrying a key of its own (Telegram: a token in the token position; bearer: its
  own `Authorization`): an account the sandbox controls at the same host would carry data out.

Each is a plain `proxy` step (`lnk_inside/probes.py`) naming the rule's host, never the secret; the
evidence is the proxy's wire log (an allowed decision for exactly that target is a leak).

Does NOT try the allowed methods (they would act with the owner's key on the real service),
nor look at what a service does with an allowed request's body.
"""

from __future__ import annotations

from lnk_cli.check.plan import REFUSED, Evidence, Probe
from lnk_shared.grants import Grants
from lnk_shared.spec_services import ServiceRule, service_placeholder

__all__ = ["OWN_TOKEN", "REFUSED_CANDIDATES", "service_probes"]

HTTP_PORT = 80
HTTPS_PORT = 443
# Bot API methods a rule may leave out, the first one it does leave out is tried; a made-up
# name when it lists them all (it is still not in the rule).
REFUSED_CANDIDATES = ("getUpdates", "deleteMessage", "sendDocument", "lnkCheckNotListed")
OWN_TOKEN = "123456789:AAlnk-check-a-token-of-the-sandbox-own"  # noqa: S105 - a probe's fake


def service_probes(grants: Grants) -> list[Probe]:
    """The probes above for every service rule of these grants, in rule order."""
    probes: list[Probe] = []
    for rule in grants.spec.services:
        probes += _rule_probes(rule)
    return probes


def _rule_probes(rule: ServiceRule) -> list[Probe]:
    host, token = rule.host, service_placeholder(rule)
    target = f"{host}:{HTTP_PORT}"
    if rule.kind == "telegram":
        method = next(m for m in REFUSED_CANDIDATES if not rule.allows_method(m))
        refused_path = f"/bot{token}/{method}"
        refused_shown = f"{method}, which the rule does not list"
        first = rule.allow[0]
        own_path, own_headers = f"/bot{OWN_TOKEN}/{first}", []
        own_shown = "a bot token of its own in the token position"
    else:
        refused_path, refused_shown = "/lnk-check-not-listed", "a route the rule does not list"
        own_path = rule.allow[0].partition(" ")[2].removesuffix("/*") or "/"
        own_headers = [f"Authorization: Bearer {OWN_TOKEN}"]
        own_shown = "an Authorization header of its own"
    verb = "GET" if rule.kind == "telegram" else "DELETE"
    ident = f"service:{rule.kind}:{host}"
    return [
        _get(
            f"{ident}:method",
            f"{verb} http://{host}{refused_path} ({refused_shown})",
            {"target": target, "verb": verb, "path": refused_path},
            f"http://{host}{refused_path}",
        ),
        Probe(
            f"{ident}:connect",
            f"CONNECT {host}:{HTTPS_PORT} (a tunnel past the rule's path checks)",
            REFUSED,
            {
                "id": f"{ident}:connect",
                "kind": "proxy",
                "method": "CONNECT",
                "target": f"{host}:{HTTPS_PORT}",
            },
            (Evidence("wire", f"{host}:{HTTPS_PORT}"),),
        ),
        _get(
            f"{ident}:own-key",
            f"GET http://{host}{own_path} ({own_shown})",
            {"target": target, "verb": "GET", "path": own_path, "headers": own_headers},
            f"http://{host}{own_path}",
        ),
    ]


def _get(ident: str, tried: str, step: dict[str, object], shown: str) -> Probe:
    return Probe(
        ident,
        f"{tried} through the proxy",
        REFUSED,
        {"id": ident, "kind": "proxy", "method": "GET", **step},
        (Evidence("wire", shown),),
    )
