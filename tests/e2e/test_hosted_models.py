"""Hosted model rules at work (`[[models]]` kinds anthropic and openai), on a private box with
real users and real bwrap: the real `anthropic` and `openai` SDKs inside a sandbox, given only
what the box sets (the base URL and a placeholder key), reach the test internet's Anthropic- and
OpenAI-shaped APIs over TLS (its CA trusted only through `unsafe_service_ca`) with the owner's
key added by the proxy (the new one as soon as the owner sets it again), server tools removed,
a streamed answer's first event not held back.
Each refusal is asserted twice: the proxy's 403 and the upstream's own record that nothing
arrived; the key never appears inside the sandbox, in its answers or in the wire log."""

from __future__ import annotations

import json
import secrets
import subprocess
import sysconfig
from pathlib import Path
from typing import Any

import install_prefix
import pytest
from as_owner import owner_env, run_as_owner
from as_user import as_user
from internet_box import proxy_config
from net import ANTHROPIC, OPENAI, OTHER, WWW

RunningBox = Any  # tests/e2e/conftest.py

pytestmark = [pytest.mark.needs_root, pytest.mark.e2e]

LNK = str(install_prefix.LNK)
# The SDKs come from the test environment (the dev extra); the sandbox reads them from there
# with the system's own Python, which that environment was made with.
SITE = sysconfig.get_paths()["purelib"]
RULES = ("--model=anthropic=claude-x;secret=claude", "--model=openai=gpt-x;secret=oai")
A_PLACEHOLDER, O_PLACEHOLDER = "lnk-secret-claude", "lnk-secret-oai"
TIMEOUT_S = 120
# Each attack of the script below and the proxy's rule for its refusal.
REFUSED = {
    "files": "model-route",
    "batches": "model-route",
    "dot-path": "model-path",
    "url-image": "model-fetch",
    "input-file-url": "model-fetch",
    "foreign-id": "model-foreign-id",
    "foreign-previous": "model-foreign-id",
    "other-model": "model-name",
    "own-x-api-key": "model-own-key",
    "own-bearer": "model-own-key",
    "nan": "model-body",
    "escaped-source": "model-fetch",
    "twice-type": "model-body",
    "lone-surrogate": "model-body",
    "connect": "model-plain-http-only",
}

