"""The environment that points common clients inside a sandbox at its proxy: a pure function.

A sandbox with a proxy has no route out: its relay serves the proxy on 127.0.0.1 and nothing
else is there. A client that ignores the variables below does not get out around the proxy; it
fails to connect (no route, no DNS). So these variables are about reaching what the spec
grants, never about closing anything:

- `HTTP_PROXY`, `HTTPS_PROXY`, `ALL_PROXY` (and lower case), `GRPC_PROXY`: curl, pip, git over
  https, Python's urllib and requests, Go, gRPC.
- `NODE_USE_ENV_PROXY=1`: Node >= 22.21 and >= 24.5 make their built-in `fetch` and `http(s)`
  use HTTP(S)_PROXY and NO_PROXY. Older Node (20 here) ignores it: its `fetch` connects
  directly, finds no route and fails (`fetch failed`); such a program needs undici's
  `EnvHttpProxyAgent` (`setGlobalDispatcher`) or a newer Node.
- `JAVA_TOOL_OPTIONS`: Java reads no proxy variable; `-Dhttp(s).proxyHost/-Port` point
  `HttpURLConnection` and `java.net.http.HttpClient` at the relay, `http.nonProxyHosts` keeps
  the sandbox's loopback direct. Its cost: every JVM prints `Picked up JAVA_TOOL_OPTIONS: ...`
  on stderr when it reads the variable (a tool that parses a JVM's stderr sees that line). A
  caller's own JAVA_TOOL_OPTIONS is kept, the box's options after it (the last -D wins).
- `NO_PROXY`/`no_proxy`: the sandbox's own loopback (`localhost`, `127.0.0.1`, `::1`), where
  its `[localhost]` ports, its services' relays and an agent's bridge (`127.0.0.1:3129`) are
  served: sent through the proxy they would be refused (this machine is never reached through
  it), so clients must dial them directly, inside the sandbox's own network namespace.

- `GIT_SSH_COMMAND`: git over ssh (`git clone ssh://host/repo`, `git@host:repo`). ssh reads
  no proxy variable; its `ProxyCommand` is the box's connector, `lnk-connect %h %p`
  (lnk_inside/native/lnk_connect.c: one CONNECT to the relay HTTP_PROXY names, then bytes both
  ways), so the proxy judges the host and port 22 (reached only where `[internet]` lists `host:22`)
  and logs the tunnel. Why git's variable and not an ssh config file: nothing is written to the
  sandbox's home or an agent's folder (where a user's own config lives), it cannot be left
  behind, and a plain `ssh` the user runs keeps the user's own choices (it fails closed: no
  route). A user's own GIT_SSH_COMMAND is refused (env_names: the box's own), not merged: a
  shell command cannot be merged safely. Host keys: `StrictHostKeyChecking=yes`, never a prompt
  nor trust on first use (the private home is new at every run, so accept-new would accept
  every key); known_hosts is read from the sandbox's `~/.ssh` and the owner's
  `~/.ssh/known_hosts`, which a read grant (`--read ~/.ssh/known_hosts`) puts inside at its own
  path; the owner's default keys likewise (`--read ~/.ssh/id_ed25519`), only where granted.
  ssh runs its ProxyCommand with $SHELL (`/bin/bash`) and git runs this with `/bin/sh`: under
  a finite `[commands]` list, git over ssh needs git, ssh, sh and bash granted.

The box's values are set after the caller's environment and win over it (sandbox_plan.py
spreads them last but the agent's own), except JAVA_TOOL_OPTIONS, merged as said.

What this does NOT do: make a client that reads none of these use the proxy (it fails closed),
check a host key (ssh does), or give ssh a key or known_hosts the spec does not grant.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping

__all__ = ["JAVA_NON_PROXY", "LOOPBACK_NAMES", "git_ssh_command", "proxy_env"]

PROXY_NAMES = (
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "http_proxy",
    "https_proxy",
    "ALL_PROXY",
    "all_proxy",
    "GRPC_PROXY",
    "grpc_proxy",
)
# The sandbox's own loopback: where its relays serve what it may reach directly.
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
JAVA_NON_PROXY = "localhost|127.*|[::1]"  # the same, as Java's http.nonProxyHosts reads it
# The owner's keys ssh tries when granted (ssh's own default names, newest first).
OWNER_KEYS = ("id_ed25519", "id_ecdsa", "id_rsa")
# A home ssh's option values can carry unquoted (ssh splits UserKnownHostsFile on spaces).
_PLAIN_PATH = re.compile(r"/[A-Za-z0-9._/-]*")


def _java_options(port: int) -> str:
    return " ".join(
        f"-D{option}"
        for option in (
            "http.proxyHost=127.0.0.1",
            f"http.proxyPort={port}",
            "https.proxyHost=127.0.0.1",
            f"https.proxyPort={port}",
            f"http.nonProxyHosts={JAVA_NON_PROXY}",
        )
    )


def git_ssh_command(connector: str, owner_home: str | None) -> str:
    """GIT_SSH_COMMAND: ssh through `connector` (the box's lnk-connect), strict host keys, the
    owner's known_hosts and default keys where granted. `owner_home` is left out when ssh could
    not read it unquoted (a space in it; none: the connector alone)."""
    options = [f"ProxyCommand={shlex.quote(connector)} %h %p", "StrictHostKeyChecking=yes"]
    known = ["~/.ssh/known_hosts"]
    if owner_home is not None and _PLAIN_PATH.fullmatch(owner_home):
        ssh_dir = f"{owner_home.rstrip('/')}/.ssh"
        known.append(f"{ssh_dir}/known_hosts")
        options += [f"IdentityFile={ssh_dir}/{key}" for key in OWNER_KEYS]
    options.insert(2, f"UserKnownHostsFile={' '.join(known)}")
    return " ".join(["ssh", *(f"-o {shlex.quote(option)}" for option in options)])


def proxy_env(
    port: int,
    caller: Mapping[str, str] | None = None,
    *,
    connector: str | None = None,
    owner_home: str | None = None,
) -> dict[str, str]:
    """What clients read to use the proxy served on 127.0.0.1:`port`, given the caller's
    environment as the sandbox would otherwise get it (`caller`); with the box's `connector`,
    git over ssh too (`owner_home`: where the owner's granted ~/.ssh files are inside)."""
    url = f"http://127.0.0.1:{port}"
    env = dict.fromkeys(PROXY_NAMES, url)
    loopback = ",".join(LOOPBACK_NAMES)
    env.update({"NO_PROXY": loopback, "no_proxy": loopback, "NODE_USE_ENV_PROXY": "1"})
    own = (caller or {}).get("JAVA_TOOL_OPTIONS", "").strip()
    env["JAVA_TOOL_OPTIONS"] = f"{own} {_java_options(port)}".strip()
    if connector is not None:
        env["GIT_SSH_COMMAND"] = git_ssh_command(connector, owner_home)
    return env
