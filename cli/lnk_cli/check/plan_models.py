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

Each is a plain `proxy` step (`lnk_inside/probes.py`) naming the sandbox's own loopback port; the
evidence is the proxy's wire log (an allowed decision for exactly that URL is a leak).

Does NOT call the inference routes (they would run the model), nor try the body checks (a
model not allowed, a URL, a tool, a template: `tests/unit/lnk_proxy/test_model_bodies.py`
tables them), nor the hosted kinds (they are refused at launch until the proxy serves them).
"""

from __future__ import annotations

from lnk_cli.check.plan import ALLOWED, KNOWN_GAP, REFUSED, Evidence, Probe
from lnk_shared.grants import Grants
from lnk_shared.spec_models import ModelRule

__all__ = ["ADMIN_PROBES", "model_probes"]

# One admin route per kind, read-only or harmless without a body on a real runtime (the
# leaked case reaches it): the class is "a route outside the kind's inference table".
ADMIN_PROBES = {
    "ollama": ("POST", "/api/pull"),
    "llamacpp": ("GET", "/slots"),
    "vllm": ("GET", "/metrics"),
    "openai-compatible": ("GET", "/v1/files"),
}


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
