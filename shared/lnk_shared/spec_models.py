"""A spec's `[[models]]`: a model the sandbox calls through the proxy, its inference only.

    [[models]]
    kind = "ollama"                          # ollama, llamacpp, vllm, openai-compatible,
                                             # anthropic, openai
    models = ["llama3.2:3b", "qwen2.5*"]     # the allowlist: names, or a prefix ending in '*'
    upstream = "http://127.0.0.1:11434"      # where it listens (local kinds: this machine or
                                             # your network; hosted: the provider's by default)
    secret = "vllm-key"                      # a name from `lnk secret list` (hosted: required;
                                             # vllm, openai-compatible: optional; else none)
    port = 11434                             # the loopback port inside the sandbox
    env = "OLLAMA_HOST"                      # the base-URL variable the program gets

Flag: `--model KIND=MODEL[,MODEL...][;KEY=VALUE...]` with KEY one of upstream, secret, port,
env (`--model ollama=llama3.2:3b`, `--model 'vllm=qwen2.5-7b;upstream=http://10.0.0.5:8000'`).

Defaults per kind (`KIND_DEFAULTS`): the in-sandbox port is the runtime's usual one, so a
client's default works (Ollama 11434, llama.cpp's server 8080, vLLM 8000); openai-compatible
takes 8000 too (the port most OpenAI-compatible servers document; set `port` beside a vllm
rule); the hosted kinds, whose clients always take a base URL, get 4000 (openai: LiteLLM's
gateway port, where an OpenAI-shaped local endpoint is expected) and 4001 (anthropic). A local
kind's upstream defaults to this machine's loopback on that same usual port; a hosted kind's
to its provider (`https://api.openai.com`, `https://api.anthropic.com`). The variable: Ollama
`OLLAMA_HOST`, Anthropic `ANTHROPIC_BASE_URL`, every other kind `OPENAI_BASE_URL` (the value
`base_url_value` gives: `/v1` appended for the OpenAI shape, as its SDK expects).

The rules here are pure, on the text of the entry:
- `models` is not empty (an empty list would open nothing: say so) and holds model names
  (letters, digits, `._:/@+-`), or a prefix ending in `*` (never `*` alone: name the family).
  An Ollama cloud model (tag `cloud` or ending `-cloud`: it runs at ollama.com under the
  owner's identity) is allowed only when named exactly, never by a prefix.
- A local kind's upstream is `http://` on this machine's loopback, a private address of your
  network (10/8, 172.16/12, 192.168/16, fc00::/7, 100.64/10) or a name (dialed only where it
  resolves to a private address); a public address is refused (that is a hosted kind). A
  hosted kind's is `https://`. Never a path, query, user or password (a key in a URL).
- A value never comes from a spec: `token`, `key`, `api_key`, ... are refused, and so is text
  that looks like a token (`lnk_shared.secret_names.looks_like_a_value`), never repeated.

Security limitations: this does NOT know whether the named secret exists (the controller
checks at launch), whether a runtime listens at the upstream, nor that it is the kind named
(a rule sends its requests, and its secret, to the upstream the spec names: the approval
shows both). It does NOT stop an allowed model from doing with a prompt what it does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from lnk_shared.addresses import effective_address, is_cgnat, is_private_lan, parse_host_address
from lnk_shared.errors import UsageError
from lnk_shared.hosts import MAX_PORT, normalize_name
from lnk_shared.secret_names import check_secret_name, looks_like_a_value
from lnk_shared.spec import MAIN_PROXY_PORT, MAX_ENTRIES, Origin

__all__ = [
    "BASE_URL_VARIABLES",
    "HOSTED_KEY_VARIABLES",
    "HOSTED_KINDS",
    "KINDS",
    "KIND_DEFAULTS",
    "LOCAL_KINDS",
    "MODEL_KEYS",
    "KindDefaults",
    "ModelRule",
    "base_url_value",
    "hosted_placeholder",
    "is_cloud_model",
    "parse_model_flag",
    "parse_model_table",
]


@dataclass(frozen=True)
class KindDefaults:
    port: int  # the loopback port inside the sandbox (and a local upstream's)
    env: str  # the base-URL variable
    upstream: str  # where it listens unless the spec says
    secret: str  # "required", "optional" or "none"


LOCAL_KINDS = ("ollama", "llamacpp", "vllm", "openai-compatible")
HOSTED_KINDS = ("anthropic", "openai")
KINDS = LOCAL_KINDS + HOSTED_KINDS
KIND_DEFAULTS = {
    "ollama": KindDefaults(11434, "OLLAMA_HOST", "http://127.0.0.1:11434", "none"),
    "llamacpp": KindDefaults(8080, "OPENAI_BASE_URL", "http://127.0.0.1:8080", "none"),
    "vllm": KindDefaults(8000, "OPENAI_BASE_URL", "http://127.0.0.1:8000", "optional"),
    "openai-compatible": KindDefaults(8000, "OPENAI_BASE_URL", "http://127.0.0.1:8000", "optional"),
    "anthropic": KindDefaults(4001, "ANTHROPIC_BASE_URL", "https://api.anthropic.com", "required"),
    "openai": KindDefaults(4000, "OPENAI_BASE_URL", "https://api.openai.com", "required"),
}
# The variables a rule may set, each read by its clients as a base URL (never another name: a
# spec must not pick which of the program's variables the box overwrites).
BASE_URL_VARIABLES = ("OLLAMA_HOST", "OPENAI_BASE_URL", "ANTHROPIC_BASE_URL")
MODEL_KEYS = {
    "kind": f"one of {', '.join(KINDS)}",
    "models": "a list of model names (a prefix may end in '*')",
    "upstream": "where it listens: http://HOST[:PORT] (local kinds), https://HOST[:PORT] (hosted)",
    "secret": "a secret's name (lnk secret list): hosted kinds, and optionally vllm and "
    "openai-compatible",
    "port": "the loopback port the sandbox calls it on",
    "env": f"the base-URL variable the program gets: one of {', '.join(BASE_URL_VARIABLES)}",
}
MAX_MODEL_NAME_CHARS = 200  # Ollama's longest names (hf.co/user/repo:quant) are ~100
_MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+-]*")
_VALUE_KEYS = frozenset(
    {"token", "value", "key", "api_key", "apikey", "password", "secret_value", "bearer", "auth"}
)
_SCHEMES = {"http": 80, "https": 443}
_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain"})


@dataclass(frozen=True, order=True)
class ModelRule:
    """One `[[models]]` entry, checked. `models` is sorted and deduplicated; `host` is a
    normalized name or an address's text (loopback `localhost` read as 127.0.0.1)."""

    kind: str
    scheme: str
    host: str
    upstream_port: int
    models: tuple[str, ...]
    secret: str | None
    port: int
    env: str

    @property
    def local(self) -> bool:
        return self.kind in LOCAL_KINDS

    @property
    def upstream(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.upstream_port}"

    @property
    def on_this_machine(self) -> bool:
        """Whether the upstream is this machine's loopback (the one exception, by this rule)."""
        address = parse_host_address(self.host)
        return address is not None and effective_address(address).is_loopback

    def allows_model(self, name: str) -> bool:
        """Whether `name` is in the allowlist: named, or under a prefix (never a cloud model by
        a prefix: it runs at ollama.com under the owner's identity)."""
        if name in self.models:
            return True
        if self.kind == "ollama" and is_cloud_model(name):
            return False
        return any(m.endswith("*") and name.startswith(m[:-1]) for m in self.models)

    def canonical(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "upstream": self.upstream,
            "models": list(self.models),
            "secret": self.secret,
            "port": self.port,
            "env": self.env,
        }


