"""One host of the test internet: a small HTTP/1.1 server, run by `net.py` inside a network
namespace (`ip netns exec NS python -I net_server.py CONFIG.json`), never imported by a test.

It logs every accepted TCP connection (before any TLS handshake, so a refused client's bare
connect counts too) as a JSON line to the config's `log`, and the same line to `<log>.ended`
when that connection ends, then prints `ready` once every port is bound. It dies with the
process that started it (`PR_SET_PDEATHSIG`).

Answers, on every port (plain on `http`, TLS on `https`), with keep-alive:
- `GET /`: the host's name and a newline;
- `GET /big?bytes=N`: N zero bytes, streamed;
- `GET /headers`: the request head exactly as it arrived (to check what a proxy forwarded);
- `GET /redirect?to=URL`: a 302 to URL;
- `GET /simple/`, `/simple/lnk-demo/`, `/packages/WHEEL`: a PEP 503 package index holding one
  pure-Python wheel, `lnk-demo` 1.0 (built in memory at start), for pip from a sandbox;
- `GET|POST /bot<TOKEN>/<METHOD>` (the Bot API's shape): `{"ok": true, "result": {"method":
  METHOD, "token": TOKEN, "body": BODY}}` (the token echoed, so a test sees a proxy scrub it);
  every such request, and every `Authorization` header, is recorded as a JSON line
  (`{"method", "path", "authorization"}`) in `<log>.requests`: the upstream's own record of
  what arrived;
- `/v1/...`: the hosted model APIs of `net_models.py` (an Anthropic-like and an OpenAI-like
  one, SSE streaming included), each request recorded in `<log>.models`;
- `POST` (any other path): the request body (Content-Length or chunked);
- anything else: 404.

Security limitations: none needed; it only ever listens inside a namespace the tests made.
"""

from __future__ import annotations

import asyncio
import base64
import ctypes
import hashlib
import importlib.util
import io
import json
import os
import signal
import ssl
import sys
import time
import zipfile
from contextlib import suppress
from typing import Any
from urllib.parse import parse_qs, urlsplit

PR_SET_PDEATHSIG = 1
HEAD_LIMIT = 64 * 1024  # bytes of request head; the tests' clients send far less
BODY_LIMIT = 64 * 1024 * 1024  # bytes of echoed body; enough for any upload test
CHUNK = 256 * 1024  # bytes per write of /big: large writes keep a Python server fast
ZEROS = bytes(CHUNK)
DEMO_PROJECT = "lnk-demo"
DEMO_WHEEL = "lnk_demo-1.0-py3-none-any.whl"
DEMO_MODULE = b'GREETING = "hello from the test internet"\n'


def _demo_wheel() -> bytes:
    """A minimal valid wheel: one module, METADATA, WHEEL and a RECORD with real hashes."""
    files = {
        "lnk_demo/__init__.py": DEMO_MODULE,
        "lnk_demo-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: lnk-demo\nVersion: 1.0\n",
        "lnk_demo-1.0.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: net_server\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = ""
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record += f"{name},sha256={digest},{len(data)}\n"
    files["lnk_demo-1.0.dist-info/RECORD"] = (record + "lnk_demo-1.0.dist-info/RECORD,,\n").encode()
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as wheel:
        for name, data in files.items():
            wheel.writestr(zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0)), data)
    return out.getvalue()


