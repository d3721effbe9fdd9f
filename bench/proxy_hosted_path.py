"""(f) A hosted model request through its rule against the same request through a plain
`[internet]` CONNECT to the same test upstream (the OpenAI-shaped API of the test internet's
other host, TLS with its test CA), interleaved in one run, one client, one request at a time:
added p50 and p99 of the whole request (a small one, and one of 1 MiB: one long text, where the
rule reads, judges and encrypts what the client itself encrypts through the tunnel), of a
streamed answer's first event from the request's
start, and of that first event's own way from the upstream to the client: the test upstream
stamps it with CLOCK_MONOTONIC as it writes it (`tests/e2e/net_models.stamped`) and the client
takes the clock as the bytes arrive, so the TLS handshake and the request's judging are not in
it (issue 18's target: the first byte not delayed beyond 1 ms).

    sudo /opt/lnk/venv/bin/python bench/proxy_hosted_path.py [--requests 200] [--baseline DIR]

One lnk_proxy from this checkout (as nobody, `unsafe_dns_table` naming the test hosts,
`unsafe_service_ca` its CA) with two listeners: sandbox `rule` holding an openai `[[models]]`
rule and its key, sandbox `plain` with `[internet] hosts = [api.openai.com]` and no rule. Through
the rule the client sends `POST http://api.openai.com/v1/chat/completions` with the placeholder
key and the proxy does the TLS; through the tunnel the client does the TLS itself. Either way
one TLS handshake per request (the rule never pools upstream connections; nor does the client).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import ssl
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from proxy_procs import (
    CHECKOUT,
    NOBODY,
    SECRET,
    SOURCES,
    Lnk,
    TestInternet,
    start_confined,
    wait_until,
)

OPENAI = "api.openai.com"
KEY = "sk-proj-bench-" + "k" * 40
PLACEHOLDER = "lnk-secret-bench-key"
IO_TIMEOUT_S = 30.0
BODY = json.dumps({"model": "gpt-x", "messages": [{"role": "user", "content": "hi"}]})
STREAM = json.dumps(
    {"model": "gpt-x", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
)
BIG_BYTES = 1024 * 1024  # issue 18's body size
BIG = json.dumps({"model": "gpt-x", "messages": [{"role": "user", "content": ""}]})
BIG = BIG.replace('""', '"' + "x" * (BIG_BYTES - len(BIG)) + '"')
STAMPED = json.dumps(
    {"model": "gpt-x", "stream": True, "messages": [{"role": "user", "content": "stamp"}]}
)
TARGET_FIRST_BYTE_MS = 1.0  # streaming's first event not delayed beyond this (issue 18)
_SENT = re.compile(rb'"sent_ns": ([0-9]+)')


def _start(stack: ExitStack, base: Path, net: TestInternet, checkout: Path = CHECKOUT) -> Lnk:
    (base / "etc").mkdir()
    (base / "etc" / "proxy.toml").write_text(
        f'unsafe_public_networks = ["198.18.0.0/15"]\ncontroller_uid = 0\n'
        f'unsafe_dns_table = "{net.dns_file}"\nunsafe_service_ca = "{net.ca_file}"\n'
    )
    for name in ("run", "state"):
        (base / name).mkdir(mode=0o755)
        os.chown(base / name, NOBODY, NOBODY)
    (base / "run" / "flags").mkdir(mode=0o755)
    env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "PYTHONPATH": os.pathsep.join(str(checkout / s) for s in SOURCES),
        "LNK_CONFIG_DIR": str(base / "etc"),
        "LNK_RUN_DIR": str(base / "run"),
        "LNK_STATE_DIR": str(base / "state"),
    }
    argv = [sys.executable, "-m", "lnk_proxy"]
    process = start_confined(stack, argv, env, [], base / "lnk_proxy.out")
    lnk = Lnk(process, base / "run" / "proxy" / "admin.sock", base / "run" / "proxy" / "r.sock")
    wait_until(lambda: _listening(lnk.admin_socket), process, "lnk_proxy")
    none = {"internet_any": False, "internet": [], "lan_any": False, "lan": []}
    rule = {"kind": "openai", "models": ["gpt-x"], "secret": "bench-key"}
    for sandbox, grants, extra in (
        ("rule", none, {"models": [rule], "service_secrets": {"bench-key": KEY}}),
        ("plain", {**none, "internet": [OPENAI]}, {}),
    ):
        command = {
            "op": "open",
            "sandbox": sandbox,
            "socket": str(base / "run" / "proxy" / f"{sandbox}.sock"),
        }
        reply = lnk.admin({**command, "grants": grants, "secret": SECRET, **extra})
        if reply != {"ok": True}:
            raise RuntimeError(f"lnk_proxy did not open {sandbox}: {reply}")
    return lnk


def _listening(path: Path) -> bool:
    """Whether a unix socket accepts (it exists a moment before it listens: a loaded machine's
    bench was refused in between)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except (FileNotFoundError, ConnectionRefusedError):
            return False
    return True


def _request(body: str, path_prefix: str, key: str) -> bytes:
    return (
        f"POST {path_prefix}/v1/chat/completions HTTP/1.1\r\nHost: {OPENAI}\r\n"
        f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n{body}"
    ).encode()


