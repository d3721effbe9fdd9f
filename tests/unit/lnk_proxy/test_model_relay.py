"""The server in-process with a model rule and a runtime of Ollama's shape on this machine's
loopback: an inference request reaches it (both ways a sandbox sends one: the relay's CONNECT
to the model port and a request through HTTP_PROXY), re-serialised, with the runtime's own
Host and no client credential; an admin route or a bad body is refused with nothing arriving;
an answer streams through chunk by chunk; the runtime's other ports stay closed."""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from lnk_proxy.config import ProxyConfig
from lnk_proxy.http_request import parse_request_head
from lnk_proxy.model_relay import ModelGrant, parse_models
from lnk_proxy.policy import ProxyGrants
from lnk_proxy.server import ProxyServer
from lnk_proxy.service_relay import ServiceGrant
from lnk_shared.spec import Origin
from lnk_shared.spec_models import ModelRule, parse_model_table

SECRET = "x" * 40
LISTED = ("llama3.2:3b", "llama3.1:8b", "qwen2.5:7b")  # what the runtime holds
TIMEOUT_S = 10.0


class _Runtime:
    """Answers every request with its path; `/api/chat` streams two chunks, the second only
    once `release` is set (so a client that sees the first saw it before the answer ended)."""

    def __init__(self) -> None:
        self.heads: list[bytes] = []
        self.bodies: list[bytes] = []
        self.release = asyncio.Event()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        self.heads.append(head)
        length = next(
            (
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            ),
            0,
        )
        self.bodies.append(await reader.readexactly(length))
        if b" /api/chat " in head:
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            first = b'{"done":false}\n'
            writer.write(b"%x\r\n%s\r\n" % (len(first), first))
            await writer.drain()
            await self.release.wait()
            last = b'{"done":true}\n'
            writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(last), last))
        elif b"GET /api/tags " in head:  # a listing of three models, chunked
            tags = json.dumps({"models": [{"name": m} for m in LISTED]}).encode()
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(tags), tags))
        elif b"GET /api/ps " in head:  # a listing the proxy cannot read
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\nllama3.1:8b!")
        else:
            body = b'{"path": "' + head.split(b" ")[1] + b'"}'
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()
        await writer.wait_closed()


@pytest.fixture
def base() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="lnkmod", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _rule(port: int) -> ModelRule:
    table = {"kind": "ollama", "models": ["llama3.2:3b"], "upstream": f"http://127.0.0.1:{port}"}
    return parse_model_table(table, Origin("t", "models"))


async def _served(
    base: Path, runtime: _Runtime, **unsafe: bool
) -> tuple[ProxyServer, Path, int, asyncio.Server]:
    upstream = await asyncio.start_server(runtime.handle, "127.0.0.1", 0)
    port = upstream.sockets[0].getsockname()[1]
    config = ProxyConfig(run_dir=base / "run", state_dir=base / "state", **unsafe)
    server = ProxyServer(config)
    await server.start()
    path = config.run_dir / "sbx" / "sbx-1.sock"
    models = ModelGrant([_rule(port)])
    await server.open_listener(
        "sbx-1", path, ProxyGrants(), SECRET, services=ServiceGrant(), models=models
    )
    return server, path, port, upstream


async def _send(path: Path, data: bytes) -> bytes:
    reader, writer = await asyncio.open_unix_connection(str(path))
    writer.write(data)
    answer = await asyncio.wait_for(reader.read(), TIMEOUT_S)
    writer.close()
    await writer.wait_closed()
    return answer


