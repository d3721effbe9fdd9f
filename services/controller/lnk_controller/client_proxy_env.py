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

The box's values are set after the caller's environment and win over it (launch.py spreads
them last but the agent's own), except JAVA_TOOL_OPTIONS, merged as said.

What this does NOT do: make a client that reads none of these use the proxy (it fails closed),
or carry ssh (git over ssh needs a connector for ssh's ProxyCommand: not provided yet).
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["JAVA_NON_PROXY", "LOOPBACK_NAMES", "proxy_env"]

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


def proxy_env(port: int, caller: Mapping[str, str] | None = None) -> dict[str, str]:
    """What clients read to use the proxy served on 127.0.0.1:`port`, given the caller's
    environment as the sandbox would otherwise get it (`caller`)."""
    url = f"http://127.0.0.1:{port}"
    env = dict.fromkeys(PROXY_NAMES, url)
    loopback = ",".join(LOOPBACK_NAMES)
    env.update({"NO_PROXY": loopback, "no_proxy": loopback, "NODE_USE_ENV_PROXY": "1"})
    own = (caller or {}).get("JAVA_TOOL_OPTIONS", "").strip()
    env["JAVA_TOOL_OPTIONS"] = f"{own} {_java_options(port)}".strip()
    return env
