"""What `lnk sandbox check` tries against each local `[[models]]` rule: the runtime's admin API,
which the proxy must refuse before anything reaches the runtime; and what it reports without
trying: the rule's inference (allowed), and a `[localhost]` grant of the runtime's own port,
the seed's other door to it (its whole API, pull, create and delete included: a known gap).

Per local rule, through the sandbox's proxy:
- an admin route of the rule's kind (`model_routes.ADMIN_EXAMPLES`: Ollama's `POST /api/pull`,
  llama.cpp's `GET /slots`, vLLM's `GET /metrics`, openai-compatible `GET /v1/files`), asked of
  the rule's loopback port inside the sandbox, with no body: the proxy must answer 403 and its
  log show no allowed decision for it (the `unsafe_skip_model_route_check` proxy setting
  reopens exactly this: `leaked`).

- each listing route of the rule's kind (`LISTINGS`: Ollama's `/api/tags` and `/api/ps`,
  llama.cpp's `/models`, every kind's `/v1/models`): the answer the sandbox gets must name only
  models the rule allows (`not_allowed`, read outside from what the probe brought back); the
  proxy cuts the runtime's listing to the rule, and `unsafe_uncut_model_listings` reopens
  that (`leaked`, naming a model the rule does not allow).

The admin probe is a plain `proxy` step (`lnk_inside/probes.py`) naming the sandbox's own
loopback port; its evidence is the proxy's wire log (an allowed decision for exactly that URL
is a leak). A listing is a `model_listing` step (`lnk_inside/probes_models.py`); its evidence is
the answer itself. The body bound's probes are every model rule's (`plan_bodies`).

Security limitations: a listing probe can only find a model the runtime itself lists: against
a runtime that keeps no model but the rule's, it passes whether the proxy cuts or not (it says
so: "no model the rule does not allow"); the tests' runtime lists one as bait
(tests/e2e/test_check_models.py). Does NOT call the inference routes (they would run the
model), nor try the other body checks (a model not allowed, a URL, a tool, a template:
`tests/unit/lnk_proxy/test_model_bodies.py` tables them).
"""

from __future__ import annotations

import json

from lnk_cli.check.plan import ALLOWED, KNOWN_GAP, REFUSED, Evidence, Probe
from lnk_shared.grants import Grants
from lnk_shared.spec_models import ModelRule

__all__ = ["ADMIN_PROBES", "LISTINGS", "model_probes", "not_allowed"]

# One admin route per kind, read-only or harmless without a body on a real runtime (the
# leaked case reaches it): the class is "a route outside the kind's inference table".
ADMIN_PROBES = {
    "ollama": ("POST", "/api/pull"),
    "llamacpp": ("GET", "/slots"),
    "vllm": ("GET", "/metrics"),
    "openai-compatible": ("GET", "/v1/files"),
}
# Each kind's listing routes and, per key of the answer, the fields of its entries that name a
# model (as the proxy's `model_listings.LISTINGS`: the CLI imports no proxy code).
_Keys = dict[str, tuple[str, ...]]
_OLLAMA: _Keys = {"models": ("name", "model")}
_OPENAI: _Keys = {"data": ("id",)}
LISTINGS: dict[str, dict[str, _Keys]] = {
    "ollama": {"/api/tags": _OLLAMA, "/api/ps": _OLLAMA, "/v1/models": _OPENAI},
    "llamacpp": {"/models": {**_OLLAMA, **_OPENAI}, "/v1/models": {**_OLLAMA, **_OPENAI}},
    "vllm": {"/v1/models": _OPENAI},
    "openai-compatible": {"/v1/models": _OPENAI},
}
NAMES_SHOWN = 3  # models named in a leaked listing's finding


def model_probes(grants: Grants) -> list[Probe]:
    """The probes above for every local model rule of these grants, in rule order."""
    probes: list[Probe] = []
    for rule in grants.spec.models:
        if rule.kind in ADMIN_PROBES:
            probes += _rule_probes(rule, grants.spec.ports)
    return probes


def _rule_probes(rule: ModelRule, localhost_ports: tuple[int, ...]) -> list[Probe]:
    ident = f"model:{rule.kind}:{rule.port}"
    verb, path = ADMIN_PROBES[rule.kind]
    inside = f"127.0.0.1:{rule.port}"
    url = f"http://{inside}{path}"
    probes = [
        *[_listing(rule, ident, inside, path) for path in LISTINGS[rule.kind]],
        Probe(
            f"{ident}:admin",
            f"{verb} {url} ({rule.kind}'s admin API, not an inference route) through the proxy",
            REFUSED,
            {
                "id": f"{ident}:admin",
                "kind": "proxy",
                "method": "GET",
                "target": inside,
                "verb": verb,
                "path": path,
            },
            (Evidence("wire", url),),
        ),
        Probe(
            f"{ident}:inference",
            f"the {rule.kind} rule's inference routes at {inside} ({', '.join(rule.models)})",
            ALLOWED,
            None,
            not_tried="granted by the rule; not called, as that would run the model",
        ),
    ]
    if rule.on_this_machine and rule.upstream_port in localhost_ports:
        probes.append(
            Probe(
                f"{ident}:localhost-port",
                f"reach the {rule.kind} runtime's port {rule.upstream_port} raw ([localhost] "
                "ports): its whole API, pull, create and delete included, past the model rule",
                KNOWN_GAP,
                {
                    "id": f"{ident}:localhost-port",
                    "kind": "tcp",
                    "host": "127.0.0.1",
                    "port": rule.upstream_port,
                },
                (Evidence("inside"),),
            )
        )
    return probes


def _listing(rule: ModelRule, ident: str, inside: str, path: str) -> Probe:
    name = path.strip("/").replace("/", "-")
    return Probe(
        f"{ident}:listing:{name}",
        f"GET http://{inside}{path} ({rule.kind}'s model listing) through the proxy: only the "
        "rule's models may be named",
        REFUSED,
        {"id": f"{ident}:listing:{name}", "kind": "model_listing", "target": inside, "path": path},
        (Evidence("listing", rule, path),),
    )


def not_allowed(rule: ModelRule, path: str, untrusted: object) -> list[str]:
    """The model names in a listing's answer (`untrusted`: its text) that `rule` does not allow,
    read with the kind's keys for `path`. Pure. An answer that is not such a JSON object (a
    refusal, a 502, cut short) names none: what the sandbox could not read told it nothing."""
    if not isinstance(untrusted, str):
        return []
    try:
        doc = json.loads(untrusted)
    except ValueError:
        return []
    if not isinstance(doc, dict):
        return []
    found: list[str] = []
    for key, fields in LISTINGS.get(rule.kind, {}).get(path, {}).items():
        entries = doc.get(key)
        for entry in entries if isinstance(entries, list) else []:
            if isinstance(entry, dict):
                found += [entry[f] for f in fields if isinstance(entry.get(f), str)]
    return sorted({n for n in found if not rule.allows_model(n)})