def _post(target: str, body: bytes, host: str = "127.0.0.1:11434", *extra: str) -> bytes:
    lines = [f"POST {target} HTTP/1.1", f"Host: {host}", f"Content-Length: {len(body)}", *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def test_inference_reaches_the_runtime_both_ways_and_admin_never_does(base: Path) -> None:
    runtime = _Runtime()

    async def run() -> list[bytes]:
        server, path, port, upstream = await _served(base, runtime)
        try:
            body = b'{ "model": "llama3.2:3b", "prompt": "hi" }'
            tunneled = b"CONNECT localhost:11434 HTTP/1.1\r\nHost: localhost:11434\r\n\r\n"
            answers = [
                await _send(path, tunneled + _post("/api/generate", body, "x", "Authorization: k")),
                await _send(path, _post("http://127.0.0.1:11434/api/generate", body)),
                await _send(path, tunneled + _post("/api/pull", b'{"model": "llama3.2:3b"}')),
                await _send(path, _post("http://127.0.0.1:11434/api/delete", b"{}")),
                await _send(path, tunneled + _post("/api/generate", b'{"model": "other:1b"}')),
                await _send(
                    path, _post(f"http://127.0.0.1:{port}/api/tags", b"", f"127.0.0.1:{port}")
                ),
                await _send(path, f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n".encode()),
            ]
        finally:
            await server.close()
            upstream.close()
            await upstream.wait_closed()
        return answers

    answers = asyncio.run(run())
    assert answers[0].startswith(b"HTTP/1.1 200 Connection Established\r\n\r\nHTTP/1.1 200 OK")
    assert answers[0].endswith(b'{"path": "/api/generate"}')
    assert answers[1].startswith(b"HTTP/1.1 200 OK") and b'"/api/generate"' in answers[1]
    assert answers[2].endswith(b"lnk: refused (model-admin)\n")
    assert answers[3].endswith(b"lnk: refused (model-admin)\n")
    assert answers[4].endswith(b"lnk: refused (model-not-allowed)\n")
    assert answers[5].endswith(b"lnk: refused (never-loopback)\n")  # its own port: never
    assert answers[6].endswith(b"lnk: refused (never-loopback)\n")
    assert len(runtime.heads) == 2  # the two allowed; nothing else arrived
    for head in runtime.heads:
        assert head.startswith(b"POST /api/generate HTTP/1.1\r\nHost: 127.0.0.1:")
        assert b"Authorization" not in head
    assert runtime.bodies == [b'{"model":"llama3.2:3b","prompt":"hi"}'] * 2


def test_a_streamed_answer_comes_through_chunk_by_chunk(base: Path) -> None:
    runtime = _Runtime()

    async def run() -> tuple[bytes, bytes]:
        server, path, _, upstream = await _served(base, runtime)
        try:
            reader, writer = await asyncio.open_unix_connection(str(path))
            writer.write(_post("http://127.0.0.1:11434/api/chat", b'{"model":"llama3.2:3b"}'))
            first = await asyncio.wait_for(reader.readuntil(b'{"done":false}\n'), TIMEOUT_S)
            runtime.release.set()  # only now does the runtime send the rest
            rest = await asyncio.wait_for(reader.read(), TIMEOUT_S)
            writer.close()
            await writer.wait_closed()
        finally:
            await server.close()
            upstream.close()
            await upstream.wait_closed()
        return first, rest

    first, rest = asyncio.run(run())
    assert first.startswith(b"HTTP/1.1 200 OK") and b"Connection: close" in first
    assert rest == b'{"done":true}\n'
    assert json.loads(rest) == {"done": True}


def test_a_request_pipelined_behind_an_allowed_one_never_reaches_the_runtime(base: Path) -> None:
    runtime = _Runtime()

    async def run() -> bytes:
        server, path, _, upstream = await _served(base, runtime)
        try:
            tunneled = b"CONNECT localhost:11434 HTTP/1.1\r\nHost: localhost:11434\r\n\r\n"
            allowed = _post("/api/show", b'{"model":"llama3.2:3b"}')
            smuggled = _post("/api/pull", b'{"model":"llama3.2:3b"}')
            return await _send(path, tunneled + allowed + smuggled)
        finally:
            await server.close()
            upstream.close()
            await upstream.wait_closed()

    answer = asyncio.run(run())
    assert answer.endswith(b'{"path": "/api/show"}')  # one answer, then the connection ends
    assert [h.split(b" ")[1] for h in runtime.heads] == [b"/api/show"]


def test_a_client_waiting_on_100_continue_is_told_to_go_on(base: Path) -> None:
    runtime = _Runtime()

    async def run() -> tuple[bytes, bytes]:
        server, path, _, upstream = await _served(base, runtime)
        try:
            reader, writer = await asyncio.open_unix_connection(str(path))
            body = b'{"model":"llama3.2:3b"}'
            head = _post(
                "http://127.0.0.1:11434/api/show", body, "127.0.0.1:11434", "Expect: 100-continue"
            )
            writer.write(head[: -len(body)])  # the head alone: the body waits for the 100
            interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), TIMEOUT_S)
            writer.write(body)
            rest = await asyncio.wait_for(reader.read(), TIMEOUT_S)
            writer.close()
            await writer.wait_closed()
        finally:
            await server.close()
            upstream.close()
            await upstream.wait_closed()
        return interim, rest

    interim, rest = asyncio.run(run())
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    assert rest.endswith(b'{"path": "/api/show"}')


