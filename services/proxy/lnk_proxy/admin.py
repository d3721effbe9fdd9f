"""The proxy's admin socket: how the controller opens and closes sandboxes' listeners.

A unix socket at `config.admin_socket`, mode 0600 in a folder of mode 0700 (the controller is
root, both belong to the proxy's user). Each connection is checked with SO_PEERCRED: any uid but
`config.controller_uid` is closed with no answer. Then JSON frames (`lnk_shared.unix`), one
reply per command (the socket, the check and the frame loop: `lnk_shared.admin_socket`; the
commands, here):

    {"op": "open", "sandbox": ID, "socket": PATH, "secret": S,
     "grants": {"internet_any": bool, "internet": [host, ...],
                "lan_any": bool, "lan": [name | address | range, ...]}}
    {"op": "adopt", ...the fields of open..., with the listening socket attached}
    {"op": "secrets", "sandbox": ID, "service_secrets": {NAME: VALUE, ...}}
    {"op": "close", "sandbox": ID}
    {"op": "list"}
    {"op": "stats", "sandbox": ID}
    {"op": "ping"}

`open` and `adopt` may also carry `"services": [RULE, ...]` (`[[services]]` tables, read by the
spec model's own rules), `"models": [RULE, ...]` (`[[models]]` tables, likewise: `model_relay`)
and `"service_secrets": {NAME: VALUE}` (`service_relay`: the values of the secrets either kind
of rule names); `secrets`
replaces a sandbox's values (a name left out: its rule refuses from its next request). No reply
or log line holds a value. The reply is `{"ok": true}` or `{"ok": false, "error": "..."}`. The
reply to `open` carries the new listener's descriptor (SCM_RIGHTS): the controller keeps it, so
the listening socket outlives this process; after a restart the controller hands each one back
with `adopt` (`list` answers `{"ok": true, "sandboxes": [ID, ...]}`, the listeners open now),
`stats` answers `{"ok": true, "fast_decided": N, "handed": M, "charged_s": S, "holds": N,
"held_s": S}` (the sandbox's requests the callback path decided, its connections its relay
handed over: how the e2e tests see which path served them; the proxy's CPU charged to it while
sandboxes shared the proxy, its holds and their seconds: `fair_share`),
and the connections a sandbox made meanwhile wait in its backlog and are served then. Every
field is checked as if hostile (`parse_command`, pure): unknown keys, wrong types, a bad id, a
socket path outside the run dir or too long for a unix socket, a short secret, grants the spec
model would refuse; an adopted socket must be a listening unix socket bound at the path given.
Hosts and `[lan]` entries go through the spec model's own `SpecBuilder`, so the proxy holds a
grant exactly as a spec would. Closing a sandbox that has no listener is not an error.

Security limitations: the peer's uid is the only credential (as of its connect); this does NOT
check which process holds it, nor limit how often the controller asks.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import resource
import signal
import socket
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lnk_proxy.config import ProxyConfig
from lnk_proxy.model_relay import ModelGrant, parse_models
from lnk_proxy.policy import ProxyGrants
from lnk_proxy.server import ProxyServer
from lnk_proxy.service_relay import ServiceGrant, parse_service_secrets, parse_services
from lnk_proxy.wire_log import SANDBOX_ID
from lnk_shared.admin_socket import serve_admin_async, serve_connection_async
from lnk_shared.errors import SpecError
from lnk_shared.hosts import LISTED_ONLY_PORTS
from lnk_shared.spec import MAX_ENTRIES, Origin, SpecBuilder
from lnk_shared.spec_models import ModelRule
from lnk_shared.unix import checked_op

__all__ = [
    "CloseCommand",
    "Command",
    "ListCommand",
    "OpenCommand",
    "PingCommand",
    "SecretsCommand",
    "handle_admin_connection",
    "parse_command",
    "run_proxy",
    "serve_admin",
]

log = logging.getLogger(__name__)

ADMIN_THREADS = 4  # admin connections served at once; the controller uses one at a time
# The loop's default executor: no lookup runs there (each sandbox's resolver has its own
# threads) nor the machine view (its own thread); a few for what a library may still put there.
DEFAULT_THREADS = 4
MAX_SUN_PATH = 107  # sockaddr_un's 108 bytes, one for the NUL
SECRET = re.compile(r"[A-Za-z0-9_-]{32,256}")  # token_urlsafe(24+): enough entropy, no quoting
MAX_PORT = 65535
_GRANT_KEYS = frozenset({"internet_any", "internet", "lan_any", "lan"})
_KEYS = {
    "open": frozenset({"op", "sandbox", "socket", "grants", "secret"}),
    "adopt": frozenset({"op", "sandbox", "socket", "grants", "secret"}),
    "close": frozenset({"op", "sandbox"}),
    "secrets": frozenset({"op", "sandbox", "service_secrets"}),
    "list": frozenset({"op"}),
    "stats": frozenset({"op", "sandbox"}),
    "ping": frozenset({"op"}),
}


@dataclass(frozen=True)
class OpenCommand:
    sandbox: str
    socket: Path
    grants: ProxyGrants
    secret: str
    adopt: bool = False  # serve the listening socket sent with the command, bind nothing
    services: ServiceGrant = field(default_factory=ServiceGrant)
    models: ModelGrant = field(default_factory=ModelGrant)


@dataclass(frozen=True)
class SecretsCommand:
    sandbox: str
    secrets: dict[str, bytes] = field(repr=False)


@dataclass(frozen=True)
class CloseCommand:
    sandbox: str


@dataclass(frozen=True)
class StatsCommand:
    sandbox: str


@dataclass(frozen=True)
class PingCommand:
    pass


@dataclass(frozen=True)
class ListCommand:
    pass


Command = OpenCommand | CloseCommand | PingCommand | ListCommand | SecretsCommand | StatsCommand
_SERVICE_KEYS = ("services", "service_secrets", "models")  # optional in open and adopt


def parse_command(untrusted: dict[str, Any], run_dir: Path) -> Command:
    """A checked command from an untrusted frame; ValueError saying what is wrong."""
    optional = {}
    if untrusted.get("op") in ("open", "adopt"):
        optional = {k: untrusted[k] for k in _SERVICE_KEYS if k in untrusted}
        untrusted = {k: v for k, v in untrusted.items() if k not in _SERVICE_KEYS}
    op = checked_op(untrusted, _KEYS)
    if op == "ping":
        return PingCommand()
    if op == "list":
        return ListCommand()
    sandbox = untrusted["sandbox"]
    if not isinstance(sandbox, str) or not SANDBOX_ID.fullmatch(sandbox):
        raise ValueError("sandbox must be an id of letters, digits, '-' and '_' (1 to 64)")
    if op == "close":
        return CloseCommand(sandbox)
    if op == "stats":
        return StatsCommand(sandbox)
    if op == "secrets":
        return SecretsCommand(sandbox, parse_service_secrets(untrusted["service_secrets"], None))
    secret = untrusted["secret"]
    if not isinstance(secret, str) or not SECRET.fullmatch(secret):
        raise ValueError("secret must be 32 to 256 URL-safe base64 characters")
    models = parse_models(optional.get("models", []))
    return OpenCommand(
        sandbox=sandbox,
        socket=_socket_path(untrusted["socket"], run_dir),
        grants=parse_grants(untrusted["grants"]),
        secret=secret,
        adopt=op == "adopt",
        services=_services(optional, models),
        models=ModelGrant(models),
    )


def _services(optional: dict[str, Any], models: tuple[ModelRule, ...]) -> ServiceGrant:
    """The service rules and the secrets' values, for them and for the model rules' keys."""
    rules = parse_services(optional.get("services", []))
    names = [m.secret for m in models if m.secret is not None]
    values = parse_service_secrets(optional.get("service_secrets", {}), rules, names)
    return ServiceGrant(rules, values, also_names=names)


def _socket_path(untrusted: object, run_dir: Path) -> Path:
    if not isinstance(untrusted, str) or "\x00" in untrusted:
        raise ValueError("socket must be a path")
    if len(untrusted.encode("utf-8", "surrogateescape")) > MAX_SUN_PATH:
        raise ValueError(f"socket: a unix socket's path holds at most {MAX_SUN_PATH} bytes")
    path = Path(untrusted)
    if not path.is_absolute() or ".." in path.parts or os.path.normpath(untrusted) != untrusted:
        raise ValueError("socket must be an absolute, normalized path")
    if not path.is_relative_to(run_dir) or path == run_dir:
        raise ValueError(f"socket must be under the run dir {run_dir}")
    return path


def parse_grants(untrusted: object) -> ProxyGrants:
    """`[internet]` and `[lan]` grants, each entry read by the spec model's own rules."""
    if not isinstance(untrusted, dict) or not (
        _GRANT_KEYS <= set(untrusted) <= _GRANT_KEYS | {"localhost_ports"}
    ):
        raise ValueError(
            f"grants must be an object with {sorted(_GRANT_KEYS)} (and localhost_ports)"
        )
    ports = untrusted.get("localhost_ports", [])
    if (
        not isinstance(ports, list)
        or len(ports) > MAX_ENTRIES
        or not all(type(p) is int and 1 <= p <= MAX_PORT for p in ports)
    ):
        raise ValueError("grants.localhost_ports must be a list of port numbers")
    builder = SpecBuilder(source="admin")
    for key in ("internet_any", "lan_any"):
        if not isinstance(untrusted[key], bool):
            raise ValueError(f"grants.{key} must be true or false")
    for key, add in (("internet", builder.add_internet), ("lan", builder.add_lan)):
        entries = untrusted[key]
        if not isinstance(entries, list) or len(entries) > MAX_ENTRIES:
            raise ValueError(f"grants.{key} must be a list of at most {MAX_ENTRIES} entries")
        for entry in entries:
            if not isinstance(entry, str) or entry == "*":
                raise ValueError(f"grants.{key}: each entry is a string; '*' is {key}_any")
            try:
                add(entry, Origin("admin", f"grants.{key}"))
            except SpecError as exc:
                raise ValueError(str(exc)) from None
    spec = builder.build()
    return ProxyGrants(
        internet_any=untrusted["internet_any"],
        # beside `*`, only the entries it does not cover: `host:22` (LISTED_ONLY_PORTS)
        internet=tuple(
            p for p in spec.internet if not untrusted["internet_any"] or p.port in LISTED_ONLY_PORTS
        ),
        lan_any=untrusted["lan_any"],
        lan=() if untrusted["lan_any"] else spec.lan,
        localhost_ports=frozenset(ports),
    )


