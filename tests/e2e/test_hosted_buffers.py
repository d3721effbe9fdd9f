"""One sandbox cannot pin the shared proxy's memory through a hosted model rule: every hosted
exchange reserves its worst case (its upstream TLS socket's fixed kernel buffers, the body it
holds, its fixed user-space buffers) from the sandbox's buffer budget before any await
(`lnk_proxy.hosted_budget`), so past the budget a request is refused (`too-much-buffer`, in the
wire log) at once, never hung, and another sandbox is still served.

On a private box with real users and bwrap: inside one sandbox, `TRIED` requests at once, each a
`BODY_BYTES` body streamed from the test internet's Anthropic-like API, which sends the first
event and holds the rest (`hold:TAG`, `net_models.held`): the slow provider. While they are held,
the provider's own record counts the exchanges in flight, the proxy's memory is measured from
outside (its peak resident set since it started, over its resident set before, plus the kernel
memory of every socket it holds, `ss -m`), and a second sandbox's request is served. Then the
held answers are let go and come whole.

Before the fix every request was forwarded (all `TRIED` in flight at the provider), each holding
the client's body and the proxy's serialisation of it (~2 x 6 MiB) and an upstream socket left
to the kernel's autotuning both ways (its receive buffer up to 32 MiB), none of it charged to the
sandbox: the count and the bound failed.
"""

from __future__ import annotations

import json
import re
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import install_prefix
import pytest
from as_user import as_user
from net import TestInternet

RunningBox = Any  # tests/e2e/conftest.py

pytestmark = [pytest.mark.needs_root, pytest.mark.e2e]

LNK = str(install_prefix.LNK)
MiB = 1024 * 1024
BUDGET = 32 * MiB  # the proxy's tunnel_buffer_budget_bytes here: small, so the test is quick
BODY_BYTES = 6 * MiB  # each request's padding: well under the 32 MiB a hosted body may be
# lnk_proxy.tunnel_buffers.hosted_worst_case, as the installed proxy counts it: the body (and its
# JSON around it, under 1 KiB), the upstream socket's buffers (its receive buffer fixed at 256 KiB,
# doubled, the unix side's default; its send buffer autotuned up to tcp_wmem's maximum, 4 MiB
# here) and the exchange's user-space ones (1.25 MiB): ~12 MiB each, so 2 fit in 32 MiB and a 3rd
# does not (3 fitted while the send buffer was fixed at 1 MiB).


def _fitting() -> int:
    """How many of the requests the budget holds at once, by this kernel's tcp_wmem."""
    wmem = [int(n) for n in Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()]
    fixed = 2 * 256 * 1024 + 212_992 + max(wmem[1:]) + 1280 * 1024
    return BUDGET // (BODY_BYTES + 1024 + fixed)


TRIED = 12
# The proxy's memory while the exchanges are held, over its idle resident set: what the budget
# lets in flight (32 MiB) and the slack of one body being judged and the allocator's (32 MiB).
# Before the fix, 12 exchanges held ~150 MiB of bodies alone.
MEMORY_BOUND = BUDGET + 32 * MiB
TIMEOUT_S = 120
RULE = "--model=anthropic=claude-x;secret=claude"

# Inside the sandbox: TRIED requests at once, each sent by a thread of its own while another
# reads the answer's head (a refused one is answered before its body is read); their first
# lines printed; after "go", the held answers read to their end.
SCRIPT = r"""
import json, os, socket, sys, threading
tried, size, tag = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
key = os.environ["ANTHROPIC_API_KEY"]
messages = [{"role": "user", "content": "p" * size}, {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "hold:" + tag}]
body = json.dumps({"model": "claude-x", "max_tokens": 8, "stream": True,
                   "messages": messages}).encode()
head = (f"POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1:4001\r\nx-api-key: {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
first, socks, rest = [""] * tried, [None] * tried, [b""] * tried

def send(s):
    try:
        s.sendall(head)
        s.sendall(body)
    except OSError:
        pass  # refused: the proxy closed before the body was read

def one(i):
    s = socket.create_connection(("127.0.0.1", 4001), timeout=90)
    socks[i] = s
    threading.Thread(target=send, args=(s,), daemon=True).start()
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            more = s.recv(65536)
            if not more:
                break
            data += more
        if data.startswith(b"HTTP/1.1 403"):
            while more := s.recv(65536):
                data += more
    except OSError as exc:
        data += repr(exc).encode()
    line, _, after = data.partition(b"\r\n")
    first[i] = line.decode("latin-1") + " | " + after.partition(b"\r\n\r\n")[2][:200].decode(
        "latin-1")
    rest[i] = data

threads = [threading.Thread(target=one, args=(i,)) for i in range(tried)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps(first), flush=True)
sys.stdin.readline()
ends = []
for i, s in enumerate(socks):
    data = rest[i]
    if first[i].startswith("HTTP/1.1 200"):
        while more := s.recv(65536):
            data += more
    ends.append(b"message_stop" in data)
print(json.dumps(ends), flush=True)
"""
OTHER_SCRIPT = r"""
import http.client, json, os
conn = http.client.HTTPConnection("127.0.0.1", 4001, timeout=60)
body = json.dumps({"model": "claude-x", "max_tokens": 8,
                   "messages": [{"role": "user", "content": "hi"}]})
conn.request("POST", "/v1/messages", body=body, headers={
    "x-api-key": os.environ["ANTHROPIC_API_KEY"], "Content-Type": "application/json"})
answer = conn.getresponse()
print(answer.status, answer.read().decode()[:200])
"""


@pytest.fixture(scope="module")
def internet() -> Iterator[Any]:
    with TestInternet() as net:
        yield net