# Inside the sandbox: each refused request, its status printed; then (after "go" on stdin) the
# SDKs' allowed calls.
SCRIPT = r"""
import http.client, json, os, socket, sys
sys.path.insert(0, SITE)

def raw(port, method, path, body=None, headers=()):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    data = json.dumps(body).encode() if body is not None else None
    hdrs = dict(headers)
    if data is not None:
        hdrs["Content-Type"] = "application/json"
    conn.request(method, path, body=data, headers=hdrs)
    answer = conn.getresponse()
    text = answer.read().decode("latin-1")
    return f"{answer.status} {text.strip()[:120]}"

def spelt(port, path, data, headers):  # as these bytes: what json.dumps would not write
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("POST", path, body=data, headers={**headers, "Content-Type": "application/json"})
    answer = conn.getresponse()
    return f"{answer.status} {answer.read().decode('latin-1').strip()[:120]}"

A, O = 4001, 4000
AK = {"x-api-key": os.environ["ANTHROPIC_API_KEY"]}
OK = {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]}
MSG = {"model": "claude-x", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
URL_IMAGE = {"type": "image", "source": {"type": "url", "url": "https://x.example/a.png"}}
tries = {
    "files": raw(A, "GET", "/v1/files", headers=AK),
    "batches": raw(O, "POST", "/v1/batches", {"input_file_id": "file-1"}, OK),
    "dot-path": raw(O, "POST", "/v1/chat/../files", {"model": "gpt-x"}, OK),
    "url-image": raw(A, "POST", "/v1/messages",
                     {**MSG, "messages": [{"role": "user", "content": [URL_IMAGE]}]}, AK),
    "input-file-url": raw(O, "POST", "/v1/responses", {"model": "gpt-x", "input": [
        {"role": "user", "content": [{"type": "input_file", "file_url": "https://x/a.pdf"}]}]}, OK),
    "foreign-id": raw(O, "GET", "/v1/responses/resp_someone_elses", headers=OK),
    "foreign-previous": raw(O, "POST", "/v1/responses",
                            {"model": "gpt-x", "input": "hi",
                             "previous_response_id": "resp_x"}, OK),
    "other-model": raw(A, "POST", "/v1/messages", {**MSG, "model": "claude-other"}, AK),
    "own-x-api-key": raw(A, "POST", "/v1/messages", MSG, {"x-api-key": "sk-ant-mine"}),
    "own-bearer": raw(O, "POST", "/v1/chat/completions",
                      {"model": "gpt-x", "messages": []}, {"Authorization": "Bearer sk-mine"}),
}
# The fast form's attacks (the content forwarded as the client's bytes only when proven plain):
# a fetch key spelt with an escape, a type given twice whose first is harmless, a lone surrogate.
def one_block(block):
    return (b'{"model": "claude-x", "max_tokens": 8, "messages": [{"role": "user", "content": ['
            + block + b']}]}')
tries["escaped-source"] = spelt(A, "/v1/messages", one_block(
    b'{"type": "image", "\\u0073ource": {"type": "url", "url": "https://x.example/a.png"}}'), AK)
tries["twice-type"] = spelt(A, "/v1/messages", one_block(
    b'{"type": "text", "text": "a", "type": "server_tool_use"}'), AK)
tries["lone-surrogate"] = spelt(A, "/v1/messages", one_block(
    b'{"type": "text", "text": "\\ud800"}'), AK)
conn = http.client.HTTPConnection("127.0.0.1", A, timeout=30)
conn.putrequest("POST", "/v1/messages", skip_accept_encoding=True)
conn.putheader("x-api-key", AK["x-api-key"])
NAN = b'{"model": "claude-x", "max_tokens": 8, "x": NaN}'
conn.putheader("Content-Length", str(len(NAN)))
conn.endheaders(NAN)
answer = conn.getresponse()
tries["nan"] = f"{answer.status} {answer.read().decode('latin-1').strip()[:120]}"
host, port = os.environ["HTTP_PROXY"][len("http://"):].rstrip("/").rsplit(":", 1)
with socket.create_connection((host, int(port)), timeout=30) as s:
    s.sendall(b"CONNECT api.anthropic.com:443 HTTP/1.1\r\nHost: api.anthropic.com:443\r\n\r\n")
    status = s.recv(200).split(b"\r\n")[0].decode().split(" ", 1)[1]
    tries["connect"] = status
print(json.dumps(tries), flush=True)
sys.stdin.readline()

import anthropic, openai
out = {}
a = anthropic.Anthropic(max_retries=0)
m = a.messages.create(
    model="claude-x", max_tokens=16, messages=[{"role": "user", "content": "hi"}],
    tools=[{"name": "lookup", "input_schema": {"type": "object"}},
           {"type": "web_search_20250305", "name": "web_search"},
           {"type": "web_fetch_20250910", "name": "web_fetch"}],
    extra_headers={"anthropic-beta": "mcp-client-2025-11-20,prompt-caching-2024-07-31"},
)
out["anthropic"] = m.content[0].text
out["count"] = a.messages.count_tokens(
    model="claude-x", messages=[{"role": "user", "content": "x"}]).input_tokens
out["models"] = [x.id for x in a.models.list()]
with a.messages.stream(model="claude-x", max_tokens=8,
                       messages=[{"role": "user", "content": "hold:" + TAG}]) as stream:
    first = next(iter(stream))
    print(json.dumps({"first": first.type}), flush=True)
    sys.stdin.readline()
    out["streamed"] = stream.get_final_text()
o = openai.OpenAI(max_retries=0)
r = o.responses.create(model="gpt-x", input="hi", tools=[
    {"type": "web_search"}, {"type": "function", "name": "f", "parameters": {}}])
out["responses"] = r.output_text
out["again"] = o.responses.retrieve(r.id).id == r.id
out["continued"] = o.responses.create(
    model="gpt-x", input="more", previous_response_id=r.id).output_text
c = o.chat.completions.create(
    model="gpt-x", messages=[{"role": "user", "content": "hi"}], web_search_options={})
out["chat"] = c.choices[0].message.content
out["chat-stream"] = "".join(
    ch.choices[0].delta.content or "" for ch in o.chat.completions.create(
        model="gpt-x", messages=[{"role": "user", "content": "hi"}], stream=True) if ch.choices)
out["embeddings"] = o.embeddings.create(model="gpt-x", input="a").data[0].embedding
out["env"] = {k: v for k, v in os.environ.items() if k.startswith(("ANTHROPIC", "OPENAI"))}
print(json.dumps(out), flush=True)
sys.stdin.readline()  # the owner sets the key again meanwhile
again = a.messages.create(
    model="claude-x", max_tokens=8, messages=[{"role": "user", "content": "x"}])
print(json.dumps({"after": again.content[0].text}), flush=True)
"""


