"""A model runtime of Ollama's shape on this machine's loopback, for the tests: it answers every
route of Ollama's table (SERVICES.md, `server/routes.go`), the inference ones as Ollama does
and every admin one with success (so a route let through shows as done), and records what
reached it: each accepted connection and each request (method, path, headers, body).

Like Ollama, it refuses (403) a request whose `Host` is not this machine's (`127.0.0.1:PORT`,
`localhost:PORT`). `/api/chat` with `"stream": true` answers NDJSON chunk by chunk: the first
chunk at once, the rest only after `release()` (a test that reads the first chunk before it
releases the rest has seen the stream come through as it came)."""

from __future__ import annotations

import json
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["ADMIN_ROUTES", "OllamaShaped", "Seen"]

# Ollama's routes that change the runtime, its store or its account, or fetch for the caller.
ADMIN_ROUTES = (
    ("POST", "/api/pull"),
    ("POST", "/api/push"),
    ("POST", "/api/create"),
    ("POST", "/api/copy"),
    ("DELETE", "/api/delete"),
    ("HEAD", "/api/blobs/sha256:0"),
    ("POST", "/api/blobs/sha256:0"),
    ("POST", "/api/me"),
    ("POST", "/api/signout"),
    ("GET", "/api/user/keys"),
    ("POST", "/api/experimental/web_search"),
    ("POST", "/api/experimental/web_fetch"),
    ("GET", "/debug/pprof/heap"),
)
RELEASE_TIMEOUT_S = 60.0  # a stream left waiting ends by then, released or not


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class _State:
    port: int = 0
    models: tuple[str, ...] = ()
    seen: list[Seen] = field(default_factory=list)
    accepted: int = 0
    released: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state: _State  # set on the subclass made per server

    def log_message(self, format: str, *args: Any) -> None:
        return

    def _record(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        with self.state.lock:
            self.state.seen.append(
                Seen(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body)
            )
        return body

    def _json(self, value: object, status: int = 200) -> None:
        data = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _host_ok(self) -> bool:
        host = self.headers.get("Host", "")
        return host in (f"127.0.0.1:{self.state.port}", f"localhost:{self.state.port}")

    def _serve(self) -> None:
        body = self._record()
        if not self._host_ok():
            self._json({"error": "host not allowed"}, 403)
            return
        path = self.path
        if path == "/":
            self._json("Ollama is running")
        elif path == "/api/version":
            self._json({"version": "0.12.0"})
        elif path in ("/api/tags", "/api/ps"):  # held, and loaded: all of them here
            self._json({"models": [{"name": m, "model": m} for m in self.state.models]})
        elif path == "/v1/models":
            self._json({"object": "list", "data": [{"id": m} for m in self.state.models]})
        elif path in ("/api/chat", "/api/generate", "/api/show", "/api/embed"):
            request = json.loads(body or b"{}")
            if path == "/api/chat" and request.get("stream"):
                self._stream(request)
            else:
                self._json({"model": request.get("model"), "done": True, "echo": request})
        elif path.startswith("/v1/"):  # OpenAI-shaped; it echoes the key it got, as a careless
            # runtime might in an error (the proxy must scrub it from the answer)
            auth = self.headers.get("Authorization", "")
            self._json({"object": "chat.completion", "authorization_seen": auth})
        else:  # an admin route: done, as Ollama would (the test asserts none arrives)
            self._json({"status": "success"})

    def _stream(self, request: dict[str, Any]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for index, last in ((0, False), (1, True)):
            line = json.dumps({"model": request.get("model"), "n": index, "done": last}) + "\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line.encode()))
            self.wfile.flush()
            if not last:
                self.state.released.wait(RELEASE_TIMEOUT_S)
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    do_GET = do_POST = do_DELETE = do_HEAD = do_PUT = _serve  # noqa: N815 - the base's names


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    state: _State

    def get_request(self) -> tuple[socket.socket, Any]:
        accepted = super().get_request()
        with self.state.lock:
            self.state.accepted += 1
        return accepted


class OllamaShaped:
    """`with OllamaShaped(models) as runtime:` serving on 127.0.0.1:`runtime.port`."""

    def __init__(self, models: tuple[str, ...] = ("llama3.2:3b",)) -> None:
        self._state = _State(models=models)
        handler = type("Handler", (_Handler,), {"state": self._state})
        self._server = _Server(("127.0.0.1", 0), handler)
        self._server.state = self._state
        self._state.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return self._state.port

    def seen(self) -> list[Seen]:
        with self._state.lock:
            return list(self._state.seen)

    def accepted(self) -> int:
        with self._state.lock:
            return self._state.accepted

    def release(self) -> None:
        self._state.released.set()

    def __enter__(self) -> OllamaShaped:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._state.released.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