def is_cloud_model(name: str) -> bool:
    """An Ollama model that runs at ollama.com (`gpt-oss:120b-cloud`, `…:cloud`)."""
    _, colon, tag = name.rpartition(":")
    return bool(colon) and (tag == "cloud" or tag.endswith("-cloud"))


# The variable a hosted kind's SDK reads its key from: the box sets it to the placeholder
# (`hosted_placeholder`), which the proxy replaces with the owner's key upstream.
HOSTED_KEY_VARIABLES = {"anthropic": "ANTHROPIC_API_KEY", "openai": "OPENAI_API_KEY"}


def hosted_placeholder(rule: ModelRule) -> str:
    """What the sandbox's program holds in a hosted rule's key's place (never a key)."""
    return f"lnk-secret-{rule.secret}"


def base_url_value(rule: ModelRule) -> str:
    """The base-URL variable's value: the rule's loopback port inside the sandbox."""
    origin = f"http://127.0.0.1:{rule.port}"
    return f"{origin}/v1" if rule.env == "OPENAI_BASE_URL" else origin


def parse_model_table(table: object, origin: Origin) -> ModelRule:
    """One `[[models]]` table of a spec file."""
    if not isinstance(table, dict):
        raise origin.error("expected a table ([[models]] with kind and models)")
    for key in table:
        _refuse_value_key(str(key), origin)
        if key not in MODEL_KEYS:
            raise origin.error(f"unknown key {key!r}; [[models]] takes: {', '.join(MODEL_KEYS)}")
    models = table.get("models")
    if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
        raise origin.error(f"models: expected {MODEL_KEYS['models']}")
    fields = {k: table.get(k) for k in ("upstream", "secret", "port", "env")}
    return _rule(table.get("kind"), models, fields, origin)


