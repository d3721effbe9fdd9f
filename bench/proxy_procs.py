"""Processes of bench/proxy.py: the proxies under test, each as nobody in a private mount
namespace whose /etc names the test hosts; the in-sandbox relay; the sendfile source; and the
CPU and memory each used. Starting only: nothing here measures."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import select
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHECKOUT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(CHECKOUT / "tests" / "e2e"), str(CHECKOUT / "shared")]
import relay_netns  # noqa: E402
from net import OTHER, WWW, TestInternet  # noqa: E402

from lnk_shared.unix import recv_frame, send_frame  # noqa: E402

SOURCES = ("shared", "services/proxy")
NATIVE_BUILD = CHECKOUT / "shared" / "lnk_shared" / "native_build.py"
NOBODY = 65534  # uid and gid (nogroup): the proxies' user, as in the e2e tests
SANDBOX = "bench"
SECRET = "bench-secret-" + "0" * 32
SOURCE_PORT = 9000  # the sendfile source, on www's address inside its namespace
SOURCE_CHUNK = 8 * 1024 * 1024  # zeros in a memfd, sent again and again with sendfile
TUNNEL_BYTES = 1 << 30
IDLE_TUNNELS = 500
IO_TIMEOUT_S = 10.0
START_TIMEOUT_S = 15.0
TICKS = os.sysconf("SC_CLK_TCK")
ONLY_WWW = {"internet_any": False, "internet": [WWW], "lan_any": False, "lan": []}

UNSHARE = ["unshare", "--mount", "--propagation", "private", "--"]
# Runs as root inside `unshare --mount`: bind the files, drop to nobody, exec the proxy.
CONFINE = """
import json, os, subprocess, sys
spec = json.loads(sys.argv[1])
for source, target in spec["binds"]:
    subprocess.run(["mount", "--bind", source, target], check=True)
os.setgroups([])
os.setgid(spec["id"])
os.setuid(spec["id"])
os.execve(spec["argv"][0], spec["argv"], spec["env"])
"""

# Runs in the test internet's namespace: per connection, read a byte count, send that many.
SOURCE = """
import ctypes, os, signal, socket, sys, threading
ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: dies with the bench
address, port, chunk, limit = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
zeros = os.memfd_create("zeros")
os.write(zeros, bytes(chunk))
server = socket.create_server((address, port), backlog=64)
print("ready", flush=True)
def serve(conn):
    with conn:
        line = b""
        while not line.endswith(b"\\n") and len(line) < 32:
            part = conn.recv(32)
            if not part:
                return
            line += part
        left = min(int(line), limit)
        while left > 0:
            sent = os.sendfile(conn.fileno(), zeros, 0, min(left, chunk))
            if sent == 0:
                return
            left -= sent
while True:
    conn, _ = server.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
"""


# -- processes -------------------------------------------------------------------------------


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


def start_confined(
    stack: ExitStack, argv: list[str], env: dict[str, str], binds: list[tuple[str, str]], out: Path
) -> subprocess.Popen[bytes]:
    """argv as nobody in a private mount namespace with `binds`; the pid is argv's own."""
    spec = json.dumps({"binds": binds, "id": NOBODY, "argv": argv, "env": env})
    with out.open("wb") as log:
        process = subprocess.Popen(
            [*UNSHARE, sys.executable, "-I", "-c", CONFINE, spec],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            cwd="/",
        )
    stack.callback(stop, process)
    return process


