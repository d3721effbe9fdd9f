"""A local model rule at work, on the running box with real users and real bwrap: a runtime of
Ollama's shape on this machine's loopback (`ollama_shaped`), granted as `--model ollama=...`
with no `[localhost]`. From inside, a plain-HTTP client with Ollama's defaults (`OLLAMA_HOST`,
port 11434) reaches its inference routes both ways a program sends them (straight to the port,
and through `HTTP_PROXY`), streamed as it comes; each admin route and each body past inference
is refused, asserted twice: the proxy's 403 naming the rule, and the runtime's own record that
nothing arrived (not a request, not a connection). The runtime's own port, and every other of
this machine, stays closed."""

from __future__ import annotations

import json
import queue
import secrets
import shlex
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import install_prefix
import pytest
from as_user import as_user
from ollama_shaped import ADMIN_ROUTES, OllamaShaped

RunningBox = Any  # tests/e2e/conftest.py

pytestmark = [pytest.mark.needs_root, pytest.mark.e2e]

LNK = str(install_prefix.LNK)
MODELS = ("llama3.2:3b", "gpt-oss*")
CURL = "curl -sS --max-time 20 --path-as-is"
DIRECT = "--noproxy '*'"  # straight to the model's port inside: the relay's CONNECT to it
INSIDE = "http://127.0.0.1:11434"
STREAM_TIMEOUT_S = 90.0
EXIT_REFUSED = 126  # lnk_shared.errors.EXIT_RUN_REFUSED: a run refused


@pytest.fixture(scope="module")
def runtime() -> Iterator[OllamaShaped]:
    with OllamaShaped(models=("llama3.2:3b", "llama3.1:8b")) as served:
        yield served


def _argv(box: RunningBox, runtime: OllamaShaped, script: str) -> list[str]:
    rule = f"--model=ollama={','.join(MODELS)};upstream=http://127.0.0.1:{runtime.port}"
    run = ["sandbox", "run", "--yes", "--command=curl", rule, "--", "/bin/sh", "-c", script]
    return as_user(box.owner.uid, box.owner.gid, LNK, *run)