def _load_models() -> Any:
    """net_models.py beside this file (`python -I` puts no script folder on sys.path)."""
    spec = importlib.util.spec_from_file_location(
        "net_models", os.path.join(os.path.dirname(os.path.abspath(__file__)), "net_models.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MODELS = _load_models()
WHEEL_BYTES = _demo_wheel()
INDEX_PAGES = {
    "/simple/": f'<html><body><a href="/simple/{DEMO_PROJECT}/">{DEMO_PROJECT}</a></body></html>\n',
    f"/simple/{DEMO_PROJECT}/": (
        f'<html><body><a href="/packages/{DEMO_WHEEL}'
        f'#sha256={hashlib.sha256(WHEEL_BYTES).hexdigest()}">{DEMO_WHEEL}</a></body></html>\n'
    ),
}


def _die_with_parent(parent_pid: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        sys.exit(1)


class Host:
    def __init__(self, name: str, log_path: str) -> None:
        self.name = name
        self.log_path = log_path
        self.log = open(log_path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
        self.ended_log = open(log_path + ".ended", "a", buffering=1, encoding="utf-8")  # noqa: SIM115
        self.requests = open(log_path + ".requests", "a", buffering=1, encoding="utf-8")  # noqa: SIM115

    def accepted(self, writer: asyncio.StreamWriter, port: int, log: Any = None) -> None:
        peer = writer.get_extra_info("peername")
        line = {"time": time.time(), "peer": peer[0], "peer_port": peer[1], "port": port}
        (log or self.log).write(json.dumps(line) + "\n")

    async def serve(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        port: int,
        tls: ssl.SSLContext | None,
    ) -> None:
        self.accepted(writer, port)
        try:
            if tls is not None:
                await writer.start_tls(tls)
            while await self.one_request(reader, writer):
                pass
        except (OSError, ssl.SSLError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        except ValueError:  # a malformed request: answer once and close
            with suppress(Exception):
                writer.write(_response(400, b"bad request\n", close=True))
                await writer.drain()
        finally:
            writer.close()
            with suppress(Exception):
                await writer.wait_closed()
            self.accepted(writer, port, self.ended_log)

    async def one_request(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Answer one request; False when the connection should end."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as e:
            if e.partial:
                raise
            return False  # the client closed between requests
        lines = head.decode("latin-1").split("\r\n")
        method, target, version = lines[0].split(" ")
        headers = {}
        for line in lines[1:]:
            if line:
                key, _, value = line.partition(":")
                headers[key.strip().lower()] = value.strip()
        close = headers.get("connection", "").lower() == "close" or version == "HTTP/1.0"
        body = await _read_body(reader, headers)
        url = urlsplit(target)
        query = parse_qs(url.query)
        if url.path.startswith(("/bot", "/file/bot")) or "authorization" in headers:
            record = {
                "method": method,
                "path": target,
                "authorization": headers.get("authorization"),
            }
            self.requests.write(json.dumps(record) + "\n")
        if url.path.startswith("/v1/"):
            await self.model_api(writer, method, target, headers, body, close)
            return not close
        bot = url.path.split("/")
        if len(bot) == 3 and bot[1].startswith("bot") and method in ("GET", "POST"):
            result = {"method": bot[2], "token": bot[1][3:], "body": body.decode("latin-1")}
            answer = json.dumps({"ok": True, "result": result}).encode()
            kind = {"Content-Type": "application/json"}
            writer.write(_response(200, answer, close=close, extra=kind))
        elif method == "POST":
            writer.write(_response(200, body, close=close))
        elif method != "GET":
            writer.write(_response(405, b"method not allowed\n", close=close))
        elif url.path == "/":
            writer.write(_response(200, f"{self.name}\n".encode(), close=close))
        elif url.path == "/headers":
            writer.write(_response(200, head, close=close))
        elif url.path == "/redirect" and "to" in query:
            extra = {"Location": query["to"][0]}
            writer.write(_response(302, b"", close=close, extra=extra))
        elif url.path == "/big" and "bytes" in query:
            await _stream_zeros(writer, int(query["bytes"][0]), close)
        elif url.path in INDEX_PAGES:
            html = {"Content-Type": "text/html; charset=utf-8"}
            writer.write(_response(200, INDEX_PAGES[url.path].encode(), close=close, extra=html))
        elif url.path == f"/packages/{DEMO_WHEEL}":
            writer.write(_response(200, WHEEL_BYTES, close=close))
        else:
            writer.write(_response(404, b"not found\n", close=close))
        await writer.drain()
        return not close

    async def model_api(
        self,
        writer: asyncio.StreamWriter,
        method: str,
        target: str,
        headers: dict[str, str],
        body: bytes,
        close: bool,
    ) -> None:
        """A hosted model API's answer (`net_models`): JSON, or SSE events chunk by chunk."""
        MODELS.record(self.log_path, method, target, headers, body)
        status, answer, events = MODELS.answer(method, target, headers, body)
        json_type = {"Content-Type": "application/json"}
        if events is None:
            writer.write(
                _response(status, json.dumps(answer).encode(), close=close, extra=json_type)
            )
            await writer.drain()
            return
        lines = [f"HTTP/1.1 {status} OK", "Content-Type: text/event-stream"]
        lines += ["Transfer-Encoding: chunked", "Cache-Control: no-cache"]
        if close:
            lines.append("Connection: close")
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        if events:
            events = [MODELS.stamped(body, events[0]), *events[1:]]
        for index, event in enumerate(events):
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            await writer.drain()
            if index == 0:
                await MODELS.held(os.path.dirname(self.log_path), body)
        writer.write(b"0\r\n\r\n")
        await writer.drain()


async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    if headers.get("transfer-encoding", "").lower() == "chunked":
        parts: list[bytes] = []
        total = 0
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            total += size
            if total > BODY_LIMIT:
                raise ValueError("body too large")
            if size == 0:
                while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailers
                    pass
                return b"".join(parts)
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)
    length = int(headers.get("content-length", "0"))
    if not 0 <= length <= BODY_LIMIT:
        raise ValueError("bad content-length")
    return await reader.readexactly(length)


async def _stream_zeros(writer: asyncio.StreamWriter, count: int, close: bool) -> None:
    writer.write(_head(200, count, close=close, extra={}))
    view = memoryview(ZEROS)
    while count > 0:
        n = min(count, CHUNK)
        writer.write(view[:n])
        count -= n
        await writer.drain()


REASONS = {200: "OK", 302: "Found", 400: "Bad Request", 404: "Not Found", 405: "Not Allowed"}


def _head(status: int, length: int, *, close: bool, extra: dict[str, str]) -> bytes:
    lines = [f"HTTP/1.1 {status} {REASONS[status]}", f"Content-Length: {length}"]
    if "Content-Type" not in extra:
        lines.append("Content-Type: application/octet-stream")
    lines.extend(f"{k}: {v}" for k, v in extra.items())
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _response(
    status: int, body: bytes, *, close: bool, extra: dict[str, str] | None = None
) -> bytes:
    return _head(status, len(body), close=close, extra=extra or {}) + body


async def main(config: dict[str, Any]) -> None:
    host = Host(config["name"], config["log"])
    servers = []
    for port_text, tls_files in config["ports"].items():
        tls = None
        if tls_files is not None:
            tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            tls.load_cert_chain(tls_files["cert"], tls_files["key"])
        port = int(port_text)

        async def on_connect(
            r: asyncio.StreamReader,
            w: asyncio.StreamWriter,
            port: int = port,
            tls: ssl.SSLContext | None = tls,
        ) -> None:
            await host.serve(r, w, port, tls)

        servers.append(
            await asyncio.start_server(
                on_connect, config["address"], port, limit=HEAD_LIMIT, backlog=1024
            )
        )
    print("ready", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    for server in servers:
        server.close()


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as f:
        cfg = json.load(f)
    _die_with_parent(int(cfg["parent_pid"]))
    asyncio.run(main(cfg))