def parse_model_flag(text: str, origin: Origin) -> ModelRule:
    """`--model KIND=MODEL[,MODEL...][;KEY=VALUE...]`."""
    head, *options = text.split(";")
    kind, sep, model_text = head.partition("=")
    if not sep:
        if _holds_a_value(text):
            _refuse_value_text("the flag", origin)
        raise origin.error(
            "expected KIND=MODEL[,MODEL...][;upstream=URL;secret=NAME;port=N;env=VAR] "
            "(e.g. ollama=llama3.2:3b)"
        )
    fields: dict[str, object] = {}
    for option in options:
        key, sep, value = option.partition("=")
        _refuse_value_key(key, origin)
        if not sep or key not in ("upstream", "secret", "port", "env") or key in fields:
            if _holds_a_value(option):
                _refuse_value_text("an option", origin)
            raise origin.error(
                f"{option[:40]!r}: expected one each of upstream=URL, secret=NAME, port=N, env=VAR"
            )
        fields[key] = value
    port: object = fields.get("port")
    if isinstance(port, str) and port.isascii() and port.isdigit() and len(port) <= 5:
        port = int(port)
    models = [m.strip() for m in model_text.split(",") if m.strip()]
    return _rule(kind, models, {**fields, "port": port}, origin)


def _rule(kind: object, models: list[str], fields: dict[str, object], origin: Origin) -> ModelRule:
    """The rule of `kind` with `models` and the optional `fields` (upstream, secret, port, env;
    None where not given)."""
    upstream, secret = fields.get("upstream"), fields.get("secret")
    port, env = fields.get("port"), fields.get("env")
    for text in (upstream, secret):
        if isinstance(text, str) and _holds_a_value(text):
            _refuse_value_text("an entry", origin)
    if any(looks_like_a_value(m) for m in models):  # a whole name only: names hold long words
        _refuse_value_text("a model's name", origin)
    if not isinstance(kind, str) or kind not in KINDS:
        raise origin.error(f"kind: expected one of {', '.join(KINDS)}, got {_shown(kind)}")
    defaults = KIND_DEFAULTS[kind]
    checked_models = _models(kind, models, origin)
    scheme, host, upstream_port = _upstream(kind, upstream or defaults.upstream, origin)
    return ModelRule(
        kind=kind,
        scheme=scheme,
        host=host,
        upstream_port=upstream_port,
        models=checked_models,
        secret=_secret(kind, secret, defaults.secret, origin),
        port=_port(defaults.port if port is None else port, origin),
        env=_env(defaults.env if env is None else env, origin),
    )


def _models(kind: str, models: list[str], origin: Origin) -> tuple[str, ...]:
    if not models:
        raise origin.error(
            "models is empty, which would open nothing: list the models this sandbox may "
            'call (e.g. models = ["llama3.2:3b"]; a family: "qwen2.5*")'
        )
    if len(models) > MAX_ENTRIES:
        raise origin.error(f"models: more than {MAX_ENTRIES} entries")
    for name in models:
        if name == "*":
            raise origin.error(
                'models: "*" would allow every model: name them, or a family by its prefix '
                '("llama3*")'
            )
        bare = name[:-1] if name.endswith("*") else name
        if len(name) > MAX_MODEL_NAME_CHARS or not _MODEL_NAME.fullmatch(bare):
            raise origin.error(
                f"models: {_shown(name)} is not a model name (letters, digits and ._:/@+- , "
                f"at most {MAX_MODEL_NAME_CHARS}; a prefix may end in '*')"
            )
        if kind == "ollama" and name.endswith("*") and bare.endswith(":cloud"):
            raise origin.error(f"models: {_shown(name)}: name a cloud model exactly")
    return tuple(sorted(set(models)))


def _upstream(kind: str, text: object, origin: Origin) -> tuple[str, str, int]:
    if not isinstance(text, str):
        raise origin.error(f"upstream: expected {MODEL_KEYS['upstream']}")
    scheme, sep, rest = text.partition("://")
    want = "http" if kind in LOCAL_KINDS else "https"
    if not sep or scheme.lower() != want:
        where = "this machine or your network, spoken to" if want == "http" else "the provider,"
        raise origin.error(
            f"upstream: {_shown(text)}: the {kind} rule's upstream is {where} over {want}:// "
            f"(e.g. {KIND_DEFAULTS[kind].upstream})"
        )
    if "@" in rest:
        raise origin.error(
            "upstream: a user or password in the URL (not repeated here): a spec never holds "
            "a key; keep it with `lnk secret set NAME` and give its name in `secret`"
        )
    authority = rest[:-1] if rest.endswith("/") else rest
    if any(c in authority for c in "/?#") or not authority:
        raise origin.error(
            f"upstream: {_shown(text)}: an origin only (scheme, host, port), no path or query"
        )
    host_text, port = _split_authority(authority, _SCHEMES[want], origin)
    host = _upstream_host(kind, host_text, origin)
    loopback = parse_host_address(host)
    if port == MAIN_PROXY_PORT and loopback is not None and loopback.is_loopback:
        raise origin.error(f"upstream: port {port} of this machine is the box's main proxy's")
    return want, host, port