@pytest.mark.parametrize(
    ("target", "served"),
    [
        ("CONNECT localhost:11434 HTTP/1.1\r\nHost: localhost:11434", True),
        ("CONNECT LOCALHOST.:11434 HTTP/1.1\r\nHost: LOCALHOST.:11434", True),
        ("CONNECT [::1]:11434 HTTP/1.1\r\nHost: [::1]:11434", True),
        ("GET http://127.0.0.1:11434/api/tags HTTP/1.1\r\nHost: 127.0.0.1:11434", True),
        ("CONNECT localhost:11435 HTTP/1.1\r\nHost: localhost:11435", False),
        ("CONNECT 127.0.0.2:11434 HTTP/1.1\r\nHost: 127.0.0.2:11434", False),  # never a model's
        ("CONNECT ollama.example:11434 HTTP/1.1\r\nHost: ollama.example:11434", False),
    ],
)
def test_a_request_is_a_model_rules_only_on_the_sandboxs_loopback_at_its_port(
    target: str, served: bool
) -> None:
    request = parse_request_head(f"{target}\r\n\r\n".encode())
    assert (ModelGrant([_rule(1234)]).rule_for(request) is not None) is served


def test_the_admin_frames_rules_are_read_by_the_spec_models_own_rules() -> None:
    rule = _rule(1234)
    assert parse_models([rule.canonical()]) == (rule,)
    with pytest.raises(ValueError, match="two rules on one port"):
        parse_models([rule.canonical(), rule.canonical()])
    with pytest.raises(ValueError, match="models is empty"):
        parse_models([{**rule.canonical(), "models": []}])
    with pytest.raises(ValueError, match="at most"):
        parse_models({"kind": "ollama"})


@pytest.mark.parametrize("answer", ["127.0.0.1", "::ffff:127.0.0.1", "0.0.0.0", "8.8.8.8"])
def test_a_network_upstream_named_to_resolve_here_or_public_is_never_dialed(
    base: Path, answer: str
) -> None:
    """A rule naming its runtime by a name (gpu.lan) is a `[lan]` grant of exactly it: a name
    that resolves to this machine (another of its ports) or to a public address reaches
    nothing, whatever the rule's port."""
    runtime = _Runtime()

    async def run() -> bytes:
        upstream = await asyncio.start_server(runtime.handle, "127.0.0.1", 0)
        port = upstream.sockets[0].getsockname()[1]
        table = base / "dns.json"
        table.write_text(json.dumps({"gpu.lan": [answer]}))
        config = ProxyConfig(run_dir=base / "run", state_dir=base / "state", unsafe_dns_table=table)
        server = ProxyServer(config)
        await server.start()
        path = config.run_dir / "sbx" / "sbx-1.sock"
        rule = parse_model_table(
            {"kind": "ollama", "models": ["llama3.2:3b"], "upstream": f"http://gpu.lan:{port}"},
            Origin("t", "models"),
        )
        assert not rule.on_this_machine
        await server.open_listener(
            "sbx-1", path, ProxyGrants(), SECRET, services=ServiceGrant(), models=ModelGrant([rule])
        )
        try:
            return await _send(
                path, _post("http://127.0.0.1:11434/api/show", b'{"model":"llama3.2:3b"}')
            )
        finally:
            await server.close()
            upstream.close()
            await upstream.wait_closed()

    answer_bytes = asyncio.run(run())
    assert answer_bytes.startswith(b"HTTP/1.1 403 Forbidden"), answer_bytes
    assert runtime.heads == []


