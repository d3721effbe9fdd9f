"""A local runtime's model listings cut to the rule's allowlist: the sandbox learns only the
models it may use, never every model the owner keeps on the runtime.

The listings (`LISTINGS`, by kind and path, GET only; a HEAD's answer has no body): Ollama's
`/api/tags` (the models it holds) and `/api/ps` (the ones loaded now), `{"models": [{"name",
"model", ...}]}`; the OpenAI-shaped `/v1/models` (every local kind), `{"object": "list",
"data": [{"id", ...}]}`; llama.cpp's `/models`, which carries both lists. `cut_listing` keeps,
of the known keys only, the entries whose every model name (`name`, `model`; `id`) is a string
`ModelRule.allows_model` takes, and drops every other entry and key (a key a later runtime
adds could name models too). The proxy's own serialisation goes back, never the runtime's bytes.

Pure: a parsed value in, a value out; `filter_listing` adds the bytes on both sides.
`ListingUnreadable` (a `BadResponse`: the sandbox gets a 502) when the answer is not a JSON
object of that shape, is larger than `MAX_LISTING_BYTES`, or is compressed: never passed on
unfiltered.

Security limitations: this does NOT hide a model from the routes that name one (`/api/show`,
`/v1/models/{model}` and the inference routes judge the name in the request: `model_bodies`),
nor what an allowed model's answer says about others.
"""

from __future__ import annotations

import json
from typing import Any

from lnk_proxy.forward import BadResponse
from lnk_proxy.model_routes import ModelRoute
from lnk_shared.spec_models import ModelRule

__all__ = [
    "LISTINGS",
    "MAX_LISTING_BYTES",
    "ListingUnreadable",
    "cut_listing",
    "filter_listing",
    "is_listing",
]

# A listing names each model once with some metadata (~1 KiB): thousands of models fit.
MAX_LISTING_BYTES = 8 * 1024 * 1024
_Keys = dict[str, tuple[str, ...]]
_OLLAMA: _Keys = {"models": ("name", "model")}
_OPENAI: _Keys = {"object": (), "data": ("id",)}  # `object` ("list") names no model: kept as it is
_LLAMACPP = {**_OLLAMA, **_OPENAI}
# (kind, path) -> each key kept, and the fields of its entries that name a model.
LISTINGS: dict[tuple[str, str], _Keys] = {
    ("ollama", "/api/tags"): _OLLAMA,
    ("ollama", "/api/ps"): _OLLAMA,
    ("ollama", "/v1/models"): _OPENAI,
    ("vllm", "/v1/models"): _OPENAI,
    ("openai-compatible", "/v1/models"): _OPENAI,
    ("llamacpp", "/v1/models"): _LLAMACPP,
    ("llamacpp", "/models"): _LLAMACPP,
}


class ListingUnreadable(BadResponse):
    """A listing the proxy cannot cut to the rule: the sandbox gets a 502, never the answer."""


def is_listing(rule: ModelRule, route: ModelRoute) -> bool:
    """Whether `route`'s answer is a listing to cut (GET: a HEAD's answer has no body)."""
    return route.method == "GET" and (rule.kind, route.path) in LISTINGS


def cut_listing(rule: ModelRule, path: str, untrusted: object) -> dict[str, Any]:
    """The listing at `path` of `rule`'s kind with only the allowed models (see the docstring)."""
    if not isinstance(untrusted, dict):
        raise ListingUnreadable(f"{path}: the runtime's listing is not a JSON object")
    cut: dict[str, Any] = {}
    for key, names in LISTINGS[(rule.kind, path)].items():
        if key not in untrusted:
            continue
        value = untrusted[key]
        if not names:
            if not isinstance(value, str):
                raise ListingUnreadable(f"{path}: {key} is not a string")
            cut[key] = value
        elif value is None:  # Ollama's `"models": null` when it holds none
            cut[key] = []
        elif isinstance(value, list):
            cut[key] = [e for e in value if _allowed_entry(rule, e, names)]
        else:
            raise ListingUnreadable(f"{path}: {key} is not a list")
    if not any(names for key, names in LISTINGS[(rule.kind, path)].items() if key in cut):
        raise ListingUnreadable(f"{path}: no model list in the runtime's answer")
    return cut


def filter_listing(rule: ModelRule, path: str, untrusted: bytes) -> bytes:
    """The runtime's listing body cut to the rule, as the proxy serialises it."""
    if len(untrusted) > MAX_LISTING_BYTES:
        raise ListingUnreadable(f"{path}: a listing past {MAX_LISTING_BYTES} bytes")
    try:
        value = json.loads(untrusted)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        raise ListingUnreadable(f"{path}: the runtime's listing is not JSON") from None
    cut = cut_listing(rule, path, value)
    return json.dumps(cut, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def _allowed_entry(rule: ModelRule, entry: object, names: tuple[str, ...]) -> bool:
    """An entry naming a model by at least one of `names`, every one given allowed."""
    if not isinstance(entry, dict):
        return False
    given = [entry[n] for n in names if n in entry]
    return bool(given) and all(isinstance(g, str) and rule.allows_model(g) for g in given)