def _split_authority(authority: str, default_port: int, origin: Origin) -> tuple[str, int]:
    if authority.startswith("["):
        host, close, after = authority[1:].partition("]")
        if not close or (after and not after.startswith(":")):
            raise origin.error(f"upstream: {_shown(authority)}: a bracketed IPv6 address")
        port_text = after[1:] if after else ""
    else:
        host, _, port_text = authority.partition(":")
    if not port_text:
        return host, default_port
    if not (port_text.isascii() and port_text.isdigit() and len(port_text) <= 5):
        raise origin.error(f"upstream: the port {_shown(port_text)} is not a number")
    port = int(port_text)
    if not 1 <= port <= MAX_PORT:
        raise origin.error(f"upstream: the port {port} is not 1 to {MAX_PORT}")
    return host, port


def _upstream_host(kind: str, text: str, origin: Origin) -> str:
    try:
        address = parse_host_address(text)
    except ValueError as exc:
        raise origin.error(f"upstream: {_shown(text)}: {exc}") from None
    if address is None:
        try:
            name = normalize_name(text)
        except ValueError as exc:
            raise origin.error(f"upstream: {_shown(text)}: {exc}") from None
        if name in _LOOPBACK_NAMES:
            return "127.0.0.1" if kind in LOCAL_KINDS else _refuse_local_hosted(kind, origin)
        return name
    effective = effective_address(address)
    if kind in HOSTED_KINDS:
        if not effective.is_global:
            return _refuse_local_hosted(kind, origin)
        return str(effective)
    if effective.is_loopback or is_private_lan(effective) or is_cgnat(effective):
        return str(effective)
    raise origin.error(
        f"upstream: {text} is neither this machine's loopback nor a private address of your "
        "network; a local runtime listens there (a hosted API is kind anthropic or openai)"
    )


def _refuse_local_hosted(kind: str, origin: Origin) -> str:
    raise origin.error(
        f"upstream: the {kind} rule goes to the provider's public host; a runtime on this "
        "machine or your network is kind ollama, llamacpp, vllm or openai-compatible"
    )


def _secret(kind: str, secret: object, takes: str, origin: Origin) -> str | None:
    if secret is None:
        if takes == "required":
            raise origin.error(
                f"secret: the {kind} rule names the secret its key is kept as (`lnk secret set "
                'NAME`, then secret = "NAME"): the key is added outside, never in the sandbox'
            )
        return None
    if takes == "none":
        raise origin.error(f"secret: the {kind} runtime takes no key; leave secret out")
    if not isinstance(secret, str):
        raise origin.error("secret: expected the name of a secret (`lnk secret list`)")
    try:
        return check_secret_name(secret)
    except UsageError as exc:
        raise origin.error(f"secret: {exc}") from None


def _port(port: object, origin: Origin) -> int:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= MAX_PORT:
        raise origin.error(f"port: expected a port number from 1 to {MAX_PORT}, got {_shown(port)}")
    if port == MAIN_PROXY_PORT:
        raise origin.error(f"port: {port} is the box's main proxy's port; choose another")
    return port


def _env(env: object, origin: Origin) -> str:
    if not isinstance(env, str) or env not in BASE_URL_VARIABLES:
        raise origin.error(
            f"env: expected one of {', '.join(BASE_URL_VARIABLES)}, got {_shown(env)}"
        )
    return env


def _holds_a_value(text: str) -> bool:
    return looks_like_a_value(text) or any(
        looks_like_a_value(word) for word in re.split("[ /@:,.;=]", text)
    )


def _refuse_value_key(key: str, origin: Origin) -> None:
    if key.lower() in _VALUE_KEYS:
        raise origin.error(
            f"{key[:24]!r}: a spec never holds a key's value (a spec is a file anyone may have "
            "written or read): keep it with `lnk secret set NAME` and give its name in `secret`"
        )


def _refuse_value_text(where: str, origin: Origin) -> None:
    raise origin.error(
        f"{where} looks like a secret's value (not repeated here): a spec names a secret, "
        "never holds one; keep it with `lnk secret set NAME` and give its name in `secret`"
    )


def _shown(value: object) -> str:
    if isinstance(value, str) and len(value) <= 64 and value.isprintable():
        return repr(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return f"a {type(value).__name__}"
