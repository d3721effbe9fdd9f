"""The spec model: what a sandbox asks for, validated and immutable.

A spec comes from a TOML file, from command-line flags, or both merged; either way it goes
through `SpecBuilder`, so one set of checks applies. This module checks the *form* of each entry
(a host is a host, a port is a port, a path is a path). What an entry *opens* on this machine
(links, PATH, sockets, settings) is judged later, on the resolved grants (`discovery`,
`refusals`).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from lnk_shared.addresses import (
    CGNAT_NETWORK,
    METADATA_ADDRESSES,
    effective_address,
    is_lan_network,
    is_private_lan,
)
from lnk_shared.env_names import (
    MAX_ENV_ENTRIES,
    check_env_entries,
    env_name_problem,
    env_value_problem,
    refusal_reason,
)
from lnk_shared.errors import EnvRefused, PortRefused, SpecError
from lnk_shared.hosts import LISTED_ONLY_PORTS, MAX_PORT, HostPattern, parse_host_pattern
from lnk_shared.limit_requests import limit_value

# typing.TYPE_CHECKING without importing typing (see spec_flags): only the annotation needs it.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from lnk_shared.spec_models import ModelRule
    from lnk_shared.spec_services import ServiceRule

__all__ = [
    "ANY",
    "MAIN_PROXY_PORT",
    "MAX_ENTRIES",
    "MAX_PATH_LENGTH",
    "FdGrant",
    "LanEntry",
    "Origin",
    "PathEntry",
    "Spec",
    "SpecBuilder",
]

ANY = "*"
MAIN_PROXY_PORT = 40781  # the main proxy's port: a sandbox holding it could impersonate the box
MAX_ENTRIES = 256  # per key: far above any real spec, low enough to keep judging cheap
# A SQLAlchemy dialect's name ("sqlite", "postgresql"): the backend part of a database URL.
STORE_DRIVER = re.compile(r"[a-z][a-z0-9_]{0,31}")
MAX_PATH_LENGTH = 4096  # PATH_MAX on Linux


@dataclass(frozen=True)
class Origin:
    """Where an entry came from, for error messages: a file and line, or a flag."""

    source: str
    key: str
    line: int | None = None

    def error(self, problem: str) -> SpecError:
        return SpecError(problem, source=self.source, line=self.line, key=self.key)


@dataclass(frozen=True, order=True)
class PathEntry:
    """A path as written, with the folder a relative path is read against."""

    written: str
    base: str


@dataclass(frozen=True, order=True)
class FdGrant:
    """`--with-fd FD:write|read`: a folder the caller passes open on a descriptor."""

    fd: int
    write: bool


@dataclass(frozen=True, order=True)
class LanEntry:
    """A `[lan] hosts` entry: a name pattern, one address, or a range (exactly one is set)."""

    name: HostPattern | None = None
    network: ipaddress.IPv4Network | ipaddress.IPv6Network | None = None

    def __str__(self) -> str:
        if self.name is not None:
            return str(self.name)
        assert self.network is not None
        if self.network.num_addresses == 1:
            return str(self.network.network_address)
        return str(self.network)


@dataclass(frozen=True)
class Spec:
    """One validated spec. Empty means closed: an empty tuple grants nothing."""

    source: str | None = None
    read: tuple[PathEntry, ...] = ()
    write: tuple[PathEntry, ...] = ()
    internet_any: bool = False
    internet: tuple[HostPattern, ...] = ()
    network_host: bool = False
    lan_any: bool = False
    lan: tuple[LanEntry, ...] = ()
    browser: tuple[HostPattern, ...] = ()
    ports: tuple[int, ...] = ()
    commands_any: bool = False
    commands: tuple[PathEntry, ...] = ()
    commands_given: bool = False
    with_fds: tuple[FdGrant, ...] = ()
    store_driver: str | None = None  # [store] driver: an agent's store, kept by the box's bridge
    # [limits]: (key, value), sorted; less than the box allows, not a grant (limit_requests.py)
    limits: tuple[tuple[str, int], ...] = ()
    # [[services]]: a service reached through the proxy with a secret added outside
    services: tuple[ServiceRule, ...] = ()
    # [[models]]: a model runtime or provider reached through the proxy, its inference only
    models: tuple[ModelRule, ...] = ()
    # [env] and --env: (name, value), sorted by name. Not a grant (lnk_shared.env_names refuses
    # every name that would change what a granted program runs), so not in the grants' hash;
    # the values may be keys: never in repr, so never in a log line or a traceback's locals.
    env: tuple[tuple[str, str], ...] = field(default=(), repr=False)

    @property
    def has_proxy(self) -> bool:
        """Whether the sandbox reaches anything through the filtering proxy."""
        return not self.network_host and bool(
            self.internet_any
            or self.internet
            or self.lan_any
            or self.lan
            or self.ports
            or self.services
            or self.models
        )


def _check_path_text(text: object, origin: Origin) -> str:
    if not isinstance(text, str):
        raise origin.error(f"expected a path as a string, got {type(text).__name__}")
    if not text:
        raise origin.error("an empty path")
    if "\x00" in text or any(ord(c) < 0x20 or ord(c) == 0x7F for c in text):
        raise origin.error(f"a path with a control character or NUL: {text!r}")
    if len(text) > MAX_PATH_LENGTH:
        raise origin.error(f"a path longer than {MAX_PATH_LENGTH} characters")
    if text.startswith("~") and not (text == "~" or text.startswith("~/")):
        raise origin.error(f"{text!r}: only '~' and '~/...' are expanded, not another user's ~")
    return text


def _listed_only(pattern: HostPattern) -> bool:
    """An entry naming a port that `*` does not open (`hosts.LISTED_ONLY_PORTS`)."""
    return pattern.port in LISTED_ONLY_PORTS


def _unique(items: Iterable[object]) -> list[object]:
    seen: dict[object, None] = {}
    for item in items:
        seen.setdefault(item, None)
    return list(seen)


@dataclass
class SpecBuilder:
    """Collects entries from a file and flags, checking each as it comes; `build()` freezes."""

    source: str | None = None
    _read: list[PathEntry] = field(default_factory=list)
    _write: list[PathEntry] = field(default_factory=list)
    _internet: list[HostPattern] = field(default_factory=list)
    _internet_any: bool = False
    _network_host: bool = False
    _lan: list[LanEntry] = field(default_factory=list)
    _lan_any: bool = False
    _browser: list[HostPattern] = field(default_factory=list)
    _ports: list[int] = field(default_factory=list)
    _commands: list[PathEntry] = field(default_factory=list)
    _commands_any: bool = False
    _commands_given: bool = False
    _fds: list[FdGrant] = field(default_factory=list)
    _store_driver: str | None = None
    _limits: dict[str, int] = field(default_factory=dict)
    _services: list[ServiceRule] = field(default_factory=list)
    _models: list[ModelRule] = field(default_factory=list)
    _env: dict[str, str] = field(default_factory=dict, repr=False)
    _counts: dict[str, int] = field(default_factory=dict)
    # controller.toml's unsafe_env_names_unjudged (a test switch, logged at each launch): the
    # env_names table is not applied, so `lnk sandbox check` can be seen to report it.
    unsafe_env_unjudged: bool = False

    def _count(self, origin: Origin) -> None:
        n = self._counts.get(origin.key, 0) + 1
        if n > MAX_ENTRIES:
            raise origin.error(f"more than {MAX_ENTRIES} entries")
        self._counts[origin.key] = n

    def add_read(self, text: object, base: str, origin: Origin) -> None:
        self._count(origin)
        self._read.append(PathEntry(_check_path_text(text, origin), base))

    def add_write(self, text: object, base: str, origin: Origin) -> None:
        self._count(origin)
        self._write.append(PathEntry(_check_path_text(text, origin), base))

    def add_internet(self, text: object, origin: Origin) -> None:
        self._count(origin)
        if text == ANY:
            self._internet_any = True
            return
        self._internet.append(self._host(text, origin, allow_port=True, kind="internet"))

    def set_network_mode(self, value: object, origin: Origin) -> None:
        if value != "host":
            raise origin.error(f'expected "host" (the only mode), got {value!r}')
        self._network_host = True

    def add_lan(self, text: object, origin: Origin) -> None:
        self._count(origin)
        if text == ANY:
            self._lan_any = True
            return
        if not isinstance(text, str):
            raise origin.error(f"expected a name, address or range, got {type(text).__name__}")
        self._lan.append(_lan_entry(text, origin))

    def add_browser(self, text: object, origin: Origin) -> None:
        self._count(origin)
        if text == ANY:
            raise origin.error("'*' is not allowed for [browser]: each page's host is listed")
        self._browser.append(self._host(text, origin, allow_port=False, kind="browser"))

    def add_port(self, value: object, origin: Origin) -> None:
        self._count(origin)
        if value == ANY:
            raise PortRefused(
                f'{origin.key} = "*"',
                "every port of this machine would include other sandboxes' proxies",
            )
        if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 5:
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise origin.error(f"expected a port number from 1 to {MAX_PORT}, got {value!r}")
        if not 1 <= value <= MAX_PORT:
            raise origin.error(f"expected a port number from 1 to {MAX_PORT}, got {value}")
        if value == MAIN_PROXY_PORT:
            raise PortRefused(f"{origin.key} = {value}", "it is the box's main proxy's port")
        self._ports.append(value)

    def add_command(self, text: object, base: str, origin: Origin) -> None:
        self._count(origin)
        self._commands_given = True
        if text == ANY:
            self._commands_any = True
            return
        self._commands.append(PathEntry(_check_path_text(text, origin), base))

    def declare_commands(self) -> None:
        """A `[commands]` section is present, even with an empty list."""
        self._commands_given = True

    def add_fd(self, text: object, origin: Origin) -> None:
        self._count(origin)
        fd_text, sep, mode = str(text).partition(":")
        digits = fd_text.isascii() and fd_text.isdigit() and len(fd_text) <= 7
        if not sep or mode not in ("read", "write") or not digits:
            raise origin.error(f"expected FD:read or FD:write, got {text!r}")
        fd = int(fd_text)
        if fd < 3 or fd > 1 << 20:
            raise origin.error(f"the descriptor {fd} is not a passed folder (3 or above)")
        self._fds.append(FdGrant(fd, mode == "write"))

    def add_service(self, rule: ServiceRule, origin: Origin) -> None:
        """A `[[services]]` entry or `--service` flag, checked by `lnk_shared.spec_services`."""
        self._count(origin)
        if any(s.kind == rule.kind and s.host == rule.host for s in self._services):
            raise origin.error(
                f"a second {rule.kind} rule for {rule.host}: one rule per service host (put "
                "every call it may make in its allow)"
            )
        self._services.append(rule)

    def add_model(self, rule: ModelRule, origin: Origin) -> None:
        """A `[[models]]` entry or `--model` flag, checked by `lnk_shared.spec_models`; its port
        inside the sandbox and its base-URL variable are its own (`build` checks the ports
        against `[localhost]`)."""
        self._count(origin)
        for other in self._models:
            if other.port == rule.port:
                raise origin.error(
                    f"port: a second model rule on port {rule.port} inside the sandbox (the "
                    f"{other.kind} rule has it): give one another `port`"
                )
            if other.env == rule.env:
                raise origin.error(
                    f"env: a second model rule setting {rule.env} (the {other.kind} rule sets "
                    f"it): give one another `env`"
                )
        self._models.append(rule)

    def add_env(self, name: object, value: object, origin: Origin) -> None:
        """An `[env]` entry or `--env NAME=VALUE`; a later one of a name replaces it (a flag
        after the file's). Errors name the variable, never its value (it may be a key)."""
        why = refusal_reason(name) if isinstance(name, str) else None
        if why is not None and not self.unsafe_env_unjudged:
            raise EnvRefused(f"--env {name}" if origin.key == "--env" else f"[env] {name}", why)
        if not isinstance(name, str) or (problem := env_name_problem(name)) is not None:
            what = problem if isinstance(name, str) else "a name that is not text"
            raise origin.error(f"{what}: expected a variable's name")
        if not isinstance(value, str):
            raise origin.error(f"{name}: expected its value as a string (quote it)")
        if (problem := env_value_problem(value)) is not None:
            raise origin.error(f"{name}: {problem}")
        if name not in self._env and len(self._env) >= MAX_ENV_ENTRIES:
            raise origin.error(f"more than {MAX_ENV_ENTRIES} variables")
        self._env[name] = value
        try:
            check_env_entries(self._env)
        except ValueError as exc:
            raise origin.error(str(exc)) from None

    def set_limit(self, key: str, value: object, origin: Origin) -> None:
        """A `[limits]` key or a limit flag; a flag after the file's key replaces it."""
        try:
            self._limits[key] = limit_value(key, value)
        except ValueError as exc:
            raise origin.error(str(exc)) from None

    def set_store_driver(self, value: object, origin: Origin) -> None:
        # A driver's name only: the database itself (its URL, file, credentials) is the box's,
        # in bridge-store.toml. A URL here would let whoever writes a spec point the store
        # bridge, which runs outside with its own identity, at any database or file it reaches.
        if isinstance(value, str) and "://" in value:
            raise origin.error(
                f'{value!r} is a URL: name the driver only (e.g. "sqlite"); the database '
                "is the box's (database_url in bridge-store.toml)"
            )
        if not isinstance(value, str) or not STORE_DRIVER.fullmatch(value):
            raise origin.error(f'expected a driver name such as "sqlite", got {value!r}')
        if self._store_driver is not None and self._store_driver != value:
            raise origin.error(
                f"a second store driver {value!r} (the first: {self._store_driver!r})"
            )
        self._store_driver = value

    def _host(self, text: object, origin: Origin, *, allow_port: bool, kind: str) -> HostPattern:
        if not isinstance(text, str):
            raise origin.error(f"expected a host name, got {type(text).__name__}")
        try:
            return parse_host_pattern(text, allow_port=allow_port)
        except ValueError as exc:
            hint = " ([lan] lists private addresses)" if kind == "internet" else ""
            raise origin.error(f"{text!r}: {exc}{hint}") from None

    def build(self) -> Spec:
        return Spec(
            source=self.source,
            read=tuple(sorted(set(self._read))),
            write=tuple(sorted(set(self._write))),
            internet_any=self._internet_any,
            # key=str: a pattern's port may be None, which does not compare with a number
            # with `*`, only the entries `*` does not cover: a port it never opens (`host:22`)
            internet=tuple(
                sorted(
                    {p for p in self._internet if not self._internet_any or _listed_only(p)},
                    key=str,
                )
            ),
            network_host=self._network_host,
            lan_any=self._lan_any,
            lan=() if self._lan_any else tuple(sorted(set(self._lan), key=str)),
            browser=tuple(sorted(set(self._browser), key=str)),
            ports=tuple(sorted(set(self._ports))),
            commands_any=self._commands_any,
            commands=() if self._commands_any else tuple(sorted(set(self._commands))),
            commands_given=self._commands_given,
            with_fds=tuple(sorted(set(self._fds))),
            store_driver=self._store_driver,
            limits=tuple(sorted(self._limits.items())),
            services=tuple(sorted(self._services)),
            models=self._checked_models(),
            env=tuple(sorted(self._env.items())),
        )

    def _checked_models(self) -> tuple[ModelRule, ...]:
        """The model rules, each port inside the sandbox not also a `[localhost]` port (one
        port serves one thing there: choose the model's `port`, or drop the grant)."""
        if self._models and self._network_host:
            raise SpecError(
                '[[models]] is served by the proxy, and [network] mode = "host" has none (its '
                "program reaches this machine's ports, every runtime's whole API): drop one",
                source=self.source,
                key="[[models]]",
            )
        for rule in self._models:
            if rule.port in self._ports:
                raise SpecError(
                    f"the {rule.kind} model rule and [localhost] both take port {rule.port} "
                    "inside the sandbox: set the model rule's `port` to another (a [localhost] "
                    "grant of the runtime's port opens its whole API, pull and delete included)",
                    source=self.source,
                    key="[[models]] port",
                )
        return tuple(sorted(self._models))


def _lan_entry(text: str, origin: Origin) -> LanEntry:
    if "/" in text:
        try:
            network = ipaddress.ip_network(text, strict=True)
        except ValueError as exc:
            raise origin.error(f"{text!r} is not a range: {exc}") from None
        if network.num_addresses == 1:
            return _lan_address(network.network_address, text, origin)
        if not is_lan_network(network):
            raise origin.error(
                f"{text!r} is not inside a private range (10/8, 172.16/12, 192.168/16, "
                "fc00::/7); 100.64/10 only as single addresses"
            )
        return LanEntry(network=network)
    try:
        address = ipaddress.ip_address(text.strip("[]"))
    except ValueError:
        address = None
    if address is not None:
        return _lan_address(address, text, origin)
    try:
        return LanEntry(name=parse_host_pattern(text, allow_port=False))
    except ValueError as exc:
        raise origin.error(f"{text!r}: {exc}") from None


def _lan_address(
    address: ipaddress.IPv4Address | ipaddress.IPv6Address, text: str, origin: Origin
) -> LanEntry:
    if isinstance(address, ipaddress.IPv6Address) and address.scope_id:
        raise origin.error(f"{text!r}: a scoped (link-local) address is never reached")
    if address in METADATA_ADDRESSES or effective_address(address) in METADATA_ADDRESSES:
        raise origin.error(f"{text!r} is a cloud metadata address: it hands out credentials")
    if not (is_private_lan(address) or address in CGNAT_NETWORK):
        raise origin.error(
            f"{text!r} is not a private address (10/8, 172.16/12, 192.168/16, fc00::/7, "
            "or one address in 100.64/10)"
        )
    return LanEntry(network=ipaddress.ip_network(address))
