"""What `lnk sandbox check` tries against each hosted `[[models]]` rule (kinds `anthropic`,
`openai`): the attacks a program holding only the placeholder key would make, each of which the
proxy must refuse before anything reaches the provider.

Per rule, on its port inside the sandbox (absolute-form `http://127.0.0.1:PORT/...` through the
proxy, judged as the relay's connections are):
- a server tool (Anthropic `web_search_20250305`, OpenAI `web_search`): the proxy removes it,
  and its refusal of the probe's model (`NOT_A_MODEL`, which the rule does not list, so nothing
  is ever forwarded to the provider) must name that removal; the proxy's test-only
  `unsafe_keep_server_tools` keeps it, and the probe is `leaked`;
- a URL the provider would fetch (an image by URL): refused `model-fetch`;
- an endpoint that is not inference (the owner's files): refused `model-route`;
- a `CONNECT` to the rule's host: an opaque tunnel would skip every check and carry a key of
  the sandbox's own (by its address and by another name for it: `plan_hosted_tunnels`);
- a request carrying a key of its own (`x-api-key` / `Authorization`): refused `model-own-key`
  (an account the sandbox controls at the provider would carry data out).

Each is a plain `proxy` step (`lnk_inside/probes.py`); the evidence is the proxy's wire log: an
allowed decision for the target is a leak, and so is a refusal that does not say what must have been
judged (`wire-said`). Does NOT make an allowed call (it would spend the owner's key), nor look at
what the provider does with an allowed prompt.
"""

from __future__ import annotations

import json

from lnk_cli.check.plan import REFUSED, Evidence, Probe
from lnk_shared.grants import Grants
from lnk_shared.spec_models import HOSTED_KINDS, ModelRule

__all__ = ["NOT_A_MODEL", "OTHER_MODELS", "OWN_KEY", "hosted_probes", "probe_model"]

HTTPS_PORT = 443
NOT_A_MODEL = "lnk-check-not-a-model"  # the probes' model: one the rule does not list
# Others, each starting differently, for a rule whose prefixes take the first.
OTHER_MODELS = ("zz-lnk-check-not-a-model", "0-lnk-check-not-a-model", "Q-lnk-check-none")
OWN_KEY = "sk-lnk-check-a-key-of-the-sandbox-own"  # a probe's fake
SERVER_TOOLS = {"anthropic": "web_search_20250305", "openai": "web_search"}
_IMAGE_URL = "https://lnk-check.invalid/a.png"
FILES_PATH = "/v1/files"  # both providers' file store: with the owner's key, the owner's files


def hosted_probes(grants: Grants) -> list[Probe]:
    """The probes above for every hosted model rule of these grants, in rule order."""
    probes: list[Probe] = []
    for rule in grants.spec.models:
        if rule.kind in HOSTED_KINDS:
            probes += _rule_probes(rule)
    return probes


def placeholder_key(rule: ModelRule) -> str:
    """The key the sandbox's program holds for the rule (the box sets it in its variable)."""
    return f"lnk-secret-{rule.secret}"


def probe_model(rule: ModelRule) -> str | None:
    """A model name the rule does not list (None when its prefixes take every candidate)."""
    return next((m for m in (NOT_A_MODEL, *OTHER_MODELS) if not rule.allows_model(m)), None)


def _body(model: str, rule: ModelRule, *, tool: bool = False, image: bool = False) -> str:
    if rule.kind == "anthropic":
        content: object = "lnk check"
        if image:
            content = [{"type": "image", "source": {"type": "url", "url": _IMAGE_URL}}]
        body: dict[str, object] = {
            "model": model,
            "max_tokens": 1,
            "messages": [{"role": "user", "content": content}],
        }
        if tool:
            body["tools"] = [{"type": SERVER_TOOLS["anthropic"], "name": "web_search"}]
        return json.dumps(body)
    item: object = "lnk check"
    if image:
        item = [{"role": "user", "content": [{"type": "input_image", "image_url": _IMAGE_URL}]}]
    body = {"model": model, "input": item}
    if tool:
        body["tools"] = [{"type": SERVER_TOOLS["openai"]}]
    return json.dumps(body)


def _key_header(rule: ModelRule, key: str) -> str:
    return f"x-api-key: {key}" if rule.kind == "anthropic" else f"Authorization: Bearer {key}"


def _rule_probes(rule: ModelRule) -> list[Probe]:
    target = f"127.0.0.1:{rule.port}"
    model = probe_model(rule)
    path = "/v1/messages" if rule.kind == "anthropic" else "/v1/responses"
    url = f"http://{target}{path}"
    ident = f"model:{rule.kind}:{rule.port}"
    mine = _key_header(rule, placeholder_key(rule))
    tool = SERVER_TOOLS[rule.kind]
    if model is None:
        return (
            [_connect(rule, ident)]
            + [
                Probe(
                    f"{ident}:{name}",
                    f"{name} through the proxy",
                    REFUSED,
                    None,
                    not_tried="the rule's model prefixes take every name the probe could send",
                )
                for name in ("server-tool", "url-fetch", "own-key")
            ]
            + [_route(rule, ident, target, mine)]
        )
    return [
        _post(
            f"{ident}:server-tool",
            f"POST {url} with the server tool {tool}",
            {
                "target": target,
                "path": path,
                "headers": [mine],
                "body": _body(model, rule, tool=True),
            },
            url,
            f"removed tool '{tool}'",
        ),
        _post(
            f"{ident}:url-fetch",
            f"POST {url} with an image the provider would fetch by URL",
            {
                "target": target,
                "path": path,
                "headers": [mine],
                "body": _body(model, rule, image=True),
            },
            url,
            "model-fetch",
        ),
        _route(rule, ident, target, mine),
        _connect(rule, ident),
        _post(
            f"{ident}:own-key",
            f"POST {url} with a key of its own",
            {
                "target": target,
                "path": path,
                "headers": [_key_header(rule, OWN_KEY)],
                "body": _body(model, rule),
            },
            url,
            "model-own-key",
        ),
    ]


def _route(rule: ModelRule, ident: str, target: str, mine: str) -> Probe:
    url = f"http://{target}{FILES_PATH}"
    return Probe(
        f"{ident}:route",
        f"GET {url} (the owner's files, not inference) through the proxy",
        REFUSED,
        {
            "id": f"{ident}:route",
            "kind": "proxy",
            "method": "GET",
            "verb": "GET",
            "target": target,
            "path": FILES_PATH,
            "headers": [mine],
        },
        (Evidence("wire", url), Evidence("wire-said", (url, "model-route"))),
    )


def _connect(rule: ModelRule, ident: str) -> Probe:
    return Probe(
        f"{ident}:connect",
        f"CONNECT {rule.host}:{HTTPS_PORT} (a tunnel past the rule's checks) through the proxy",
        REFUSED,
        {
            "id": f"{ident}:connect",
            "kind": "proxy",
            "method": "CONNECT",
            "target": f"{rule.host}:{HTTPS_PORT}",
        },
        (Evidence("wire", f"{rule.host}:{HTTPS_PORT}"),),
    )


def _post(ident: str, tried: str, step: dict[str, object], url: str, said: str) -> Probe:
    return Probe(
        ident,
        f"{tried} through the proxy",
        REFUSED,
        {"id": ident, "kind": "proxy", "method": "POST", "verb": "POST", **step},
        (Evidence("wire", url), Evidence("wire-said", (url, said))),
    )
