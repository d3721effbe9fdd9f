"""What a spec opens, told to a person: a table of grants (links shown with where they really
are) and, for a spec that changed since it was approved, what changed. Every path, link target,
host and entry in them came from a spec or from disk, so each goes through
`lnk_shared.display.shown` before it joins a line."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from lnk_shared.display import shown
from lnk_shared.grants import Grants, ResolvedPath
from lnk_shared.spec_models import ModelRule, base_url_value, is_cloud_model
from lnk_shared.spec_services import ServiceRule

__all__ = [
    "box_grant_lines",
    "connector_grant_lines",
    "describe",
    "describe_changes",
    "env_lines",
    "grants_document",
]

_SECTION_TITLES = {
    "read": "read",
    "write": "write",
    "commands": "run",
    "internet": "internet",
    "network": "network",
    "lan": "lan",
    "browser": "browser",
    "localhost_ports": "localhost port",
    "with_fds": "passed folder",
    "hidden": "hidden inside",
    "store": "store",
    "services": "service",
    "models": "model",
}


def _path_line(kind: str, p: ResolvedPath) -> str:
    line = f"  {kind:<15} {shown(p.written)}"
    if p.written != p.real:
        line += f"  ->  {shown(p.real)}"
    if p.found_on_path is not None and p.found_on_path != p.real:
        line += f"\n  {'':<15}   (found on PATH as {shown(p.found_on_path)})"
    for hop in p.links:
        link, target = shown(hop.link), shown(hop.target)
        line += f"\n  {'':<15}   (link {link} -> {target}, owner uid {hop.owner_uid})"
    return line


def describe(grants: Grants) -> list[str]:
    """Lines telling what the sandbox opens; an empty spec says it opens nothing."""
    s = grants.spec
    lines: list[str] = []
    lines += [_path_line("read", p) for p in s.read]
    lines += [_path_line("write", p) for p in s.write]
    lines += [_path_line(f"fd {f.fd} {'write' if f.write else 'read'}", f.path) for f in s.with_fds]
    if s.commands_any:
        lines.append(f"  {'run':<15} any program (only the exec limit is lifted)")
    else:
        lines += [_path_line("run", p) for p in s.commands]
    if s.network_host:
        lines.append(f"  {'network':<15} host: every host and port, this machine's included")
    if s.internet_any:
        lines.append(f"  {'internet':<15} * (any public host, through the proxy)")
    lines += [f"  {'internet':<15} {shown(str(h))}" for h in s.internet]
    if s.lan_any:
        lines.append(f"  {'lan':<15} * (every private network, through the proxy)")
    lines += [f"  {'lan':<15} {shown(str(e))}" for e in s.lan]
    lines += [f"  {'browser':<15} {shown(str(h))}" for h in s.browser]
    lines += [
        f"  {'localhost port':<15} {p} (whatever serves it, with its whole API)" for p in s.ports
    ]
    if s.store_driver:
        lines.append(
            f"  {'store':<15} {shown(s.store_driver)} (the agent's conversations and lease, "
            "kept outside by the box's store bridge)"
        )
    lines += [_service_line(r) for r in s.services]
    lines += [_model_line(r) for r in s.models]
    lines += [f"  {'hidden inside':<15} {shown(h)}" for h in grants.hidden]
    if not lines:
        lines.append("  nothing: no folders, no network, no programs but the one it runs")
    elif not s.commands and not s.commands_any:
        lines.append(f"  {'run':<15} only the program named to run (and its #! interpreter)")
    return lines


def env_lines(names: Iterable[str]) -> list[str]:
    """The `[env]` and `--env` names a sandbox starts with. Names only: a value may be a key,
    and the names are not grants (lnk_shared.env_names refuses any that changes what a granted
    program runs), so neither is part of the grants' hash."""
    return [f"  {'env':<15} {shown(name)} (set inside; its value not shown)" for name in names]


def box_grant_lines(programs: Iterable[str], *, agents_only: bool = False) -> list[str]:
    """What the box grants besides the spec in a sandbox that may call a bridge: its `lnk`
    client, which makes the bridge calls itself (lnk_controller/box_client.py). Not part of
    the grants' hash: the box's own files, not the spec's."""
    where = " in an agent's sandbox" if agents_only else ""
    shown_programs = ", ".join(shown(p) for p in programs)
    return [
        f"  {'run':<15} lnk (granted by the box{where}: its bridges' client, on PATH)",
        f"  {'':<15}   {shown_programs} (static C: it adds no interpreter to the list)",
    ]


def connector_grant_lines(programs: Iterable[str]) -> list[str]:
    """The box's ssh connector, granted to every sandbox with a proxy (git over ssh goes through
    it: lnk_controller/client_proxy_env.py). Not part of the grants' hash either."""
    return [
        f"  {'run':<15} {shown(p)} (granted by the box with a proxy: git over ssh, "
        "through the proxy)"
        for p in programs
    ]


