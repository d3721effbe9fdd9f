"""What `lnk sandbox check` tries against each hosted `[[models]]` rule's fast form: the proxy
forwards a conversation as the client's own bytes only where its strict C pass proved that
nothing it judges is there under any spelling and that every parser reads the bytes the same
(the proxy's hosted_bodies, issue 18). Each probe spells something the proxy judges in a way a
screen of the bytes as written would miss, and the proxy must judge it as its full parse does:
- `fast-escaped-key`: a fetch key spelt with an escape (`"\\u0073ource": {"url": ...}`): the
  provider decodes `source` and fetches the URL; refused `model-fetch`;
- `fast-twice-type`: a block whose `type` is given twice, the first (escaped) a server tool's
  and the second `text`: a parser keeping the first reads a server tool's block; refused
  `model-body` (a key twice);
- `fast-bad-utf8`: bytes that are not UTF-8 in a text, sent as such (other parsers replace or
  refuse them); refused `model-body`;
- `fast-deep-escaped-key`: the escaped fetch key two levels down in a tool_result; refused
  `model-fetch`.
Each POSTs to one of the rule's inference routes at its port inside the sandbox (`ROUTES`; a
plain `proxy` step, `lnk_inside/probes.py`), naming a model the rule does not list
(`plan_hosted.probe_model`), so even a screen that lets the spelling through forwards nothing:
the proxy then refuses the model instead (`model-name`). Evidence, the proxy's wire log: an
allowed decision for the URL is a leak (the provider received it), and so is a refusal that does
not say the reason above, in words no other probe of the same URL is refused with (`wire-said`).
With the proxy's test-only `unsafe_naive_content_screen` every probe is `leaked`.

Does NOT try a lone surrogate escape or a number past what a double holds or one a parser could
round (the full parse refuses the first only as it serialises, after the model is refused, and
gives the second the fast form's verdict: the wire log reads the same either way, and only the
provider's reading would differ, which no refused request shows), nor a server tool's block
in a tool_result with nothing judged in it (not a refusal: it goes the full parse's way, the
same to the wire log), nor make an allowed call (it would spend the owner's key).
"""

from __future__ import annotations

import json

from lnk_cli.check.plan import REFUSED, Evidence, Probe
from lnk_cli.check.plan_hosted import placeholder_key, probe_model
from lnk_shared.grants import Grants
from lnk_shared.spec_models import HOSTED_KINDS, ModelRule

__all__ = ["ROUTES", "SPELLINGS", "fast_form_probes"]

_URL = "https://lnk-check.invalid/a.png"
_ESCAPED_SOURCE = '"\\u0073ource": {"url": "' + _URL + '"}'
# What the proxy's refusal says of a `source` with no inline type: words no other probe of the
# same URL is refused with (the url-fetch probe's is "source.type 'url'").
_NO_SOURCE_TYPE = "model-fetch: source.type (none)"
# name -> (what is tried, the content block as the bytes sent (latin-1: one byte a character),
# what the proxy's refusal must name)
SPELLINGS = {
    "fast-escaped-key": (
        "a fetch key spelt with an escape (\\u0073ource: source)",
        '{"type": "TEXT", "text": "a", ' + _ESCAPED_SOURCE + "}",
        _NO_SOURCE_TYPE,
    ),
    "fast-twice-type": (
        "a block whose type is given twice, a server tool's first",
        '{"\\u0074ype": "server_tool_use", "type": "TEXT", "text": "a"}',
        "model-body: the key 'type' twice",
    ),
    "fast-bad-utf8": (
        "bytes that are not UTF-8 in a text",
        '{"type": "TEXT", "text": "\xff\xfe"}',
        "model-body: a body that is not UTF-8",
    ),
    "fast-deep-escaped-key": (
        "an escaped fetch key two levels down in a tool_result",
        '{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "TEXT", "text": "x"},'
        ' {"type": "TEXT", "text": "y", ' + _ESCAPED_SOURCE + "}]}",
        _NO_SOURCE_TYPE,
    ),
}
# Each probe's route, per kind: the wire log aggregates refusals by (rule, method, target), so a
# refusal's words are read only from the first of a target's within a window; every probe here
# has a target of its own for its rule, none of them another hosted probe's (those POST to
# /v1/messages and /v1/responses), and every route's body is judged alike.
ROUTES = {
    "anthropic": {
        "fast-escaped-key": "/v1/messages?beta=true",
        "fast-twice-type": "/v1/messages?beta=true",
        "fast-bad-utf8": "/v1/messages/count_tokens",
        "fast-deep-escaped-key": "/v1/messages/count_tokens",
    },
    "openai": {
        "fast-escaped-key": "/v1/chat/completions",
        "fast-twice-type": "/v1/chat/completions",
        "fast-bad-utf8": "/v1/embeddings",
        "fast-deep-escaped-key": "/v1/embeddings",
    },
}


def fast_form_probes(grants: Grants) -> list[Probe]:
    """The probes above for every hosted model rule of these grants, in rule order."""
    probes: list[Probe] = []
    for rule in grants.spec.models:
        if rule.kind in HOSTED_KINDS:
            probes += [_probe(rule, name) for name in SPELLINGS]
    return probes


def _body(rule: ModelRule, path: str, model: str, block: str) -> str:
    """The request around `block`, as text whose characters are the bytes sent (latin-1)."""
    head = json.dumps(
        {"model": model, "max_tokens": 1} if rule.kind == "anthropic" else {"model": model}
    )
    if path.startswith("/v1/embeddings"):  # the content is `input` itself
        return head[:-1] + ', "input": [' + block.replace('"TEXT"', '"input_text"') + "]}"
    block = block.replace('"TEXT"', '"text"')
    return head[:-1] + ', "messages": [{"role": "user", "content": [' + block + "]}]}"


def _probe(rule: ModelRule, name: str) -> Probe:
    tried, block, said = SPELLINGS[name]
    target = f"127.0.0.1:{rule.port}"
    path = ROUTES[rule.kind][name]
    url = f"http://{target}{path}"
    ident = f"model:{rule.kind}:{rule.port}:{name}"
    shown = f"POST {url} with {tried} through the proxy"
    model = probe_model(rule)
    if model is None:
        why = "the rule's model prefixes take every name the probe could send"
        return Probe(ident, shown, REFUSED, None, not_tried=why)
    key = placeholder_key(rule)
    header = f"x-api-key: {key}" if rule.kind == "anthropic" else f"Authorization: Bearer {key}"
    step = {
        "id": ident,
        "kind": "proxy",
        "method": "POST",
        "verb": "POST",
        "target": target,
        "path": path,
        "headers": [header],
        "body": _body(rule, path, model, block),
        "encoding": "latin-1",  # each character one byte: the bad UTF-8 is sent as such
    }
    return Probe(
        ident, shown, REFUSED, step, (Evidence("wire", url), Evidence("wire-said", (url, said)))
    )
