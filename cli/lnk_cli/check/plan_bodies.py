"""What `lnk sandbox check` tries against every `[[models]]` rule's body bound: a body of more
values than the proxy parses (`strict_json.MAX_VALUES`, 2**20) and one nested deeper than it
scans (`MAX_SCANNED_DEPTH`, 1000), each of which the proxy must refuse before any parser is given
it, so nothing reaches the runtime or the provider.

Per rule, one POST each to an inference route at the rule's port inside the sandbox, through
the proxy (`lnk_inside/probes_models.py` makes the bodies inside: megabytes, past what a plan
can carry), naming a model the rule does not list (`plan_hosted.probe_model`), so that even
with the bound switched off nothing is forwarded: the proxy's test-only
`unsafe_unbounded_model_bodies` gives the body to the parser, which still refuses it, but for
another reason (the nesting past its recursion limit, the model), and the probe is `leaked`.

And one probe of the nesting's cost (`nesting-cost`): a body of many runs nested just within the
bound (so no bound refuses it before the count) against a flat body of the same size, both
refused at once by every reader after that count; with the proxy's test-only
`unsafe_per_level_nesting` the count takes a pass per level (seconds of the proxy's loop for
~1.8 MB) and the probe is `leaked`. Made not to flake on a loaded machine: no fixed time, only a
ratio of the least of `NESTING_REPEATS` interleaved requests of each (preemption only adds
time, so the least of each is the nearest to its own cost), against `COST_RATIO`, far from
both sides (measured: ~1x with the one pass, tens of times with the passes: bench/README.md).

Evidence: the proxy's wire log. An allowed decision for the URL is a leak; so is a refusal that
does not say the body was refused before it was parsed (`wire-said`: the proxy's words are
`...: refused before it was parsed`, strict_json.refuse_many_values).

Does NOT try a body of fewer bytes than 2**20 (the proxy does not scan those: they cannot hold
more values, and the parsers stop their nesting at their own recursion limits), nor a
body past the byte bound (refused by its Content-Length, tested in tests/unit/lnk_proxy).
"""

from __future__ import annotations

from collections.abc import Mapping

from lnk_cli.check.plan import REFUSED, Evidence, Probe
from lnk_cli.check.plan_hosted import placeholder_key, probe_model
from lnk_shared.grants import Grants
from lnk_shared.spec_models import HOSTED_KINDS, ModelRule

__all__ = [
    "BODY_SHAPES",
    "BOUND_SAID",
    "COST_RATIO",
    "INFERENCE",
    "NESTING",
    "NESTING_REPEATS",
    "PADS",
    "body_probes",
]

MAX_VALUES = 2**20  # strict_json.MAX_VALUES: the proxy's bound (the CLI imports no proxy code)
SCANNED = MAX_VALUES  # bytes from which the proxy scans a body (fewer cannot hold more values)
# Past the nesting the proxy scans to (1000), in a body padded past SCANNED by one string (a
# body of brackets alone would cost the scan seconds: one pass of the shape per level).
DEEP = 1024
WIDE = MAX_VALUES + 1  # numbers in one array: past the count alone. ~2 MiB.
BODY_SHAPES = {"deep": DEEP, "wide": WIDE}
PADS = {"deep": SCANNED, "wide": 0}  # bytes of the padding string
BOUND_SAID = "before it was parsed"  # the proxy's reason for a body the scan refused
# The nesting probe's bodies: runs 997 deep (999 with the request's object and `messages`:
# within the 1000 the proxy scans to), 900 of them (~1.8 MB: scanned, and under 2**20 values),
# against runs 9 deep of the same bytes.
NESTING = {"runs": 900, "depth": 997, "flat": 9}
NESTING_REPEATS = 3  # pairs, interleaved
COST_RATIO = 5.0  # the deep body's least time over the flat one's that is a leak
# The inference route each kind's probe posts to (a route whose body the proxy judges).
INFERENCE = {
    "ollama": "/api/chat",
    "llamacpp": "/v1/chat/completions",
    "vllm": "/v1/chat/completions",
    "openai-compatible": "/v1/chat/completions",
    "anthropic": "/v1/messages",
    "openai": "/v1/responses",
}
_SHOWN = {
    "deep": f"a body nested {DEEP} deep (the proxy scans to 1000)",
    "wide": f"a body of {WIDE} values (the proxy parses {MAX_VALUES} at most)",
}


def body_probes(grants: Grants) -> list[Probe]:
    """The two probes above for every model rule of these grants, in rule order."""
    probes: list[Probe] = []
    for rule in grants.spec.models:
        if rule.kind in INFERENCE:
            probes += [_probe(rule, shape) for shape in BODY_SHAPES]
            probes.append(_nesting_probe(rule))
    return probes


def _headers(rule: ModelRule) -> list[str]:
    """The placeholder key a hosted rule's program holds (a local rule's has none)."""
    if rule.kind not in HOSTED_KINDS:
        return []
    key = placeholder_key(rule)
    return [f"x-api-key: {key}" if rule.kind == "anthropic" else f"Authorization: Bearer {key}"]


def _probe(rule: ModelRule, shape: str) -> Probe:
    url = _url(rule)
    fields = {"shape": shape, "count": BODY_SHAPES[shape], "pad": PADS[shape]}
    evidence = (Evidence("wire", url), Evidence("wire-said", (url, BOUND_SAID)))
    tried = f"POST {url} with {_SHOWN[shape]} through the proxy"
    return _body_probe(
        rule, f"{shape}-body", tried, kind="model_body", fields=fields, evidence=evidence
    )


def _nesting_probe(rule: ModelRule) -> Probe:
    url = _url(rule)
    tried = (
        f"POST {url} with {NESTING['runs']} runs nested {NESTING['depth']} deep, against a flat"
        f" body of the same size, {NESTING_REPEATS} of each, through the proxy"
    )
    fields = {**NESTING, "repeats": NESTING_REPEATS}
    evidence = (Evidence("wire", url), Evidence("cost", COST_RATIO))
    return _body_probe(
        rule, "nesting-cost", tried, kind="model_nesting", fields=fields, evidence=evidence
    )


def _url(rule: ModelRule) -> str:
    return f"http://127.0.0.1:{rule.port}{INFERENCE[rule.kind]}"


def _body_probe(
    rule: ModelRule,
    name: str,
    tried: str,
    *,
    kind: str,
    fields: Mapping[str, object],
    evidence: tuple[Evidence, ...],
) -> Probe:
    """A POST of a body to the rule's inference route, with a model the rule refuses (on a
    leak an allowed one would run and spend the owner's key): not tried when it allows all."""
    ident = f"model:{rule.kind}:{rule.port}:{name}"
    model = probe_model(rule)
    if model is None:
        why = "the rule's model prefixes take every name the probe could send"
        return Probe(ident, tried, REFUSED, None, not_tried=why)
    step = {
        "id": ident,
        "kind": kind,
        "target": f"127.0.0.1:{rule.port}",
        "verb": "POST",
        "path": INFERENCE[rule.kind],
        "headers": _headers(rule),
        **fields,
        "model": model,
    }
    return Probe(ident, tried, REFUSED, step, evidence)
