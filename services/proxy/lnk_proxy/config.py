"""The proxy's config: one strict model. An unknown key, a wrong type or an impossible value is
fatal (`field: message`, exit 2); nothing falls back to a default silently.

Read from `<config dir>/proxy.toml` when it exists; LNK_CONFIG_DIR, LNK_STATE_DIR and
LNK_RUN_DIR override the three folders, so a test runs an isolated proxy in a temp dir. Paths
left out are derived from them: the admin socket in the proxy's own folder `<run_dir>/proxy`
(mode 0700: the proxy, and root, reach what is in it), the flags folder `<run_dir>/flags`
(the controller's), the wire's logs under `<state_dir>/wire`.

The three `unsafe_…` settings exist for test boxes only and log a warning when the config loads
(and the resolver warns on every lookup through the table): `unsafe_public_networks` makes
special ranges such as 198.18.0.0/15 count as the public internet; `unsafe_dns_table` answers
names from a JSON file instead of this machine's resolver; `unsafe_skip_route_check` skips the
kernel's route judgement (`route_check`), so `lnk sandbox check` can show that class leak;
`unsafe_service_ca` makes a service rule's upstream verified against this CA file alone instead
of the system's roots (the test internet's CA); `unsafe_skip_service_method_check` forwards a
service rule's request whatever its method or route (`lnk sandbox check` shows that leak);
`unsafe_skip_model_route_check` likewise a model rule's request whatever its route (its
runtime's admin API);
`unsafe_unbounded_tunnels` lifts the per-sandbox tunnel cap and tunnel buffer budget, and
`unsafe_log_every_refusal` turns off the wire log's aggregation of repeated refusals and the
room it keeps for allowed decisions; `unsafe_keep_server_tools` sends a hosted model rule's
request with every tool it names, the provider's server tools included;
`unsafe_ssh_port_by_any_entry` lets port 22 be reached by a name listed without a port or by
`*` (policy.LISTED_ONLY_PORTS); `unsafe_hosted_tunnel_by_address` lets a CONNECT reach a hosted
model rule's provider by its address or another name (`hosted_tunnels`);
`unsafe_unbounded_model_bodies` gives a model rule's body to the JSON parser however many
values it holds or however deep it nests (`strict_json.refuse_many_values` skipped at its two
call sites, `hosted_models` and `model_bodies`); `unsafe_per_level_nesting` counts that
nesting by a pass per level (`json_shape.passes_within`, as without the C module: ~2 s of the
proxy's loop for 2 MiB of runs nested just under the bound); `unsafe_uncut_model_listings`
passes a local runtime's model listing on as it came, every model the owner keeps named
(`model_listings`); `unsafe_naive_content_screen` forwards a hosted rule's conversation as the
client's bytes after a naive screen instead of the C pass's strict one (`unsafe_naive_screen`:
escaped spellings, keys given twice and bad UTF-8 go through): `lnk sandbox check` shows each
class leak.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from lnk_proxy import tunnel_buffers
from lnk_shared.addresses import IPNetwork
from lnk_shared.box_env import DEFAULT_RUN_DIR, DEFAULT_STATE_DIR
from lnk_shared.service_config import ServicePaths, load_service_config

__all__ = ["CONFIG_FILE", "PROXY_RUN_DIR", "ProxyConfig", "load_config"]

log = logging.getLogger(__name__)

CONFIG_FILE = "proxy.toml"
PROXY_RUN_DIR = "proxy"  # under run_dir: the proxy's own folder (admin socket, listeners)
MAX_UID = 2**32 - 2  # (uid_t)-1 means "no change" to the kernel: never a real uid
MAX_CONNECT_TIMEOUT_S = 120.0  # past Linux's own SYN retry budget (~127 s): waiting is useless
MAX_TUNNELS = 65_536  # far above any real client; each tunnel holds two descriptors
MAX_CONNECTIONS = 65_536  # likewise: the proxy's descriptor limit is shared by all sandboxes
MIN_WIRE_LOG = 64 << 10  # room for a few hundred lines: smaller could not log one exchange
MAX_WIRE_LOG = 64 << 30  # a per-sandbox bound past the disks lnk runs on is a typo
MAX_WIRE_BOX = 16 << 40  # likewise for the whole box's
MAX_UNSAFE_NETWORKS = 64  # a test internet needs one or two ranges
MAX_BUFFER_BUDGET = 64 << 30  # a sandbox's tunnels' kernel buffers past the largest machine's RAM


class ProxyConfig(ServicePaths):
    """Where the proxy keeps things, who may command it, and its per-sandbox limits."""

    RUN_FOLDER = PROXY_RUN_DIR  # the admin socket: <run_dir>/proxy/admin.sock

    # Derived when absent (`_derived_paths`); the placeholder `.` could never pass `_check`.
    wire_log_dir: Path = Field(default=Path(), strict=False)  # <state_dir>/wire
    flags_dir: Path = Field(default=Path(), strict=False)  # <run_dir>/flags
    controller_uid: int = Field(default=0, ge=0, le=MAX_UID)
    unsafe_public_networks: list[str] = Field(default_factory=list, max_length=MAX_UNSAFE_NETWORKS)
    unsafe_dns_table: Path | None = Field(default=None, strict=False)
    # The table's answers kept per sandbox for ANSWER_CACHE_S as the system resolver's are
    # (tests of the kept-answer path: the callback path's requests to names); off, a changed
    # answer is seen by the very next request.
    unsafe_dns_table_kept: bool = False
    unsafe_skip_route_check: bool = False  # tests of `lnk sandbox check` only: reopens a leak
    unsafe_service_ca: Path | None = Field(default=None, strict=False)  # the test internet's
    unsafe_skip_service_method_check: bool = False  # tests of `lnk sandbox check` only
    unsafe_skip_model_route_check: bool = False  # likewise: a model's admin API let through
    unsafe_unbounded_tunnels: bool = False  # likewise: no tunnel cap, no buffer budget
    unsafe_log_every_refusal: bool = False  # likewise: no aggregation, no room kept for allowed
    unsafe_keep_server_tools: bool = False  # likewise: a hosted model's server tools kept
    unsafe_ssh_port_by_any_entry: bool = False  # likewise: port 22 by a bare name or `*`
    unsafe_hosted_tunnel_by_address: bool = False  # likewise: a provider tunneled to by address
    unsafe_unbounded_model_bodies: bool = False  # likewise: no value or nesting bound pre-parse
    unsafe_uncut_model_listings: bool = False  # likewise: a runtime's whole model listing
    unsafe_per_level_nesting: bool = False  # likewise: the pre-parse nesting count level by level
    unsafe_naive_content_screen: bool = False  # likewise: the fast form's screen, naive
    connect_timeout_s: float = Field(default=10.0, gt=0, le=MAX_CONNECT_TIMEOUT_S)
    max_tunnels_per_sandbox: int = Field(default=256, ge=1, le=MAX_TUNNELS)
    max_connections_per_sandbox: int = Field(default=512, ge=1, le=MAX_CONNECTIONS)
    # Each sandbox's tunnels' fixed kernel buffers together, at worst (`tunnel_buffers`).
    tunnel_buffer_budget_bytes: int = Field(
        default=tunnel_buffers.BUDGET, ge=tunnel_buffers.SMALL.worst_case(), le=MAX_BUFFER_BUDGET
    )
    # Each sandbox's wire log, at most: a quarter kept for allowed decisions (`wire_log`).
    wire_log_max_bytes: int = Field(default=256 << 20, ge=MIN_WIRE_LOG, le=MAX_WIRE_LOG)
    # Every sandbox's wire log together (`wire_log`): at it, new exchanges are refused.
    wire_box_max_bytes: int = Field(default=8 << 30, ge=MIN_WIRE_LOG, le=MAX_WIRE_BOX)

    @model_validator(mode="before")
    @classmethod
    def _derived_paths(cls, data: Any) -> Any:
        """Fill the paths derived from run_dir and state_dir when they are not given."""
        if not isinstance(data, dict):
            return data
        values = dict(data)
        run = values.get("run_dir", DEFAULT_RUN_DIR)
        state = values.get("state_dir", DEFAULT_STATE_DIR)
        if isinstance(run, str | Path):
            values.setdefault("flags_dir", Path(run) / "flags")
        if isinstance(state, str | Path):
            values.setdefault("wire_log_dir", Path(state) / "wire")
        return values

    @field_validator("unsafe_public_networks")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        for text in value:
            try:
                ipaddress.ip_network(text, strict=True)
            except ValueError as exc:
                raise ValueError(f"{text!r} is not a network: {exc}") from None
        return value

    @model_validator(mode="after")
    def _check(self) -> ProxyConfig:
        for name in ("wire_log_dir", "flags_dir"):  # the service's own folders: ServicePaths
            if not getattr(self, name).is_absolute():
                raise ValueError(f"{name} must be an absolute path")
        if self.unsafe_dns_table is not None and not self.unsafe_dns_table.is_absolute():
            raise ValueError("unsafe_dns_table must be an absolute path")
        if self.unsafe_service_ca is not None and not self.unsafe_service_ca.is_absolute():
            raise ValueError("unsafe_service_ca must be an absolute path")
        if self.unsafe_service_ca is not None:
            log.warning(
                "unsafe_service_ca=%s: service rules' upstreams are verified against this CA "
                "only, not the system's roots (a test setting; never on a real box)",
                self.unsafe_service_ca,
            )
        if self.unsafe_ssh_port_by_any_entry:
            log.warning(
                "unsafe_ssh_port_by_any_entry: port 22 (ssh) is reached by an [internet] name "
                "listed without a port, or by '*', as any other port is (a test setting; never "
                "on a real box)"
            )
        if self.unsafe_hosted_tunnel_by_address:
            log.warning(
                "unsafe_hosted_tunnel_by_address: while a hosted model rule is granted, a "
                "CONNECT to its provider's address (a literal, another name) is tunneled under "
                "[internet] past the rule (a test setting; never on a real box)"
            )
        if self.unsafe_keep_server_tools:
            log.warning(
                "unsafe_keep_server_tools: a hosted model rule's request goes to the provider "
                "with its server tools (web search, web fetch, code execution, MCP...) kept (a "
                "test setting; never on a real box)"
            )
        if self.unsafe_unbounded_model_bodies:
            log.warning(
                "unsafe_unbounded_model_bodies: a model rule's request body is parsed however "
                "many values it holds or however deep it nests, so one request can take the "
                "proxy's memory and CPU (a test setting; never on a real box)"
            )
        if self.unsafe_per_level_nesting:
            log.warning(
                "unsafe_per_level_nesting: a model rule's body is measured for nesting by a "
                "pass per level, so one request of many deep runs takes seconds of the proxy's "
                "loop (a test setting; never on a real box)"
            )
        if self.unsafe_naive_content_screen:
            log.warning(
                "unsafe_naive_content_screen: a hosted model rule's conversation is forwarded "
                "as the client's bytes after a naive screen of them as written, so escaped "
                "spellings, keys given twice and bad UTF-8 reach the provider unjudged (a test "
                "setting; never on a real box)"
            )
        if self.unsafe_uncut_model_listings:
            log.warning(
                "unsafe_uncut_model_listings: a local model runtime's listings (/api/tags, "
                "/v1/models...) reach the sandbox uncut, naming every model the runtime keeps "
                "(a test setting; never on a real box)"
            )
        if self.unsafe_skip_model_route_check:
            log.warning(
                "unsafe_skip_model_route_check: a model rule's request reaches its runtime "
                "whatever its route, the admin API's included (a test setting; never on a "
                "real box)"
            )
        if self.unsafe_skip_service_method_check:
            log.warning(
                "unsafe_skip_service_method_check: a service rule's request goes upstream "
                "with the secret whatever its method or route (a test setting; never on a "
                "real box)"
            )
        if self.unsafe_public_networks:
            log.warning(
                "unsafe_public_networks=%s: these ranges count as the public internet (a test "
                "setting; never on a real box)",
                ", ".join(self.unsafe_public_networks),
            )
        if self.unsafe_skip_route_check:
            log.warning(
                "unsafe_skip_route_check: addresses are no longer judged by the kernel's route, "
                "so a sandbox reaches this machine through a lo prefix or a local route (a "
                "test setting; never on a real box)"
            )
        if self.unsafe_unbounded_tunnels:
            log.warning(
                "unsafe_unbounded_tunnels: a sandbox may open tunnels past "
                "max_tunnels_per_sandbox and tunnel_buffer_budget_bytes, pinning the proxy's "
                "memory and descriptors (a test setting; never on a real box)"
            )
        if self.unsafe_log_every_refusal:
            log.warning(
                "unsafe_log_every_refusal: every refusal gets its own wire-log line and may use "
                "the whole log, so a refusal flood can fill it and blind it to allowed decisions "
                "(a test setting; never on a real box)"
            )
        if self.unsafe_dns_table is not None:
            log.warning(
                "unsafe_dns_table=%s: names are answered from this file, not this machine's "
                "resolver (a test setting; never on a real box)",
                self.unsafe_dns_table,
            )
        return self

    @property
    def public_networks(self) -> tuple[IPNetwork, ...]:
        """`unsafe_public_networks`, parsed (checked when the config loaded)."""
        return tuple(ipaddress.ip_network(text) for text in self.unsafe_public_networks)


def load_config(env: Mapping[str, str] | None = None) -> ProxyConfig:
    """Load and validate the proxy's config; raise ConfigError naming each bad field."""
    return load_service_config(ProxyConfig, CONFIG_FILE, env)