def wait_until(ready: Callable[[], bool], process: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not ready():
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start")
        time.sleep(0.05)


def start_source(stack: ExitStack, net: TestInternet) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-I", "-c", SOURCE, net.www.address, str(SOURCE_PORT)]
    process = subprocess.Popen(
        ["ip", "netns", "exec", net.public_netns, *argv, str(SOURCE_CHUNK), str(TUNNEL_BYTES)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
    )
    stack.callback(stop, process)
    assert process.stdout is not None
    if not select.select([process.stdout], [], [], START_TIMEOUT_S)[0]:
        raise RuntimeError("the sendfile source did not start")
    if process.stdout.readline() != b"ready\n":
        raise RuntimeError("the sendfile source failed")
    return process


def resolver_files(base: Path, net: TestInternet) -> list[tuple[str, str]]:
    """Files bound over /etc in the proxies' mount namespace: the test names, no DNS out."""
    hosts = "127.0.0.1 localhost\n" + "".join(f"{net.dns[n][0]} {n}\n" for n in (WWW, OTHER))
    nss = Path("/etc/nsswitch.conf").read_text().splitlines()
    lines = ["hosts: files" if line.startswith("hosts:") else line for line in nss]
    files = {
        "hosts": hosts,
        "resolv.conf": "nameserver 127.0.0.1\n",
        "nsswitch.conf": "\n".join(lines) + "\n",
    }
    binds = []
    for name, text in files.items():
        (base / name).write_text(text)
        (base / name).chmod(0o644)
        binds.append((str(base / name), f"/etc/{name}"))
    return binds


@dataclass
class Lnk:
    process: subprocess.Popen[bytes]
    admin_socket: Path
    listener: Path

    def admin(self, message: dict[str, Any]) -> dict[str, Any]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(IO_TIMEOUT_S)
            sock.connect(str(self.admin_socket))
            send_frame(sock, message)
            return recv_frame(sock)[0]


WIRE_LOG_BYTES = 8 << 30  # the bench's sandboxes' logs, in its temporary folder


def start_lnk(
    stack: ExitStack,
    base: Path,
    binds: list[tuple[str, str]],
    event_loop: str = "auto",
    profile: Path | None = None,
    sources: Path = CHECKOUT,
) -> Lnk:
    """lnk_proxy from `sources` (this checkout unless another tree, such as an earlier
    commit's `git archive`), on `event_loop` (`LNK_PROXY_EVENT_LOOP`), its files in `base`,
    serving SANDBOX with ONLY_WWW; under cProfile timed by its CPU (`PROFILED`), the stats
    written to `profile` when it stops, if given."""
    base.mkdir(mode=0o755, exist_ok=True)
    (base / "etc").mkdir()
    (base / "etc" / "proxy.toml").write_text(
        'unsafe_public_networks = ["198.18.0.0/15"]\ncontroller_uid = 0\n'
        f"connect_timeout_s = 3\nmax_tunnels_per_sandbox = {2 * IDLE_TUNNELS}\n"
        f"max_connections_per_sandbox = {4 * IDLE_TUNNELS}\n"
        # (c)'s idle tunnels reserve their worst case (`tunnel_buffers`): room for twice them
        f"tunnel_buffer_budget_bytes = {2 * IDLE_TUNNELS * (1 << 20)}\n"
        # a round of small GETs at c=64 logs ~100 MiB now: at the default 256 MiB a sandbox's
        # log is full by the third round and its exchanges are refused (`log-full`, by design)
        f"wire_log_max_bytes = {WIRE_LOG_BYTES}\nwire_box_max_bytes = {4 * WIRE_LOG_BYTES}\n"
    )
    for name in ("run", "state"):
        (base / name).mkdir(mode=0o755)
        os.chown(base / name, NOBODY, NOBODY)
    (base / "run" / "flags").mkdir(mode=0o755)
    env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "PYTHONPATH": os.pathsep.join(str(sources / s) for s in SOURCES),
        "LNK_CONFIG_DIR": str(base / "etc"),
        "LNK_RUN_DIR": str(base / "run"),
        "LNK_STATE_DIR": str(base / "state"),
        "LNK_PROXY_EVENT_LOOP": event_loop,
    }
    argv = [sys.executable, "-m", "lnk_proxy"]
    if profile is not None:
        (base / "profile").mkdir(mode=0o755)
        os.chown(base / "profile", NOBODY, NOBODY)
        argv = [sys.executable, "-c", PROFILED, str(base / "profile" / "lnk.pstats")]
        stack.callback(_copy_profile, base / "profile" / "lnk.pstats", profile)
    process = start_confined(stack, argv, env, binds, base / "lnk_proxy.out")
    lnk = Lnk(process, base / "run" / "proxy" / "admin.sock", base / "run" / "proxy" / "b.sock")
    wait_until(lnk.admin_socket.exists, process, "lnk_proxy")
    open_listener(lnk, SANDBOX, lnk.listener, ONLY_WWW)
    return lnk


# The proxy's main thread (its event loop) under cProfile, timed by its own CPU, not the wall
# clock: a loaded machine's preemptions do not count against the code that was preempted.
PROFILED = """
import cProfile, runpy, sys, time
profile = cProfile.Profile(time.thread_time)
profile.enable()
try:
    runpy.run_module("lnk_proxy", run_name="__main__")
except SystemExit:
    pass
finally:
    profile.disable()
    profile.dump_stats(sys.argv[1])
"""


def _copy_profile(source: Path, target: Path) -> None:
    if source.exists():
        shutil.copyfile(source, target)
        print(f"lnk_proxy's profile: {target} (python -m pstats {target})")
    else:
        print(f"lnk_proxy wrote no profile at {source}")


def open_listener(lnk: Lnk, sandbox: str, path: Path, grants: dict[str, Any]) -> None:
    command = {"op": "open", "sandbox": sandbox, "socket": str(path), "grants": grants}
    reply = lnk.admin({**command, "secret": SECRET})
    if reply != {"ok": True}:
        raise RuntimeError(f"lnk_proxy did not open the listener of {sandbox}: {reply}")


def start_tinyproxy(
    stack: ExitStack, base: Path, binds: list[tuple[str, str]]
) -> tuple[subprocess.Popen[bytes], int]:
    folder = base / "tinyproxy"
    folder.mkdir(mode=0o755)
    os.chown(folder, NOBODY, NOBODY)
    (folder / "filter").write_text("^" + WWW.replace(".", r"\.") + "$\n")
    port = free_port()
    (folder / "tinyproxy.conf").write_text(
        f"Port {port}\nListen 127.0.0.1\nTimeout 60\nMaxClients {4 * IDLE_TUNNELS}\n"
        f'LogFile "{folder}/tinyproxy.log"\nLogLevel Error\n'
        f'Filter "{folder}/filter"\nFilterExtended On\nFilterDefaultDeny Yes\n'
    )
    argv = [tinyproxy_binary(), "-d", "-c", str(folder / "tinyproxy.conf")]
    process = start_confined(stack, argv, {"PATH": "/usr/bin:/bin"}, binds, base / "tiny.out")

    wait_until(lambda: listening(port), process, "tinyproxy")
    return process, port


INSTALLED_CONFINER = Path(
    "/opt/lnk/venv/lib/python3.11/site-packages/lnk_controller/native/lnk-sandbox"
)


def confiner_binary(folder: Path, sources: Path | None = None) -> Path:
    """lnk-sandbox built from this checkout's C (what the bench measures, as it does the
    proxy's code) by lnk_shared/native_build.py, loaded by path as setup.py does; the installed
    one when there is no compiler. `sources`: another tree's (a `--baseline` with `sandbox/`
    and `pyproject.toml` in it), by that tree's own native_build.py."""
    script = NATIVE_BUILD if sources is None else sources / "shared/lnk_shared/native_build.py"
    name = "lnk_native_build" if sources is None else "lnk_native_build_baseline"
    spec = importlib.util.spec_from_file_location(name, script)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {NATIVE_BUILD}")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    try:
        return Path(build.build(folder / "lnk-sandbox"))
    except build.BuildError:
        if INSTALLED_CONFINER.exists():
            return INSTALLED_CONFINER
        raise


def start_relay(
    stack: ExitStack,
    listener: Path,
    folder: Path,
    sources: Path | None = None,
    *,
    handoff: bool | None = None,
) -> tuple[subprocess.Popen[bytes], int]:
    """The in-sandbox relay on a free loopback port, serving lnk_proxy's listener; built from
    `sources` (another tree) when given. `handoff` (the checkout's relay's default): it hands
    each connection to the proxy (`--relay-handoff`), in a network namespace of its own as a
    sandbox's (`relay_netns`); else it relays the bytes (`--relay`, every tree's)."""
    port = free_port()
    binary = confiner_binary(folder, sources)
    if handoff is None:
        handoff = sources is None
    if handoff:
        argv = relay_netns.handoff_argv(stack, binary, listener, port)
    else:
        argv = [str(binary), "--relay", str(listener), str(port)]
    process = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
    stack.callback(stop, process)
    wait_until(lambda: listening(port), process, "the relay")
    return process, port


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def listening(port: int) -> bool:
    with relay_netns.inside(relay_netns.NAMESPACES.get(port)):
        sock = socket.socket()
    with sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def tinyproxy_binary() -> str:
    found = shutil.which("tinyproxy")
    if found is None:  # the executable only: the `tinyproxy` package would start a service
        subprocess.run(
            ["apt-get", "install", "-y", "--no-install-recommends", "tinyproxy-bin"],
            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            check=True,
        )
        found = shutil.which("tinyproxy")
    if found is None:
        raise RuntimeError("tinyproxy is not installed")
    return found


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def cpu_s(pid: int) -> float:
    """CPU seconds of `pid` (all its threads) and of its live descendants (proxy.py's
    workers, node's helpers): utime, stime, plus the reaped children's cutime, cstime."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0.0
    own = sum(int(f) for f in fields[11:15]) / TICKS
    return own + sum(cpu_s(child) for child in children(pid))


def children(pid: int) -> list[int]:
    found: list[int] = []
    with contextlib.suppress(FileNotFoundError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(FileNotFoundError):
                found += [int(c) for c in (task / "children").read_text().split()]
    return found


class Cpu:
    """CPU used by named processes (and this client) between `__init__` and `report`."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.start = time.perf_counter()
        self.before = {name: cpu_s(pid) for name, pid in self.pids.items()}
        times = os.times()
        self.client = times.user + times.system

    def used(self) -> dict[str, float]:
        """CPU seconds each used so far."""
        times = os.times()
        used = {"client": times.user + times.system - self.client}
        return used | {name: cpu_s(pid) - self.before[name] for name, pid in self.pids.items()}

    def report(self, used: dict[str, float] | None = None) -> str:
        wall = time.perf_counter() - self.start
        used = self.used() if used is None else used
        return " ".join(f"{name} {100 * seconds / wall:.0f}%" for name, seconds in used.items())