def _in_sandbox(box: RunningBox, runtime: OllamaShaped, script: str) -> str:
    ran = subprocess.run(
        _argv(box, runtime, script),
        env=box.owner_env(),
        cwd=str(box.owner.home),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert ran.returncode == 0, (ran.stdout, ran.stderr)
    assert "Traceback" not in ran.stderr
    return ran.stdout


def test_inference_works_with_ollamas_defaults_and_streams_as_it_comes(
    running_box: RunningBox, runtime: OllamaShaped
) -> None:
    before = len(runtime.seen())
    chat = '{ "model": "llama3.2:3b", "messages": [{"role": "user", "content": "hi"}] }'
    stream = '{"model": "llama3.2:3b", "stream": true}'
    script = "; ".join(
        [
            'echo "host=$OLLAMA_HOST"',
            f'{CURL} "$OLLAMA_HOST/api/tags"; echo',  # through HTTP_PROXY (curl reads http_proxy)
            f"{CURL} {DIRECT} {INSIDE}/api/version; echo",  # the default port, no variable
            f"{CURL} {DIRECT} -H 'Authorization: Bearer own-key' {INSIDE}/api/chat "
            f"-d {shlex.quote(chat)}; echo",
            f"{CURL} -N {DIRECT} {INSIDE}/api/chat -d {shlex.quote(stream)}",
            "echo end",
        ]
    )
    lines: queue.Queue[str] = queue.Queue()
    got: list[str] = []
    with subprocess.Popen(
        _argv(running_box, runtime, script),
        env=running_box.owner_env(),
        cwd=str(running_box.owner.home),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as sandbox:
        out = sandbox.stdout
        assert out is not None
        reader = threading.Thread(target=lambda: [lines.put(x) for x in out], daemon=True)
        reader.start()
        try:
            while not got or '"n": 0' not in got[-1]:  # the stream's first chunk, the rest held
                got.append(lines.get(timeout=STREAM_TIMEOUT_S))
            runtime.release()  # only now does the runtime send the stream's last chunk
            sandbox.wait(timeout=STREAM_TIMEOUT_S)
            reader.join(timeout=STREAM_TIMEOUT_S)
            while not lines.empty():
                got.append(lines.get_nowait())
        finally:
            if sandbox.poll() is None:
                sandbox.kill()
                sandbox.wait()
            reader.join(timeout=STREAM_TIMEOUT_S)
        errors = sandbox.stderr.read() if sandbox.stderr else ""
    assert sandbox.returncode == 0, (got, errors)
    assert got[0] == "host=http://127.0.0.1:11434\n"
    assert '"llama3.2:3b"' in got[1] and '"0.12.0"' in got[2]
    assert '"done": true' in got[3] and '"echo"' in got[3]
    assert '"n": 1' in got[5] and got[-1] == "end\n"
    arrived = runtime.seen()[before:]
    assert [(s.method, s.path) for s in arrived] == [
        ("GET", "/api/tags"),
        ("GET", "/api/version"),
        ("POST", "/api/chat"),
        ("POST", "/api/chat"),
    ]
    assert {s.headers["host"] for s in arrived} == {f"127.0.0.1:{runtime.port}"}
    assert all("authorization" not in s.headers for s in arrived)  # the client's key: dropped
    assert arrived[2].body == (
        b'{"model":"llama3.2:3b","messages":[{"role":"user","content":"hi"}]}'
    )  # the proxy's serialisation, not the client's bytes


def _curl(method: str, path: str, body: str | None, *, direct: bool) -> str:
    how = "--head" if method == "HEAD" else f"-X {method}"
    data = f" -H 'Content-Type: application/json' -d {shlex.quote(body)}" if body else ""
    via = f" {DIRECT}" if direct else ""
    return f"{CURL}{via} {how} -w ' %{{http_code}}\\n' {INSIDE}{path}{data}"


REFUSED_BODIES = (
    ("/api/chat", '{"model": "llama3.1:8b"}', "model-not-allowed"),  # the runtime has it
    ("/api/generate", '{"model": "gpt-oss:120b-cloud"}', "model-not-allowed"),  # by a prefix
    ("/api/generate", '{"model": "llama3.2:3b", "template": "{{ .Prompt }}"}', "model-field"),
    ("/api/chat", '{"model": "llama3.2:3b", "tools": [{"type": "web_search"}]}', "model-tool"),
    (
        "/v1/chat/completions",
        '{"model": "llama3.2:3b", "messages": [{"role": "user", "content": [{"type": '
        '"image_url", "image_url": {"url": "http://10.0.0.1/x.png"}}]}]}',
        "model-url",
    ),
    ("/api/chat", '{"model": "llama3.2:3b", "model": "llama3.1:8b"}', "model-body"),
    ("/api/generate", '{"model": "llama3.2:3b", "options": {"temperature": NaN}}', "model-body"),
    ("/api/show", '{"name": "llama3.1:8b"}', "model-not-allowed"),
)


def test_admin_routes_and_bodies_past_inference_are_refused_and_nothing_arrives(
    running_box: RunningBox, runtime: OllamaShaped
) -> None:
    before, accepted = len(runtime.seen()), runtime.accepted()
    tried: list[tuple[str, str]] = []
    for direct in (True, False):
        for method, path in ADMIN_ROUTES:
            body = "{}" if method == "POST" else None
            tried.append((_curl(method, path, body, direct=direct), "model-admin"))
        for path, body, rule in REFUSED_BODIES:
            tried.append((_curl("POST", path, body, direct=direct), rule))
    out = _in_sandbox(running_box, runtime, "; ".join(command for command, _ in tried))
    answers = out.splitlines()
    codes = [a.rsplit(" ", 1)[-1] for a in answers if a.endswith((" 403", " 200", " 000"))]
    assert codes == ["403"] * len(tried), answers
    bodies = [a for a in answers if a.startswith("lnk: refused")]
    head_only = sum(1 for command, _ in tried if "--head" in command)  # a HEAD shows no body
    assert len(bodies) == len(tried) - head_only, answers
    expected = [f"lnk: refused ({rule})" for command, rule in tried if "--head" not in command]
    assert bodies == expected
    # The runtime's own record: not one of them arrived, nor even a connection.
    assert runtime.seen()[before:] == []
    assert runtime.accepted() == accepted


VIA_PROXY = "--noproxy ''"  # curl: no NO_PROXY exception, every request by HTTP_PROXY


def test_without_localhost_no_other_port_of_this_machine_is_reached(
    running_box: RunningBox, runtime: OllamaShaped
) -> None:
    before, accepted = len(runtime.seen()), runtime.accepted()
    real = f"http://127.0.0.1:{runtime.port}"
    # Through the proxy although NO_PROXY names loopback (the box sets it for the sandbox's
    # own endpoints): the proxy's judgement of this machine's ports is what is tried.
    script = "; ".join(
        [
            f"{CURL} {VIA_PROXY} -w ' %{{http_code}}\\n' {real}/api/tags",  # its own port
            f"{CURL} {VIA_PROXY} -w ' %{{http_code}}\\n' http://localhost:{runtime.port}/api/tags",
            f"{CURL} {VIA_PROXY} -w ' %{{http_code}}\\n' http://[::ffff:127.0.0.1]:{runtime.port}/api/tags",
            f"{CURL} {VIA_PROXY} -w ' %{{http_code}}\\n' http://127.0.0.1:11435/",  # no rule's
            f"{CURL} {VIA_PROXY} -p -w ' %{{http_code}}\\n' {real}/api/tags 2>&1",  # a tunnel to it
            f"{CURL} {DIRECT} -w ' %{{http_code}}\\n' {real}/api/tags 2>&1",  # no route inside
            "true",
        ]
    )
    out = _in_sandbox(running_box, runtime, script)
    lines = out.splitlines()
    refused = [line for line in lines if line.startswith("lnk: refused (")]
    assert len(refused) == 4 and lines.count(" 403") == 4, lines
    assert all(line.startswith("lnk: refused (never-") for line in refused), lines
    assert any("403" in line for line in lines[8:-1]), lines  # the CONNECT's own refusal
    assert lines[-1].endswith(" 000"), lines  # nothing listens there inside the sandbox
    assert runtime.seen()[before:] == []
    assert runtime.accepted() == accepted


def test_a_hosted_model_rule_whose_key_is_not_kept_is_not_started(running_box: RunningBox) -> None:
    """Hosted rules are served (tests/e2e/test_hosted_models.py); one whose key the owner does
    not keep is refused before anything runs, naming the key and how to set it."""
    marker = running_box.owner.home / "hosted-ran"
    rule = "--model=anthropic=claude-sonnet-4-5;secret=anthropic-key"
    ran = running_box.run("--command=touch", rule, cmd=["touch", str(marker)])
    assert ran.returncode == EXIT_REFUSED, ran.stderr
    assert "'anthropic-key'" in ran.stderr and "lnk secret set anthropic-key" in ran.stderr
    assert "anthropic rule" in ran.stderr and "Traceback" not in ran.stderr
    assert not marker.exists()


def test_a_vllm_rules_key_is_forced_scrubbed_and_refused_once_removed(
    running_box: RunningBox, runtime: OllamaShaped
) -> None:
    key = "sk-" + secrets.token_urlsafe(30)
    kept = running_box.as_owner("secret", "set", "vllm-key", input=key + "\n")
    assert kept.returncode == 0, kept.stderr
    url = '"$OPENAI_BASE_URL/chat/completions"'
    call = f"{CURL} -H 'Authorization: Bearer own-key' -w ' %{{http_code}}\\n' {url} -d "
    call += shlex.quote('{"model": "m1"}')
    script = f"{call}; read go; {call}"
    rule = f"--model=vllm=m1;upstream=http://127.0.0.1:{runtime.port};secret=vllm-key"
    argv = as_user(
        running_box.owner.uid,
        running_box.owner.gid,
        LNK,
        *("sandbox", "run", "--yes", "--command=curl", rule, "--", "/bin/sh", "-c", script),
    )
    before = len(runtime.seen())
    removed = None
    with subprocess.Popen(
        argv,
        env=running_box.owner_env(),
        cwd=str(running_box.owner.home),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as sandbox:
        try:
            assert sandbox.stdout is not None
            first = sandbox.stdout.readline()
            assert first.endswith(" 200\n"), first
            arrived = runtime.seen()[before:]
            removed = running_box.as_owner("secret", "remove", "vllm-key")
            out, err = sandbox.communicate("go\n", timeout=90)
        finally:
            if sandbox.poll() is None:
                sandbox.kill()
                sandbox.wait()
    assert removed is not None and removed.returncode == 0, removed
    # The runtime got the rule's key, never the client's; the sandbox saw it scrubbed.
    assert [s.headers.get("authorization") for s in arrived] == [f"Bearer {key}"]
    assert '"authorization_seen": "Bearer <secret>"' in first
    assert key not in first + out + err
    # Removed while it ran: its next request is refused, and nothing more arrives.
    assert "lnk: refused (model-secret-gone)" in out and out.endswith(" 403\n"), out
    assert len(runtime.seen()) == before + 1


MAX_VALUES = 2**20  # lnk_proxy.strict_json.MAX_VALUES
HUGE_BODIES = {
    "values": b'{"model":"llama3.2:3b","x":[' + b",".join([b"0"] * MAX_VALUES) + b"]}",
    "depth": b'{"model":"llama3.2:3b","x":' + b"[" * 10**6 + b"]" * 10**6 + b"}",
}
HUGE_BODY_S = 30.0  # the whole run: a sandbox start and one 2 MB request on a loaded machine


@pytest.mark.parametrize("kind", sorted(HUGE_BODIES))
def test_a_body_of_millions_of_values_or_brackets_is_refused_and_nothing_arrives(
    running_box: RunningBox, runtime: OllamaShaped, kind: str
) -> None:
    before, accepted = len(runtime.seen()), runtime.accepted()
    send = f"{CURL} {DIRECT} -w ' %{{http_code}}\\n' --data-binary @- {INSIDE}/api/generate"
    started = time.monotonic()
    ran = subprocess.run(
        _argv(running_box, runtime, send),
        env=running_box.owner_env(),
        cwd=str(running_box.owner.home),
        input=HUGE_BODIES[kind],
        capture_output=True,
        timeout=120,
        check=False,
    )
    took = time.monotonic() - started
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.decode() == "lnk: refused (model-body)\n 403\n"
    assert took < HUGE_BODY_S, took
    assert runtime.seen()[before:] == []
    assert runtime.accepted() == accepted


def test_a_listing_inside_the_sandbox_shows_only_the_models_the_rule_allows(
    running_box: RunningBox,
) -> None:
    held = ("llama3.2:3b", "llama3.1:8b", "qwen2.5:7b")
    with OllamaShaped(models=held) as three:
        rule = f"--model=ollama=llama3.2:3b;upstream=http://127.0.0.1:{three.port}"
        script = "; ".join(
            f'{CURL} "$OLLAMA_HOST{path}"; echo' for path in ("/api/tags", "/api/ps", "/v1/models")
        )
        argv = ["sandbox", "run", "--yes", "--command=curl", rule, "--", "/bin/sh", "-c", script]
        ran = running_box.as_owner(*argv)
        arrived = [(s.method, s.path) for s in three.seen()]
    assert ran.returncode == 0, ran.stderr
    tags, ps, models = (json.loads(line) for line in ran.stdout.splitlines())
    only = {"name": "llama3.2:3b", "model": "llama3.2:3b"}
    assert tags == ps == {"models": [only]}, ran.stdout
    assert models == {"object": "list", "data": [{"id": "llama3.2:3b"}]}, ran.stdout
    assert arrived == [("GET", "/api/tags"), ("GET", "/api/ps"), ("GET", "/v1/models")]