def _timed(
    sock: socket.socket | ssl.SSLSocket, start: float, marker: bytes
) -> tuple[float, float, float]:
    """(ms to the first `marker` of the answer, ms to its end) from `start`, and the ms from
    the upstream's stamp on the first event to its arrival here (0 when unstamped)."""
    answer, first, arrived_ns = b"", 0.0, 0
    while chunk := sock.recv(65536):
        now_ns = time.monotonic_ns()
        answer += chunk
        if not first and marker in answer:
            first, arrived_ns = time.perf_counter(), now_ns
    end = time.perf_counter()
    if b" 200 " not in answer.split(b"\r\n", 1)[0]:
        raise RuntimeError(f"not a 200: {answer[:200]!r}")
    sent = _SENT.search(answer)
    way = (arrived_ns - int(sent.group(1))) / 1e6 if sent else 0.0
    return (first - start) * 1000, (end - start) * 1000, way


def _through_rule(base: Path, body: str, marker: bytes) -> tuple[float, float, float]:
    start = time.perf_counter()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(IO_TIMEOUT_S)
        sock.connect(str(base / "run" / "proxy" / "rule.sock"))
        sock.sendall(_request(body, f"http://{OPENAI}", PLACEHOLDER))
        return _timed(sock, start, marker)


def _through_tunnel(
    base: Path, tls: ssl.SSLContext, body: str, marker: bytes
) -> tuple[float, float, float]:
    start = time.perf_counter()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as raw:
        raw.settimeout(IO_TIMEOUT_S)
        raw.connect(str(base / "run" / "proxy" / "plain.sock"))
        raw.sendall(f"CONNECT {OPENAI}:443 HTTP/1.1\r\nHost: {OPENAI}:443\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += raw.recv(1)
        if b" 200 " not in head.split(b"\r\n", 1)[0]:
            raise RuntimeError(f"CONNECT refused: {head!r}")
        with tls.wrap_socket(raw, server_hostname=OPENAI) as sock:
            sock.sendall(_request(body, "", KEY))
            return _timed(sock, start, marker)


def _quantiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return ordered[len(ordered) // 2], ordered[min(len(ordered) - 1, len(ordered) * 99 // 100)]


def _base(stack: ExitStack) -> Path:
    base = Path(tempfile.mkdtemp(prefix="lnkh", dir="/tmp"))
    stack.callback(shutil.rmtree, base, ignore_errors=True)
    base.chmod(0o755)
    return base


def bench_path(requests: int, baseline: Path | None = None) -> None:
    """Print row (f); with `baseline` (another checkout, e.g. `git worktree add` of the commit
    to compare with), a second lnk_proxy from it serves the rule too, interleaved in the run."""
    with ExitStack() as stack:
        net = stack.enter_context(TestInternet())
        base = _base(stack)
        _start(stack, base, net)
        old = None
        if baseline is not None:
            old = _base(stack)
            _start(stack, old, net, baseline)
        tls = ssl.create_default_context(cafile=str(net.ca_file))
        print(f"\n(f) hosted model request, load average {os.getloadavg()[0]:.2f}, {requests} each")
        for name, body, marker in (
            ("whole request", BODY, b"chat.completion"),
            ("1 MiB request", BIG, b"chat.completion"),
            ("stream first event", STREAM, b"data: "),
            ("first event's way", STAMPED, b"data: "),
        ):
            pick = {"stream first event": 0, "first event's way": 2}.get(name, 1)
            rule: list[float] = []
            plain: list[float] = []
            before: list[float] = []
            for _ in range(requests):  # interleaved: the same load on each
                rule.append(_through_rule(base, body, marker)[pick])
                plain.append(_through_tunnel(base, tls, body, marker)[pick])
                if old is not None:
                    before.append(_through_rule(old, body, marker)[pick])
            r50, r99 = _quantiles(rule)
            p50, p99 = _quantiles(plain)
            print(
                f"  {name:<20} rule p50 {r50:7.2f} ms p99 {r99:7.2f} ms | CONNECT p50 "
                f"{p50:7.2f} ms p99 {p99:7.2f} ms | added p50 {r50 - p50:+.2f} ms "
                f"p99 {r99 - p99:+.2f} ms"
            )
            if before:
                b50, b99 = _quantiles(before)
                print(
                    f"  {'':<20} baseline's rule p50 {b50:7.2f} ms p99 {b99:7.2f} ms | added p50"
                    f" {b50 - p50:+.2f} ms p99 {b99 - p99:+.2f} ms"
                )
            if pick == 2:
                met = r50 - p50 < TARGET_FIRST_BYTE_MS
                print(f"  target: first byte added p50 < {TARGET_FIRST_BYTE_MS} ms:", end=" ")
                print("met" if met else "NOT met")
        print(f"  load average at the end {os.getloadavg()[0]:.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=200, help="requests per path and row")
    parser.add_argument(
        "--baseline", type=Path, help="another checkout whose lnk_proxy serves the rule too"
    )
    if os.geteuid() != 0:
        print(
            "run as root: sudo /opt/lnk/venv/bin/python bench/proxy_hosted_path.py", file=sys.stderr
        )
        return 2
    args = parser.parse_args()
    bench_path(max(10, args.requests), args.baseline)
    return 0


if __name__ == "__main__":
    sys.exit(main())
