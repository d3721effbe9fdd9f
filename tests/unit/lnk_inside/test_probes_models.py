"""The model probes' steps against a stand-in proxy on loopback (a real socket): the body is sent
whole in the proxy's request form and a 403 reads as stopped, any other answer as through; a
listing's answer comes back as data for the judge outside; no proxy is said, never guessed."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator

import pytest

from lnk_inside.probes import run_step
from lnk_inside.probes_models import make_body, make_nesting_bodies

LISTING = b'{"models":[{"name":"allowed:1b"},{"name":"bait:7b"}]}'


class StandIn:
    """A one-connection-at-a-time proxy: answers `status` with `body`, keeps what it read."""

    def __init__(self, status: bytes, body: bytes) -> None:
        self.status, self.body = status, body
        self.requests: list[bytes] = []
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(0.05)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.done.is_set():
            try:
                conn, _ = self.server.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(5)
                self.requests.append(self._read(conn))
                head = b"HTTP/1.1 %s\r\nContent-Length: %d\r\n\r\n" % (self.status, len(self.body))
                conn.sendall(head + self.body)

    @staticmethod
    def _read(conn: socket.socket) -> bytes:
        data = b""
        while b"\r\n\r\n" not in data:
            data += conn.recv(65536)
        head, _, body = data.partition(b"\r\n\r\n")
        length = next(
            (
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            ),
            0,
        )
        while len(body) < length:
            body += conn.recv(65536)
        return head + b"\r\n\r\n" + body

    def close(self) -> None:
        self.done.set()
        self.thread.join(5)
        self.server.close()


@pytest.fixture
def stand_in(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[StandIn]:
    status, body = request.param
    proxy = StandIn(status, body)
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.server.getsockname()[1]}")
    yield proxy
    proxy.close()


BODY_STEP = {
    "kind": "model_body",
    "target": "localhost:11434",
    "path": "/api/chat",
    "shape": "wide",
    "count": 5,
    "model": "not-a-model",
    "pad": 3,
}


@pytest.mark.parametrize(
    "stand_in", [(b"403 Forbidden", b"lnk: refused (model-body)\n")], indirect=True
)
def test_a_refused_body_is_stopped_and_was_sent_whole_in_the_proxys_form(stand_in: StandIn) -> None:
    result = run_step(BODY_STEP)
    assert result["outcome"] == "stopped"
    assert result["detail"].startswith("403 lnk: refused (model-body)")
    (request,) = stand_in.requests
    head, _, body = request.partition(b"\r\n\r\n")
    assert head.startswith(b"POST http://localhost:11434/api/chat HTTP/1.1\r\n")
    assert body == make_body("wide", 5, "not-a-model", 3)
    assert json.loads(body)["messages"] == [0, 0, 0, 0, 0]


@pytest.mark.parametrize("stand_in", [(b"200 OK", b"{}")], indirect=True)
def test_a_body_answered_otherwise_got_through(stand_in: StandIn) -> None:
    result = run_step(BODY_STEP)
    assert result["outcome"] == "through"
    assert result["data"] == "200"


@pytest.mark.parametrize("stand_in", [(b"200 OK", LISTING)], indirect=True)
def test_a_listing_comes_back_whole_for_the_judge_outside(stand_in: StandIn) -> None:
    result = run_step({"kind": "model_listing", "target": "localhost:11434", "path": "/api/tags"})
    assert result["outcome"] == "through"
    assert json.loads(result["data"]) == json.loads(LISTING)
    (request,) = stand_in.requests
    assert request.startswith(b"GET http://localhost:11434/api/tags HTTP/1.1\r\n")


def test_without_a_proxy_nothing_is_sent_and_it_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HTTP_PROXY", raising=False)
    result = run_step(BODY_STEP)
    assert result["outcome"] == "stopped"
    assert "HTTP_PROXY unset" in result["detail"]


def test_make_nesting_bodies_is_json_of_those_shapes() -> None:
    deep, flat = make_nesting_bodies(2, 3, 1, "m")
    assert deep == b'{"model":"m","messages":[{"a":1e400,"a":1},[[[]]],[[[]]]]}'
    assert flat == b'{"model":"m","messages":[{"a":1e400,"a":1},[],[],[],[]]}'
    for bad in ((0, 3, 1), (2, 3, 3), (2, 3, 0), (10**6, 997, 9)):
        with pytest.raises(ValueError):
            make_nesting_bodies(*bad, "m")


NESTING_STEP = {
    "kind": "model_nesting",
    "target": "localhost:11434",
    "path": "/api/chat",
    "runs": 2,
    "depth": 3,
    "flat": 1,
    "repeats": 3,
    "model": "not-a-model",
}


@pytest.mark.parametrize("stand_in", [(b"403 Forbidden", b"lnk: refused\n")], indirect=True)
def test_the_nesting_step_times_both_bodies_interleaved_for_the_judge(stand_in: StandIn) -> None:
    result = run_step(NESTING_STEP)
    assert result["outcome"] == "stopped"
    assert sorted(result["data"]) == ["deep", "flat"]
    assert all(len(t) == 3 and min(t) >= 0 for t in result["data"].values())
    deep, flat = make_nesting_bodies(2, 3, 1, "not-a-model")
    sent = [r.partition(b"\r\n\r\n")[2] for r in stand_in.requests]
    assert sent == [deep, flat, flat, deep, deep, flat]


@pytest.mark.parametrize("stand_in", [(b"200 OK", b"{}")], indirect=True)
def test_a_nesting_body_answered_otherwise_got_through(stand_in: StandIn) -> None:
    assert run_step(NESTING_STEP)["outcome"] == "through"