def _service_line(rule: ServiceRule) -> str:
    """A service rule: where its secret goes, which secret (by name), and what it may call."""
    if rule.kind == "telegram":
        what = "Bot API methods"
        refused = "; never setWebhook, logOut or close"
        position = "in the path after /bot"
    else:
        what = "calls"
        refused = ""
        position = "as Authorization: Bearer"
    allowed = ", ".join(shown(a) for a in rule.allow)
    return (
        f"  {'service':<15} {rule.kind} https://{shown(rule.host)}, the secret "
        f"{shown(rule.secret)} added outside {position}\n"
        f"  {'':<15}   {what}: {allowed}{refused}\n"
        f"  {'':<15}   (a client sends plain http to the proxy; a CONNECT to this host is refused)"
    )


# What each local kind's admin API holds, as the approval names it (lnk_proxy.model_routes).
_ADMIN_SHOWN = {
    "ollama": "pull, create, delete",
    "llamacpp": "slots, props, LoRA, model loading",
    "vllm": "pause, sleep, weights, LoRA",
    "openai-compatible": "files, fine-tuning, batches",
}


def _model_line(rule: ModelRule) -> str:
    """A model rule: where it goes, which models, which secret (by name), where it is served."""
    if rule.local:
        where = "this machine" if rule.on_this_machine else "your network"
        what = f"its inference only; its admin API ({_ADMIN_SHOWN[rule.kind]}, ...) refused"
    else:
        where = "the provider"
        what = "its inference only; server-side tools removed, URLs it would fetch refused"
    key = (
        f"the secret {shown(rule.secret)} added outside (a client's own key dropped)"
        if rule.secret
        else "no key"
    )
    models = ", ".join(shown(m) for m in rule.models)
    cloud = [m for m in rule.models if rule.kind == "ollama" and is_cloud_model(m)]
    lines = [
        f"  {'model':<15} {rule.kind} {shown(rule.upstream)} ({where}), {what}",
        f"  {'':<15}   models: {models}",
        f"  {'':<15}   served inside on 127.0.0.1:{rule.port} ({rule.env}="
        f"{base_url_value(rule)}), {key}",
    ]
    if cloud:
        lines.append(
            f"  {'':<15}   cloud models {', '.join(shown(m) for m in cloud)} run at ollama.com "
            "under the identity its runtime is signed in with"
        )
    return "\n".join(lines)


def grants_document(grants: Grants) -> dict[str, Any]:
    """The JSON form of `lnk spec show --json`: canonical grants, hash, and how paths resolved."""
    s = grants.spec

    def path(p: ResolvedPath) -> dict[str, Any]:
        return {
            "written": p.written,
            "real": p.real,
            "found_on_path": p.found_on_path,
            "links": [
                {"link": h.link, "target": h.target, "owner_uid": h.owner_uid} for h in p.links
            ],
        }

    return {
        "spec": s.source,
        "hash": grants.digest(),
        "grants": grants.canonical(),
        "paths": {
            "read": [path(p) for p in s.read],
            "write": [path(p) for p in s.write],
            "commands": [path(p) for p in s.commands],
        },
    }


def describe_changes(previous_json: str, grants: Grants) -> list[str]:
    """Lines telling what opens or closes compared with the approved canonical document."""
    try:
        before: dict[str, Any] = json.loads(previous_json)
    except ValueError:
        before = {}
    after = grants.canonical()
    lines: list[str] = []
    for key, title in _SECTION_TITLES.items():
        old, new = before.get(key), after.get(key)
        if old == new:
            continue
        old_set = set(_items(old))
        new_set = set(_items(new))
        lines += [f"  + {title:<15} {shown(item)}" for item in sorted(new_set - old_set)]
        lines += [f"  - {title:<15} {shown(item)}" for item in sorted(old_set - new_set)]
    if before.get("version") != after.get("version"):
        lines.append("  (the box's way of recording grants changed, so it asks again)")
    return lines or ["  (nothing visible changed)"]


def _items(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, list):
        return [_item(v) for v in value]
    return [str(value)]


def _item(value: Any) -> str:
    if isinstance(value, list):
        return " ".join(map(str, value))
    if isinstance(value, dict) and "models" in value:  # a model rule: likewise every field
        models = ",".join(map(str, value.get("models", [])))
        return (
            f"{value.get('kind')} {value.get('upstream')} models {models} secret "
            f"{value.get('secret')} port {value.get('port')} {value.get('env')}"
        )
    if isinstance(value, dict):  # a service rule: every field, so a change in any one shows
        allow = ",".join(map(str, value.get("allow", [])))
        return f"{value.get('kind')} {value.get('host')} secret {value.get('secret')} {allow}"
    return str(value)
