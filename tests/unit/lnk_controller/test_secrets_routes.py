"""The secrets' routes of the controller's API, served by real uvicorn on a real unix socket
with the kernel's peer credentials: an owner sets, lists and removes its own; a malformed or
oversized body is refused without quoting it; a sandbox's uid keeps no secrets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from sqlalchemy import Engine

from lnk_controller.api import make_app
from lnk_controller.config import ControllerConfig
from lnk_controller.db import open_database
from lnk_controller.remembered import RememberedSpecs
from lnk_controller.sandbox_store import SandboxStore
from lnk_controller.secret_store import SecretStore, load_box_key
from lnk_controller.secrets_api import MAX_BODY_BYTES
from lnk_shared.api_client import UnixHTTPConnection, api_request

VALUE = "1234567890:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"
SANDBOX_UID = 2_000_000_123  # inside the config's default range of sandbox uids


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    engine = open_database(tmp_path / "state" / "controller.db")
    yield engine
    engine.dispose()


@pytest.fixture
def socket_path(
    tmp_path: Path, engine: Engine, serve_api: Callable[[FastAPI], Path]
) -> Iterator[Path]:
    cfg = ControllerConfig(run_dir=tmp_path / "run", state_dir=tmp_path / "state")
    store = SecretStore(engine, load_box_key(tmp_path / "secrets.key"))
    yield serve_api(make_app(cfg, SandboxStore(engine), RememberedSpecs(engine), secrets=store))


def _raw_put(path: Path, body: bytes) -> tuple[int, str]:
    conn = UnixHTTPConnection(path)
    try:
        conn.request("PUT", "/v1/secrets/bot", body=body)
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


def test_an_owner_sets_lists_and_removes_its_secret(socket_path: Path) -> None:
    status, doc = api_request(socket_path, "PUT", "/v1/secrets/bot", {"value": VALUE})
    assert (status, doc) == (200, {"name": "bot", "new": True})
    status, doc = api_request(socket_path, "GET", "/v1/secrets")
    assert status == 200 and [d["name"] for d in doc] == ["bot"]
    assert VALUE not in json.dumps(doc)
    assert api_request(socket_path, "DELETE", "/v1/secrets/bot")[0] == 200
    status, doc = api_request(socket_path, "DELETE", "/v1/secrets/bot")
    assert status == 404 and "no secret named" in doc["detail"]


@pytest.mark.parametrize(
    "body",
    [
        f"value={VALUE}".encode(),
        json.dumps({"value": VALUE, "also": VALUE}).encode(),
        json.dumps({"value": VALUE + "\r\nX-Planted: 1"}).encode(),
        json.dumps({"value": [VALUE]}).encode(),
    ],
)
def test_a_malformed_body_is_refused_without_quoting_it(socket_path: Path, body: bytes) -> None:
    status, text = _raw_put(socket_path, body)
    assert status == 422
    assert VALUE not in text and "AAHdq" not in text
    assert api_request(socket_path, "GET", "/v1/secrets")[1] == []


def test_an_oversized_body_is_refused_before_it_is_read_whole(socket_path: Path) -> None:
    status, text = _raw_put(socket_path, b'{"value": "' + b"A" * MAX_BODY_BYTES + b'"}')
    assert status == 413 and "AAAA" not in text


@pytest.mark.needs_root
def test_a_sandboxs_uid_keeps_no_secrets(socket_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to call as a sandbox's uid")
    code = (
        "import sys; from pathlib import Path; from lnk_shared.api_client import api_request; "
        "print(api_request(Path(sys.argv[1]), 'PUT', '/v1/secrets/bot', {'value': 'x'})[0])"
    )
    argv = [f"--reuid={SANDBOX_UID}", f"--regid={SANDBOX_UID}", "--clear-groups"]
    done = subprocess.run(
        ["/usr/bin/setpriv", *argv, sys.executable, "-c", code, str(socket_path)],
        capture_output=True,
        text=True,
        check=False,
        env={"PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.stdout.strip() == "403", done.stderr
    assert api_request(socket_path, "GET", "/v1/secrets")[1] == []
