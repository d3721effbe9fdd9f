"""The peers a user would pick instead of lnk_proxy, for bench/proxy.py, each started as the
other proxies are (nobody, a private mount namespace whose /etc names the test hosts) on a
loopback port, with an allowlist equivalent to lnk_proxy's grant (`www` only):

- proxy.py (PyPI `proxy.py`), installed at bench time into the bench's own virtual
  environment under PEERS_DIR (never the box's), run with its defaults (a worker process per
  CPU, threadless) at log level warning, the allowlist a 10-line plugin (`ALLOW_PLUGIN`: its
  `before_upstream_connection` hook refuses every other host with a 403);
- Anthropic's sandbox-runtime (npm `@anthropic-ai/sandbox-runtime`), installed at bench time
  with npm under PEERS_DIR, of which only the HTTP proxy is started (`SRT_STARTER`): its own
  `createHttpProxyServer`, with the filter and the resolved-address guard its sandbox manager
  gives it (`filterNetworkRequest`'s allowed-domains match on the canonical host, and
  `createResolvedAddressGuard().lookupFor`), without the sandbox around the client.

A peer that cannot be had (no Node or npm, no registry) is skipped with the reason printed;
each start returns either a `Peer` or that reason.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from proxy_procs import NOBODY, WWW, free_port, listening, start_confined, wait_until

PEERS_DIR = Path("/var/tmp/lnk-bench-peers")  # kept between runs: installs take a minute
INSTALL_TIMEOUT_S = 600.0
PROXYPY = "proxy.py"
SRT = "@anthropic-ai/sandbox-runtime"
NODE = "/usr/bin/node"
SYSTEM_PYTHON = "/usr/bin/python3"  # one nobody can run (as scripts/install uses)

ALLOW_PLUGIN = """
from proxy.common.utils import text_
from proxy.http.exception import HttpRequestRejected
from proxy.http.proxy import HttpProxyBasePlugin

ALLOWED = {%r}


class AllowOnly(HttpProxyBasePlugin):
    def before_upstream_connection(self, request):
        if text_(request.host).lower().rstrip(".") not in ALLOWED:
            raise HttpRequestRejected(status_code=403, reason=b"Forbidden")
        return request
"""

SRT_STARTER = """
const dist = process.argv[2];
const port = Number(process.argv[3]);
const allowed = process.argv[4];
const { createHttpProxyServer } = await import(dist + "/sandbox/http-proxy.js");
const { createResolvedAddressGuard } = await import(dist + "/sandbox/resolved-address-guard.js");
const { matchesDomainPatternWithPort } = await import(dist + "/sandbox/domain-pattern.js");
const { canonicalizeHost } = await import(dist + "/sandbox/parent-proxy.js");
const guard = createResolvedAddressGuard({ allowedDomains: [allowed] });
const server = createHttpProxyServer({
  filter: async (p, host) =>
    matchesDomainPatternWithPort(canonicalizeHost(host) ?? host, p, allowed),
  lookupFor: (p) => guard.lookupFor(p),
});
server.listen(port, "127.0.0.1", () => console.log("ready"));
"""


@dataclass(frozen=True)
class Peer:
    name: str
    version: str
    pid: int
    port: int


def _run(argv: list[str], what: str) -> str | None:
    """None when `argv` succeeded, else why (its last lines of output)."""
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=INSTALL_TIMEOUT_S,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{what} failed: {exc}"
    if done.returncode != 0:
        tail = " ".join((done.stderr or done.stdout).strip().splitlines()[-2:])
        return f"{what} failed (exit {done.returncode}): {tail[:300]}"
    return None


def _readable(folder: Path) -> None:
    """The peers run as nobody: their installs must be world-readable, written by root only."""
    for parent in reversed(folder.parents):
        if parent == PEERS_DIR or PEERS_DIR in parent.parents:
            parent.chmod(0o755)
    subprocess.run(["chmod", "-R", "go-w,go+rX", str(folder)], check=True)


def install_proxypy() -> tuple[Path, str] | str:
    """proxy.py's virtual environment (made when missing) and its version, or why not."""
    venv = PEERS_DIR / "proxypy"
    python = venv / "bin" / "python"
    if not (venv / "bin" / "proxy").exists():
        PEERS_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
        why = _run([SYSTEM_PYTHON, "-m", "venv", str(venv)], "making a venv")
        why = why or _run([str(python), "-m", "pip", "install", "-q", PROXYPY], "pip install")
        if why is not None:
            return why
    _readable(venv)
    probe = [str(python), "-c", "import importlib.metadata as m; print(m.version('proxy.py'))"]
    version = subprocess.run(probe, capture_output=True, text=True, check=False).stdout.strip()
    return venv, version or "?"