def _env(running_box: RunningBox, box: Any) -> dict[str, str]:
    lnk_dirs = {k: v for k, v in box.env.items() if k.startswith("LNK_")}
    return {**running_box.owner_env(), **lnk_dirs}


def _argv(running_box: RunningBox, script: str, *args: str) -> list[str]:
    owner = running_box.owner
    run = ["sandbox", "run", "--yes", "--command=*", RULE, "--", "python3", "-I", "-c", script]
    return as_user(owner.uid, owner.gid, LNK, *run, *args)


def _status(pid: int, field: str) -> int:
    """A `kB` field of /proc/PID/status, in bytes."""
    text = Path(f"/proc/{pid}/status").read_text()
    found = re.search(rf"^{field}:\s+(\d+) kB$", text, re.MULTILINE)
    assert found is not None, text
    return int(found.group(1)) * 1024


def _socket_memory(pid: int) -> int:
    """Receive, send and send-queue bytes of every TCP and unix socket `pid` holds (`ss -m`)."""
    total = 0
    for family in ("-t", "-x"):
        out = subprocess.run(
            ["ss", family, "-m", "-p", "-n", "-H"], capture_output=True, text=True, check=True
        ).stdout
        for entry in re.split(r"\n(?=\S)", out):  # a continuation line starts with whitespace
            if f"pid={pid}," not in entry:
                continue
            mem = re.search(r"skmem:\(r(\d+),rb\d+,t(\d+),tb\d+,f\d+,w(\d+)", entry)
            assert mem is not None, entry
            total += sum(int(n) for n in mem.groups())
    return total


def _line(sandbox: subprocess.Popen[str]) -> Any:
    assert sandbox.stdout is not None
    line = sandbox.stdout.readline()
    try:
        return json.loads(line)
    except ValueError:
        sandbox.kill()
        _, err = sandbox.communicate(timeout=30)
        pytest.fail(f"the sandbox printed {line!r}: {err}")


def test_many_large_hosted_exchanges_of_one_sandbox_are_held_to_its_buffer_budget(
    running_box: RunningBox, private_box: Any, internet: Any
) -> None:
    proxy_config = (
        f'unsafe_public_networks = ["{internet.public_subnet}"]\n'
        f'unsafe_dns_table = "{internet.dns_file}"\n'
        f'unsafe_service_ca = "{internet.ca_file}"\n'
        f"tunnel_buffer_budget_bytes = {BUDGET}"
    )
    tag = secrets.token_hex(4)
    with private_box(proxy_config=proxy_config) as box:
        env = _env(running_box, box)
        done = subprocess.run(
            as_user(running_box.owner.uid, running_box.owner.gid, LNK, "secret", "set", "claude"),
            env=env,
            input="sk-ant-budget\n",
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        warm = subprocess.run(  # the proxy's code paths loaded before its idle size is taken
            _argv(running_box, OTHER_SCRIPT),
            env=env,
            cwd=str(running_box.owner.home),
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            check=False,
        )
        assert warm.stdout.startswith("200"), (warm.stdout, warm.stderr)
        proxy = int((box.run_dir / "proxy.pid").read_text().strip())
        idle = _status(proxy, "VmRSS") + _socket_memory(proxy)
        before = len(internet.model_requests())
        sandbox = subprocess.Popen(
            _argv(running_box, SCRIPT, str(TRIED), str(BODY_BYTES), tag),
            env=env,
            cwd=str(running_box.owner.home),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            first = _line(sandbox)  # every request answered: held (200) or refused (403)
            held = [f for f in first if f.startswith("HTTP/1.1 200")]
            refused = [f for f in first if f.startswith("HTTP/1.1 403")]
            # The proxy's memory with every granted exchange in flight.
            peak = _status(proxy, "VmHWM") + _socket_memory(proxy) - idle
            arrived = [
                r
                for r in internet.model_requests()[before:]
                if f"hold:{tag}" in json.dumps(r["body"])[-64:]
            ]
            # Another sandbox of the same box is served meanwhile.
            other = subprocess.run(
                _argv(running_box, OTHER_SCRIPT),
                env=env,
                cwd=str(running_box.owner.home),
                capture_output=True,
                text=True,
                timeout=TIMEOUT_S,
                check=False,
            )
            internet.release(tag)
            out, err = sandbox.communicate("go\n", timeout=TIMEOUT_S)
        finally:
            if sandbox.poll() is None:
                sandbox.kill()
                sandbox.wait()
        wire = "".join(
            p.read_text() for p in (Path(box.state_dir) / "wire").rglob("*") if p.is_file()
        )
    shown = (first, f"{len(arrived)} at the provider", f"{peak / MiB:.1f} MiB held")
    fitting = _fitting()
    assert 2 <= fitting < TRIED  # exchanges in flight together, and many past the budget
    assert len(held) == fitting, shown
    assert len(refused) == TRIED - fitting, first
    assert {f.partition(" | ")[2] for f in refused} == {"lnk: refused (too-much-buffer)\n"}, first
    assert len(arrived) == fitting  # the provider's own record: no more were in flight
    assert peak <= MEMORY_BOUND, f"{peak / MiB:.1f} MiB held by {len(held)} hosted exchanges"
    assert other.stdout.startswith("200"), (other.stdout, other.stderr)
    assert sandbox.returncode == 0, err
    assert json.loads(out.splitlines()[-1]) == [f.startswith("HTTP/1.1 200") for f in first]
    lines = [json.loads(line) for line in wire.splitlines()]
    budget = [e for e in lines if e["rule"] == "too-much-buffer"]
    assert budget and {e["decision"] for e in budget} == {"refused"}, budget
    assert {e["method"] for e in budget} == {"POST"}, budget
    assert len({e["sandbox"] for e in budget}) == 1  # the flooding sandbox's alone