def test_a_listing_shows_only_the_rules_models_and_an_unreadable_one_is_a_502(base: Path) -> None:
    runtime = _Runtime()

    def get(path: str) -> bytes:
        return (
            f"GET http://127.0.0.1:11434{path} HTTP/1.1\r\nHost: 127.0.0.1:11434\r\n\r\n".encode()
        )

    async def run() -> list[bytes]:
        server, path, _, upstream = await _served(base, runtime)
        try:
            return [await _send(path, get("/api/tags")), await _send(path, get("/api/ps"))]
        finally:
            await server.close()
            upstream.close()
            await upstream.wait_closed()

    tags, ps = asyncio.run(run())
    head, _, body = tags.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK") and b"Connection: close" in head
    assert json.loads(body) == {"models": [{"name": "llama3.2:3b"}]}
    assert b"llama3.1" not in tags + ps and b"qwen" not in tags
    assert ps.startswith(b"HTTP/1.1 502 ")


@pytest.mark.parametrize("unsafe", [False, True])
def test_the_uncut_listings_switch_passes_the_runtimes_whole_listing(
    base: Path, unsafe: bool
) -> None:
    """`unsafe_uncut_model_listings` (tests of `lnk sandbox check` only) reopens exactly the
    class the cut closes: every model the runtime holds is named."""
    runtime = _Runtime()
    get = b"GET http://127.0.0.1:11434/api/tags HTTP/1.1\r\nHost: 127.0.0.1:11434\r\n\r\n"

    async def run() -> bytes:
        server, path, _, upstream = await _served(base, runtime, unsafe_uncut_model_listings=unsafe)
        try:
            return await _send(path, get)
        finally:
            await server.close()
            upstream.close()
            await upstream.wait_closed()

    tags = asyncio.run(run())
    assert tags.startswith(b"HTTP/1.1 200 OK")
    assert (b"qwen2.5:7b" in tags) is unsafe and b"llama3.2:3b" in tags


@pytest.mark.parametrize("unsafe", [False, True])
def test_the_unbounded_bodies_switch_gives_a_wide_body_to_the_parser(
    base: Path, unsafe: bool
) -> None:
    """A body of more values than the proxy parses, naming an allowed model: refused before any
    parse, nothing arriving; with `unsafe_unbounded_model_bodies` it is parsed and forwarded."""
    runtime = _Runtime()
    count = 2**20 + 1
    body = b'{"model":"llama3.2:3b","prompt":"x","options":{"stop":[' + b"0," * (count - 1)
    body += b"0]}}"

    async def run() -> bytes:
        server, path, _, upstream = await _served(
            base, runtime, unsafe_unbounded_model_bodies=unsafe
        )
        try:
            return await _send(path, _post("http://127.0.0.1:11434/api/generate", body))
        finally:
            await server.close()
            upstream.close()
            await upstream.wait_closed()

    answer = asyncio.run(run())
    if unsafe:
        assert answer.startswith(b"HTTP/1.1 200 OK"), answer[:200]
        assert len(runtime.bodies) == 1 and runtime.bodies[0].count(b"0") >= count
    else:
        assert answer.startswith(b"HTTP/1.1 403 Forbidden"), answer[:200]
        assert runtime.heads == []