def start_proxypy(stack: ExitStack, base: Path, binds: list[tuple[str, str]]) -> Peer | str:
    installed = install_proxypy()
    if isinstance(installed, str):
        return installed
    venv, version = installed
    folder = base / "proxypy"
    folder.mkdir(mode=0o755)
    os.chown(folder, NOBODY, NOBODY)  # its HOME: proxy.py writes ~/.proxy
    (folder / "lnk_bench_allow.py").write_text(ALLOW_PLUGIN % WWW)
    port = free_port()
    argv = [
        str(venv / "bin" / "proxy"),
        *("--hostname", "127.0.0.1", "--port", str(port), "--log-level", "WARNING"),
        *("--plugins", "lnk_bench_allow.AllowOnly"),
    ]
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(folder), "HOME": str(folder)}
    process = start_confined(stack, argv, env, binds, base / "proxypy.out")
    wait_until(lambda: listening(port), process, "proxy.py")
    return Peer("proxy.py", version, process.pid, port)


def install_srt() -> tuple[Path, str] | str:
    """sandbox-runtime's dist folder (npm-installed when missing) and its version, or why."""
    if not Path(NODE).exists():
        return f"no Node at {NODE} (apt-get install nodejs npm)"
    npm = shutil.which("npm")
    if npm is None:
        return "no npm on PATH (apt-get install npm)"
    folder = PEERS_DIR / "srt"
    package = folder / "node_modules" / SRT
    if not (package / "dist" / "sandbox" / "http-proxy.js").exists():
        folder.mkdir(mode=0o755, parents=True, exist_ok=True)
        argv = [npm, "install", "--prefix", str(folder), "--no-audit", "--no-fund", SRT]
        why = _run(argv, "npm install")
        if why is not None:
            return why
    _readable(folder)
    manifest = (package / "package.json").read_text()
    version = manifest.split('"version"', 1)[1].split('"')[1] if '"version"' in manifest else "?"
    return package / "dist", version


def start_srt(stack: ExitStack, base: Path, binds: list[tuple[str, str]]) -> Peer | str:
    installed = install_srt()
    if isinstance(installed, str):
        return installed
    dist, version = installed
    folder = base / "srt"
    folder.mkdir(mode=0o755)
    os.chown(folder, NOBODY, NOBODY)  # its HOME
    (folder / "start.mjs").write_text(SRT_STARTER)
    port = free_port()
    argv = [NODE, str(folder / "start.mjs"), f"file://{dist}", str(port), WWW]
    env = {"PATH": "/usr/bin:/bin", "HOME": str(folder), "NODE_ENV": "production"}
    process = start_confined(stack, argv, env, binds, base / "srt.out")
    wait_until(lambda: listening(port), process, "sandbox-runtime's proxy")
    return Peer("srt proxy", version, process.pid, port)


def start_peers(stack: ExitStack, base: Path, binds: list[tuple[str, str]]) -> list[Peer]:
    """Every peer that can be had; a line for each that cannot."""
    peers: list[Peer] = []
    for name, start in (("proxy.py", start_proxypy), ("sandbox-runtime", start_srt)):
        started = start(stack, base, binds)
        if isinstance(started, str):
            print(f"  {name}: skipped: {started}", flush=True)
        else:
            peers.append(started)
    return peers


__all__ = ["PEERS_DIR", "Peer", "start_peers"]
