"""The proxy's environment for common clients, with the real clients of this machine (Java 17,
Node 20) inside a real sandbox, against the test internet (`net.py`): Java reaches a listed
host over http and https through the proxy (it reads no proxy variable: JAVA_TOOL_OPTIONS
points it there), and its cost, the line each JVM prints, is seen; Node 20's built-in fetch
ignores NODE_USE_ENV_PROXY (Node >= 22.21 and 24.5 read it) and fails closed: no route, and
nothing reached the host around the proxy. NO_PROXY names the sandbox's own loopback."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from as_user import as_user
from conftest import LNK, _private_box
from internet_box import proxy_config
from net import WWW

pytestmark = [pytest.mark.needs_root, pytest.mark.e2e]

JAVA = shutil.which("java")
NODE = shutil.which("node")

FETCH_JAVA = """
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;

public class Fetch {
    public static void main(String[] args) throws Exception {
        HttpClient client = HttpClient.newHttpClient();
        for (String url : args) {
            try {
                HttpRequest request = HttpRequest.newBuilder(URI.create(url)).build();
                HttpResponse<String> answer =
                    client.send(request, HttpResponse.BodyHandlers.ofString());
                System.out.println(url + " " + answer.statusCode() + " " + answer.body().trim());
            } catch (Exception e) {
                System.out.println(url + " failed " + e.getClass().getSimpleName());
            }
        }
    }
}
"""

FETCH_NODE = """
console.log("NODE_USE_ENV_PROXY=" + process.env.NODE_USE_ENV_PROXY);
fetch(process.argv[1]).then(
  (r) => console.log("status " + r.status),
  (e) => console.log("failed " + ((e.cause && e.cause.code) || e.message)),
);
"""


@pytest.fixture(scope="module")
def netbox(running_box: Any, internet: Any) -> Iterator[Any]:
    with _private_box(proxy_config=proxy_config(internet)) as box:
        yield box


@pytest.fixture(scope="module")
def programs() -> Iterator[Path]:
    """A world-readable folder outside /tmp with the programs the sandbox runs."""
    folder = Path(tempfile.mkdtemp(prefix="lnk-clients-", dir="/srv"))
    folder.chmod(0o755)
    (folder / "Fetch.java").write_text(FETCH_JAVA)
    (folder / "fetch.js").write_text(FETCH_NODE)
    for f in folder.iterdir():
        f.chmod(0o644)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# A JVM that starts and compiles the one source file sooner (C1 only, one GC thread).
JAVA_QUICK = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Xshare:auto")
# Debian's JDK keeps its conf (java.security, ...) in /etc, which a sandbox's /etc lacks.
JAVA_CONF = [f"--read={p}" for p in sorted(Path("/etc").glob("java-*-openjdk"))]


def _run(
    running_box: Any, box: Any, folder: Path, *cmd: str, extra: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    owner = running_box.owner
    env = {
        **running_box.owner_env(),
        **{k: v for k, v in box.env.items() if k.startswith("LNK_")},
    }
    flags = ["--yes", f"--read={folder}", f"--internet-host={WWW}", "--command=*", *extra]
    return subprocess.run(
        as_user(owner.uid, owner.gid, str(LNK), "sandbox", "run", *flags, "--", *cmd),
        env=env,
        cwd=str(folder),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.skipif(JAVA is None, reason="no java on this machine")
def test_java_reaches_a_listed_host_through_the_proxy(
    running_box: Any, netbox: Any, internet: Any, programs: Path
) -> None:
    before = internet.accepted(internet.www)
    run = _run(
        running_box,
        netbox,
        programs,
        str(JAVA),
        *JAVA_QUICK,
        str(programs / "Fetch.java"),
        f"http://{WWW}/",
        f"https://{WWW}/",
        extra=tuple(JAVA_CONF),
    )
    assert run.returncode == 0, run.stdout + run.stderr
    http, https = run.stdout.splitlines()
    assert http.startswith(f"http://{WWW}/ 200 ") and WWW in http, http
    # The test CA is not in Java's trust store: the TLS check fails, after the tunnel the
    # proxy opened reached the host (the host counts its connection).
    assert https == f"https://{WWW}/ failed SSLHandshakeException", https
    assert internet.accepted(internet.www) == before + 2
    assert "Picked up JAVA_TOOL_OPTIONS: " in run.stderr  # the documented cost
    assert "-Dhttp.nonProxyHosts=localhost|127.*|[::1]" in run.stderr


@pytest.mark.skipif(NODE is None, reason="no node on this machine")
def test_node_20_fetch_ignores_the_proxy_and_fails_closed(
    running_box: Any, netbox: Any, internet: Any, programs: Path
) -> None:
    before = internet.accepted(internet.www)
    script = (
        f'echo "NO_PROXY=$NO_PROXY no_proxy=$no_proxy"; {NODE} --version; '
        f"{NODE} {programs / 'fetch.js'} http://{WWW}/"
    )
    run = _run(running_box, netbox, programs, "/bin/sh", "-c", script)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert lines[0] == "NO_PROXY=localhost,127.0.0.1,::1 no_proxy=localhost,127.0.0.1,::1"
    version = tuple(int(p) for p in lines[1].lstrip("v").split(".")[:2])
    assert lines[2] == "NODE_USE_ENV_PROXY=1"
    if version >= (22, 21):  # a Node that reads it goes through the proxy
        assert lines[3] == "status 200", lines
        assert internet.accepted(internet.www) == before + 1
    else:  # Node 20 here: no route, no DNS inside; nothing reached around the proxy
        assert lines[3].startswith("failed "), lines
        assert internet.accepted(internet.www) == before