async def _run_command(
    server: ProxyServer, command: Command, fds: list[int]
) -> tuple[dict[str, Any], list[int]]:
    """The reply, and the descriptors to send with it. Takes `fds` (closes what it keeps not)."""
    adopted = None
    try:
        if isinstance(command, OpenCommand) and command.adopt:
            if len(fds) != 1:
                raise ValueError("adopt takes exactly one listening socket")
            adopted = socket.socket(fileno=fds.pop())
            await server.adopt_listener(
                command.sandbox,
                command.socket,
                command.grants,
                command.secret,
                adopted,
                services=command.services,
                models=command.models,
            )
            adopted = None  # the server's now
        elif isinstance(command, OpenCommand):
            await server.open_listener(
                command.sandbox,
                command.socket,
                command.grants,
                command.secret,
                services=command.services,
                models=command.models,
            )
            return {"ok": True}, [server.listener_fd(command.sandbox)]
        elif isinstance(command, CloseCommand):
            await server.close_listener(command.sandbox)
        elif isinstance(command, SecretsCommand):
            server.set_service_secrets(command.sandbox, command.secrets)
        elif isinstance(command, ListCommand):
            return {"ok": True, "sandboxes": server.sandboxes()}, []
        elif isinstance(command, StatsCommand):
            sandbox = command.sandbox
            stats = {"fast_decided": server.fast_decided(sandbox), "handed": server.handed(sandbox)}
            return {"ok": True, **stats, **server.share_stats(sandbox)}, []
    except (OSError, ValueError) as exc:
        return {"ok": False, "error": str(exc)}, []
    finally:
        if adopted is not None:
            adopted.close()
        for fd in fds:
            os.close(fd)
    return {"ok": True}, []