def _lnk(running_box: RunningBox, box: Any, *args: str, stdin: str = "") -> Any:
    return run_as_owner(running_box, [LNK, *args], box=box, input=stdin, timeout=90)


def _wire(box: Any) -> str:
    return "".join(p.read_text() for p in (Path(box.state_dir) / "wire").rglob("*") if p.is_file())


def _line(sandbox: subprocess.Popen[str]) -> dict[str, Any]:
    assert sandbox.stdout is not None
    line = sandbox.stdout.readline()
    try:
        return dict(json.loads(line))
    except ValueError:
        sandbox.kill()
        _, err = sandbox.communicate(timeout=30)
        pytest.fail(f"the sandbox printed {line!r}: {err}")


def test_the_sdks_reach_the_providers_with_the_owners_key_and_every_attack_is_refused(
    running_box: RunningBox, private_box: Any, internet: Any
) -> None:
    trusting = proxy_config(internet, f'unsafe_service_ca = "{internet.ca_file}"')
    a_key = "sk-ant-api03-" + secrets.token_urlsafe(30)
    o_key = "sk-proj-" + secrets.token_urlsafe(30)
    tag = secrets.token_hex(4)
    with private_box(proxy_config=trusting) as box:
        for name, value in (("claude", a_key), ("oai", o_key)):
            done = _lnk(running_box, box, "secret", "set", name, stdin=value + "\n")
            assert done.returncode == 0, done.stderr
        owner = running_box.owner
        script = SCRIPT.replace("SITE", repr(SITE)).replace("TAG", repr(tag))
        argv = [
            "sandbox",
            "run",
            "--yes",
            f"--read={SITE}",
            "--command=*",  # the SDKs' compiled parts (pydantic_core, jiter) are mapped too
            *RULES,
            "--",
            "python3",
            "-I",
            "-c",
            script,
        ]
        before = len(internet.model_requests())
        sandbox = subprocess.Popen(
            as_user(owner.uid, owner.gid, LNK, *argv),
            env=owner_env(running_box, box),
            cwd=str(owner.home),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert sandbox.stdin is not None
            tries = _line(sandbox)
            # Refused: the proxy's 403, and the providers' own record that nothing arrived.
            assert {k: v.partition(" ")[0] for k, v in tries.items()} == dict.fromkeys(
                REFUSED, "403"
            ), tries
            for name, rule in REFUSED.items():
                assert rule in tries[name] or rule in _wire(box), (name, tries[name])
            assert len(internet.model_requests()) == before
            sandbox.stdin.write("go\n")
            sandbox.stdin.flush()
            # The streamed answer's first event is here while the provider holds the rest.
            assert _line(sandbox) == {"first": "message_start"}
            internet.release(tag)
            sandbox.stdin.write("go\n")
            sandbox.stdin.flush()
            got = _line(sandbox)
            # The key set again while the sandbox runs: the next request carries the new one.
            rotated = "sk-ant-api03-" + secrets.token_urlsafe(30)
            done = _lnk(running_box, box, "secret", "set", "claude", stdin=rotated + "\n")
            assert done.returncode == 0, done.stderr
            out, err = sandbox.communicate("go\n", timeout=TIMEOUT_S)
        finally:
            if sandbox.poll() is None:
                sandbox.kill()
                sandbox.wait()
        assert sandbox.returncode == 0, err
        wire = _wire(box)
    assert json.loads(out.splitlines()[-1]) == {
        "after": f"key={A_PLACEHOLDER} tools= model=claude-x"
    }
    # The answers: the key the provider got is shown scrubbed, server tools were removed.
    assert got["anthropic"] == f"key={A_PLACEHOLDER} tools=custom model=claude-x"
    assert got["count"] == 7 and got["models"] == ["claude-x"]
    assert got["streamed"] == f"key={A_PLACEHOLDER} tools= model=claude-x"
    assert got["responses"] == f"key={O_PLACEHOLDER} tools=function model=gpt-x"
    assert got["again"] is True and got["continued"].startswith(f"key={O_PLACEHOLDER}")
    assert got["chat"] == got["chat-stream"] == f"key={O_PLACEHOLDER} tools= model=gpt-x"
    assert got["embeddings"] == [0.5, 0.25]
    assert got["env"] == {
        "ANTHROPIC_BASE_URL": "http://127.0.0.1:4001",
        "ANTHROPIC_API_KEY": A_PLACEHOLDER,
        "OPENAI_BASE_URL": "http://127.0.0.1:4000/v1",
        "OPENAI_API_KEY": O_PLACEHOLDER,
    }
    # The providers' record: the owner's key in its one header, the proxy's body.
    arrived = internet.model_requests()[before:]
    anthropic_calls = [r for r in arrived if r["host"] == ANTHROPIC]
    openai_calls = [r for r in arrived if r["host"] == OPENAI]
    assert {r["x-api-key"] for r in anthropic_calls[:-1]} == {a_key}
    assert anthropic_calls[-1]["x-api-key"] == rotated  # the old key never again
    assert {r["authorization"] for r in anthropic_calls} == {None}
    assert {r["authorization"] for r in openai_calls} == {f"Bearer {o_key}"}
    first = anthropic_calls[0]
    assert [t.get("type") for t in first["body"]["tools"]] == [None]
    assert first["anthropic-beta"] == "prompt-caching-2024-07-31"
    chat = next(r for r in openai_calls if r["path"] == "/v1/chat/completions")
    assert "web_search_options" not in chat["body"]
    # The key appears nowhere the sandbox or the wire log could show it.
    for key in (a_key, o_key, rotated):
        assert key not in out + err + wire + json.dumps(got)
    assert "removed tool 'web_search_20250305'" in wire


# Inside the sandbox: a CONNECT through the proxy to each target, its status line printed.
TUNNEL_SCRIPT = r"""
import json, os, socket, sys
host, port = os.environ["HTTP_PROXY"][len("http://"):].rstrip("/").rsplit(":", 1)
out = {}
for target in sys.argv[1:]:
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        out[target] = s.recv(200).split(b"\r\n")[0].decode().split(" ", 1)[1]
print(json.dumps(out))
"""


def test_a_tunnel_to_the_providers_address_or_another_name_for_it_is_refused(
    running_box: RunningBox, private_box: Any, internet: Any
) -> None:
    """`[internet] *` with an anthropic rule: a CONNECT by the provider's address (written two
    ways) or by another name answering it is refused (the name's naming the rule, with the hint
    to its plain endpoint), and the provider's host accepts no connection; a tunnel to another
    host of `*` still opens."""
    trusting = proxy_config(internet, f'unsafe_service_ca = "{internet.ca_file}"')
    provider = internet.other.address  # api.anthropic.com's, and other.test-public.example's
    by_address = [f"{provider}:443", f"[::ffff:{provider}]:443", f"{OTHER}:443"]
    granted = f"{WWW}:443"
    with private_box(proxy_config=trusting) as box:
        done = _lnk(running_box, box, "secret", "set", "claude", stdin="sk-ant-x\n")
        assert done.returncode == 0, done.stderr
        before = internet.accepted(internet.other)
        ran = _lnk(
            running_box,
            box,
            *("sandbox", "run", "--yes", "--command=*", "--internet-host=*", RULES[0]),
            *("--", "python3", "-I", "-c", TUNNEL_SCRIPT, *by_address, granted),
        )
        assert ran.returncode == 0, ran.stderr
        wire = _wire(box)
    statuses = json.loads(ran.stdout)
    assert statuses == {
        **dict.fromkeys(by_address, "403 Forbidden"),
        granted: "200 Connection Established",
    }, statuses
    assert internet.accepted(internet.other) == before  # the provider's own record: nothing
    refused = {json.loads(line)["target"]: json.loads(line) for line in wire.splitlines()}
    # A literal is never reached through [internet] (the policy's own refusal, before any
    # tunnel); another name answering the provider's address is the hosted rule's refusal.
    assert {refused[t]["rule"] for t in by_address[:2]} == {"literal-not-allowed"}, wire
    other = refused[f"{OTHER}:443"]
    assert other["rule"] == "model-plain-http-only", wire
    assert f"an address of {ANTHROPIC}" in other["reason"], other
    assert "http://127.0.0.1:4001" in other["reason"], other
