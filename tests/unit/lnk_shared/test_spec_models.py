"""lnk_shared.spec_models: a spec's [[models]] rules for every kind, judged on their text; the
defaults per kind; a spec carrying a key is refused without repeating it; each rule is shown and
hashed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lnk_shared.discovery import context_for, resolve_spec
from lnk_shared.errors import SpecError
from lnk_shared.grants import Grants
from lnk_shared.opens import describe, describe_changes
from lnk_shared.paths import BoxPaths
from lnk_shared.refusals import judge
from lnk_shared.spec import Origin
from lnk_shared.spec_file import parse_spec_text
from lnk_shared.spec_models import (
    KINDS,
    ModelRule,
    base_url_value,
    is_cloud_model,
    parse_model_flag,
    parse_model_table,
)

ORIGIN = Origin("spec.toml", "[models]", 3)
KEY = "sk-proj-Xq3v9ZKp2LmN8rT4wY6bC1dF5gH7jK0"
OLLAMA = """
[[models]]
kind = "ollama"
models = ["llama3.2:3b"]
"""


def _table(kind: str = "ollama", **extra: object) -> dict[str, object]:
    table: dict[str, object] = {"kind": kind, "models": ["m1"]}
    if kind in ("anthropic", "openai"):
        table["secret"] = "key"
    return table | extra


@pytest.mark.parametrize(
    ("kind", "port", "env", "base", "upstream"),
    [
        ("ollama", 11434, "OLLAMA_HOST", "http://127.0.0.1:11434", "http://127.0.0.1:11434"),
        ("llamacpp", 8080, "OPENAI_BASE_URL", "http://127.0.0.1:8080/v1", "http://127.0.0.1:8080"),
        ("vllm", 8000, "OPENAI_BASE_URL", "http://127.0.0.1:8000/v1", "http://127.0.0.1:8000"),
        (
            "openai-compatible",
            8000,
            "OPENAI_BASE_URL",
            "http://127.0.0.1:8000/v1",
            "http://127.0.0.1:8000",
        ),
        (
            "openai",
            4000,
            "OPENAI_BASE_URL",
            "http://127.0.0.1:4000/v1",
            "https://api.openai.com:443",
        ),
        (
            "anthropic",
            4001,
            "ANTHROPIC_BASE_URL",
            "http://127.0.0.1:4001",
            "https://api.anthropic.com:443",
        ),
    ],
)
def test_each_kind_has_its_usual_port_variable_and_upstream(
    kind: str, port: int, env: str, base: str, upstream: str
) -> None:
    rule = parse_model_table(_table(kind), ORIGIN)
    assert (rule.port, rule.env, base_url_value(rule), rule.upstream) == (port, env, base, upstream)
    assert rule.local == (kind not in ("anthropic", "openai"))


def test_a_rule_holds_what_the_spec_said_sorted_and_deduplicated() -> None:
    table = _table(
        "vllm",
        models=["b", "a", "b"],
        upstream="http://10.0.0.5:9000/",
        secret="vllm-key",
        port=8001,
        env="OPENAI_BASE_URL",
    )
    rule = parse_model_table(table, ORIGIN)
    assert rule == ModelRule(
        "vllm", "http", "10.0.0.5", 9000, ("a", "b"), "vllm-key", 8001, "OPENAI_BASE_URL"
    )
    assert not rule.on_this_machine


@pytest.mark.parametrize(
    ("upstream", "host", "port", "here"),
    [
        ("http://localhost:11434", "127.0.0.1", 11434, True),
        ("http://127.0.0.2", "127.0.0.2", 80, True),
        ("http://[::1]:11434", "::1", 11434, True),
        ("http://[::ffff:127.0.0.1]:11434", "127.0.0.1", 11434, True),
        ("http://2130706433:11434", "127.0.0.1", 11434, True),
        ("http://192.168.1.9:11434", "192.168.1.9", 11434, False),
        ("http://100.64.0.7:11434", "100.64.0.7", 11434, False),
        ("http://[fd00::5]:8000", "fd00::5", 8000, False),
        ("http://GPU-Box.lan:11434", "gpu-box.lan", 11434, False),
    ],
)
def test_a_local_upstream_is_this_machine_or_your_network(
    upstream: str, host: str, port: int, here: bool
) -> None:
    rule = parse_model_table(_table(upstream=upstream), ORIGIN)
    assert (rule.host, rule.upstream_port, rule.on_this_machine) == (host, port, here)


@pytest.mark.parametrize(
    ("table", "why"),
    [
        (_table(upstream="http://8.8.8.8:11434"), "neither this machine's loopback nor a private"),
        (_table(upstream="http://[2001:4860::8888]"), "neither this machine's loopback"),
        (_table(upstream="http://0.0.0.0:11434"), "neither this machine's loopback"),
        (_table(upstream="http://169.254.169.254"), "neither this machine's loopback"),
        (_table(upstream="https://127.0.0.1:11434"), r"over http://"),
        (_table(upstream="127.0.0.1:11434"), r"over http://"),
        (_table(upstream="http://127.0.0.1:11434/api"), "no path or query"),
        (_table(upstream="http://127.0.0.1:11434?x=1"), "no path or query"),
        (_table(upstream="http://u:p@127.0.0.1:11434"), "a user or password"),
        (_table(upstream="http://127.0.0.1:99999"), "not 1 to 65535"),
        (_table(upstream="http://127.0.0.1:40781"), "the box's main proxy's"),
        (_table(upstream="http://localhost:40781"), "the box's main proxy's"),
        (_table(upstream="http://127.0.0.1:x"), "not a number"),
        (_table(upstream="http://ex ample"), "upstream"),
        (_table(upstream=3), "upstream: expected"),
        (_table("openai", upstream="http://api.openai.com"), r"over https://"),
        (_table("openai", upstream="https://127.0.0.1"), "the provider's public host"),
        (_table("anthropic", upstream="https://localhost"), "the provider's public host"),
        (_table("anthropic", upstream="https://10.1.1.1"), "the provider's public host"),
        (_table(models=[]), "models is empty, which would open nothing"),
        (_table(models="m1"), "models: expected"),
        (_table(models=["*"]), "would allow every model"),
        (_table(models=["bad name"]), "is not a model name"),
        (_table(models=["-x"]), "is not a model name"),
        (_table(models=["a" * 201]), "is not a model name"),
        (_table(models=["gpt-oss:cloud*"]), "name a cloud model exactly"),
        (_table(kind="mystery"), "kind: expected one of"),
        (_table(kind=None), "kind: expected one of"),
        (_table("openai", secret=None), "names the secret its key is kept as"),
        (_table("anthropic", secret=None), "names the secret its key is kept as"),
        (_table(secret="key"), "takes no key"),
        (_table("llamacpp", secret="key"), "takes no key"),
        (_table("vllm", secret="bad name"), "not a secret's name"),
        (_table("vllm", secret=3), "secret: expected the name"),
        (_table(port=0), "port: expected a port number"),
        (_table(port=True), "port: expected a port number"),
        (_table(port="11434"), "port: expected a port number"),
        (_table(port=40781), "main proxy's port"),
        (_table(env="LD_PRELOAD"), "env: expected one of"),
        (_table(env="PATH"), "env: expected one of"),
        (_table(url="http://x"), "unknown key 'url'"),
    ],
)
def test_a_malformed_rule_is_a_spec_error_naming_what(table: dict[str, object], why: str) -> None:
    with pytest.raises(SpecError, match=why):
        parse_model_table(table, ORIGIN)


@pytest.mark.parametrize("kind", ["vllm", "openai-compatible"])
def test_an_openai_shaped_runtime_may_or_may_not_take_a_key(kind: str) -> None:
    assert parse_model_table(_table(kind), ORIGIN).secret is None
    assert parse_model_table(_table(kind, secret="k"), ORIGIN).secret == "k"


def test_every_kind_parses() -> None:
    assert {parse_model_table(_table(k), ORIGIN).kind for k in KINDS} == set(KINDS)


@pytest.mark.parametrize("key", ["token", "key", "api_key", "password", "Api_Key"])
def test_a_key_that_would_carry_the_value_is_refused_without_repeating_it(key: str) -> None:
    with pytest.raises(SpecError, match="never holds a key's value") as raised:
        parse_model_table(_table("openai", **{key: KEY}), ORIGIN)
    assert "Xq3v9" not in str(raised.value)


@pytest.mark.parametrize(
    "table",
    [
        _table("openai", secret=KEY),
        _table("vllm", upstream=f"http://{KEY}.lan:8000"),
        _table(models=[KEY]),
    ],
)
def test_a_value_where_a_name_goes_is_refused_without_repeating_it(
    table: dict[str, object],
) -> None:
    with pytest.raises(SpecError, match="looks like a secret's value") as raised:
        parse_model_table(table, ORIGIN)
    assert "Xq3v9" not in str(raised.value)


@pytest.mark.parametrize(
    ("models", "name", "allowed"),
    [
        (("llama3.2:3b",), "llama3.2:3b", True),
        (("llama3.2:3b",), "llama3.2:1b", False),
        (("llama3.2:3b",), "LLAMA3.2:3b", False),
        (("qwen2.5*",), "qwen2.5-coder:7b", True),
        (("qwen2.5*",), "qwen3:8b", False),
        (("gpt-oss*",), "gpt-oss:120b-cloud", False),  # a cloud model, never by a prefix
        (("gpt-oss*",), "gpt-oss:cloud", False),
        (("gpt-oss*",), "gpt-oss:20b", True),
        (("gpt-oss:120b-cloud",), "gpt-oss:120b-cloud", True),  # named exactly: allowed
    ],
)
def test_the_allowlist_names_models_or_families_never_cloud_by_prefix(
    models: tuple[str, ...], name: str, allowed: bool
) -> None:
    rule = parse_model_table(_table(models=list(models)), ORIGIN)
    assert rule.allows_model(name) is allowed


@pytest.mark.parametrize(
    ("name", "cloud"),
    [("gpt-oss:120b-cloud", True), ("x:cloud", True), ("cloud", False), ("a:b", False)],
)
def test_a_cloud_model_is_told_by_its_tag(name: str, cloud: bool) -> None:
    assert is_cloud_model(name) is cloud


def test_the_flag_form_is_the_same_rule() -> None:
    origin = Origin("command line", "--model")
    assert parse_model_flag("ollama=llama3.2:3b", origin) == parse_model_table(
        _table(models=["llama3.2:3b"]), ORIGIN
    )
    flag = "vllm=a,b;upstream=http://10.0.0.5:9000;secret=vllm-key;port=8001;env=OPENAI_BASE_URL"
    assert parse_model_flag(flag, origin) == parse_model_table(
        _table(
            "vllm",
            models=["a", "b"],
            upstream="http://10.0.0.5:9000",
            secret="vllm-key",
            port=8001,
            env="OPENAI_BASE_URL",
        ),
        ORIGIN,
    )


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("ollama", "expected KIND=MODEL"),
        ("ollama=", "models is empty"),
        ("ollama=m;colour=red", "expected one each of"),
        ("ollama=m;port=1;port=2", "expected one each of"),
        ("ollama=m;port=x", "port: expected"),
        (f"openai=gpt-5;secret={KEY}", "looks like a secret's value"),
        (f"openai=gpt-5;key={KEY}", "never holds a key's value"),
        (KEY, "looks like a secret's value"),
    ],
)
def test_a_malformed_flag_says_what(text: str, why: str) -> None:
    with pytest.raises(SpecError, match=why) as raised:
        parse_model_flag(text, Origin("command line", "--model"))
    assert "Xq3v9" not in str(raised.value)


def test_a_models_table_instead_of_an_array_is_a_spec_error() -> None:
    with pytest.raises(SpecError, match=r"\[\[models\]\] tables"):
        parse_spec_text('[models]\nkind = "ollama"\n', source="spec.toml", base="/")


def test_two_rules_on_one_port_or_one_variable_are_a_spec_error() -> None:
    with pytest.raises(SpecError, match="a second model rule on port 11434"):
        parse_spec_text(OLLAMA + OLLAMA, source="spec.toml", base="/")
    vllm = '[[models]]\nkind = "vllm"\nmodels = ["a"]\n'
    llama = '[[models]]\nkind = "llamacpp"\nmodels = ["a"]\n'
    with pytest.raises(SpecError, match="a second model rule setting OPENAI_BASE_URL"):
        parse_spec_text(vllm + llama, source="spec.toml", base="/")


def test_a_model_port_that_is_also_a_localhost_port_is_a_spec_error() -> None:
    text = OLLAMA + "[localhost]\nports = [11434]\n"
    with pytest.raises(SpecError, match="both take port 11434"):
        parse_spec_text(text, source="spec.toml", base="/").build()
    moved = OLLAMA + "port = 11500\n[localhost]\nports = [11434]\n"
    spec = parse_spec_text(moved, source="spec.toml", base="/").build()
    assert spec.ports == (11434,) and spec.models[0].port == 11500


def _grants(tmp_path: Path, text: str) -> Grants:
    spec = parse_spec_text(text, source=str(tmp_path / "s.toml"), base=str(tmp_path)).build()
    box = BoxPaths(tmp_path / "box/c", tmp_path / "box/s", tmp_path / "box/r")
    env = {"PATH": "/usr/bin:/bin", "XDG_RUNTIME_DIR": str(tmp_path / "xdg")}
    ctx = context_for(os.getuid(), env=env, box=box, spec_file=None, home=str(tmp_path))
    return judge(resolve_spec(spec, ctx, path_env="/usr/bin:/bin"), ctx)


def test_a_rule_is_in_the_hash_with_every_field(tmp_path: Path) -> None:
    plain = _grants(tmp_path, "")
    assert "models" not in plain.canonical()  # specs without one keep the hash they had
    ollama = _grants(tmp_path, OLLAMA)
    assert ollama.canonical()["models"] == [
        {
            "kind": "ollama",
            "upstream": "http://127.0.0.1:11434",
            "models": ["llama3.2:3b"],
            "secret": None,
            "port": 11434,
            "env": "OLLAMA_HOST",
        }
    ]
    assert ollama.spec.has_proxy
    variants = [
        OLLAMA.replace('"llama3.2:3b"', '"llama3.2:3b", "qwen3:8b"'),
        OLLAMA + 'upstream = "http://192.168.1.9:11434"\n',
        OLLAMA + "port = 11500\n",
        OLLAMA + 'env = "OPENAI_BASE_URL"\n',
    ]
    digests = {plain.digest(), ollama.digest(), *(_grants(tmp_path, v).digest() for v in variants)}
    assert len(digests) == 2 + len(variants)
    same = _grants(tmp_path, OLLAMA + 'upstream = "http://localhost:11434"\n')
    assert same.digest() == ollama.digest()


def test_the_approval_shows_where_which_models_the_port_and_the_secret_by_name(
    tmp_path: Path,
) -> None:
    ollama = _grants(
        tmp_path, OLLAMA.replace('"llama3.2:3b"', '"llama3.2:3b", "gpt-oss:20b-cloud"')
    )
    text = "\n".join(describe(ollama))
    assert "ollama http://127.0.0.1:11434 (this machine), its inference only" in text
    assert "admin API (pull, create, delete, ...) refused" in text
    assert "models: gpt-oss:20b-cloud, llama3.2:3b" in text
    assert "OLLAMA_HOST=http://127.0.0.1:11434" in text and "no key" in text
    assert "run at ollama.com" in text
    vllm = '[[models]]\nkind = "vllm"\nmodels = ["q"]\nsecret = "vllm-key"\n'
    vllm += 'upstream = "http://10.0.0.5:8000"\n'
    text = "\n".join(describe(_grants(tmp_path, vllm)))
    assert "(your network)" in text and "the secret vllm-key added outside" in text
    more = _grants(tmp_path, OLLAMA.replace('"llama3.2:3b"', '"llama3.2:3b", "qwen3:8b"'))
    changes = "\n".join(describe_changes(ollama.canonical_json(), more))
    assert "+ model" in changes and "qwen3:8b" in changes and "- model" in changes