async def handle_admin_connection(
    server: ProxyServer,
    sock: socket.socket,
    config: ProxyConfig,
    executor: ThreadPoolExecutor | None = None,
) -> None:
    """Serve one admin connection: frames until the controller closes it. The blocking frame
    calls run on `executor` (the loop's default one when None)."""

    async def handle(untrusted: dict[str, Any], fds: list[int]) -> tuple[dict[str, Any], list[int]]:
        command = parse_command(untrusted, config.run_dir)  # a ValueError closes `fds`
        return await _run_command(server, command, list(fds))

    # adopt's listener rides on its frame; any other command's descriptors are closed
    await serve_connection_async(sock, config.controller_uid, handle, executor, want_fds=True)


async def serve_admin(server: ProxyServer, config: ProxyConfig) -> None:
    """Accept admin connections until cancelled. Their frames are read on threads of their
    own, so a stalled admin peer never holds a thread the resolver needs."""
    await serve_admin_async(
        config.admin_socket,
        lambda sock, executor: handle_admin_connection(server, sock, config, executor),
        threads=ADMIN_THREADS,
        thread_name="lnk-proxy-admin",
    )


def _raise_descriptor_limit() -> None:
    """Every tunnel holds two descriptors: take the hard limit the service manager allows."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        log.info("descriptor limit raised from %d to %d", soft, hard)


async def run_proxy(config: ProxyConfig) -> None:
    """The service: start the server, serve the admin socket until SIGTERM or SIGINT."""
    _raise_descriptor_limit()
    asyncio.get_running_loop().set_default_executor(
        ThreadPoolExecutor(DEFAULT_THREADS, thread_name_prefix="lnk-proxy-default")
    )
    server = ProxyServer(config)
    await server.start()
    admin = asyncio.create_task(serve_admin(server, config))
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, admin.cancel)
    log.info("lnk_proxy ready: admin socket %s", config.admin_socket)
    try:
        await admin
    except asyncio.CancelledError:
        log.info("lnk_proxy stopping")
    finally:
        await server.close()
