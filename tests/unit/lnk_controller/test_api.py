"""The controller's API, served by real uvicorn on a real unix socket with the kernel's peer
credentials: an error a route raises reaches the client as the same class with its exit
statuses (an agent name the box refuses is a usage error, exit 2), and a sandbox that is not
the caller's is the same 404 as none."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI

from lnk_controller.agents import AgentRegistry
from lnk_controller.api import make_app
from lnk_controller.config import ControllerConfig
from lnk_controller.db import open_database
from lnk_controller.remembered import RememberedSpecs
from lnk_controller.sandbox_store import SandboxStore
from lnk_shared.api_client import api_request, refused_answer
from lnk_shared.errors import UsageError


@pytest.fixture
def socket_path(tmp_path: Path, serve_api: Callable[[FastAPI], Path]) -> Iterator[Path]:
    engine = open_database(tmp_path / "state" / "controller.db")
    cfg = ControllerConfig(run_dir=tmp_path / "run", state_dir=tmp_path / "state")
    agents = AgentRegistry(engine, tmp_path / "keys")
    try:
        yield serve_api(make_app(cfg, SandboxStore(engine), RememberedSpecs(engine), agents))
    finally:
        engine.dispose()


def test_a_routes_error_arrives_as_its_class_with_its_statuses(socket_path: Path) -> None:
    status, doc = api_request(socket_path, "POST", "/v1/agents", {"name": "Bad!", "spec": "/s"})
    assert status == 422
    assert doc["error"] == ["UsageError", "LnkError"] and (doc["exit"], doc["run_exit"]) == (2, 125)
    heard = refused_answer(status, doc)
    assert type(heard) is UsageError and "agent name 'Bad!'" in str(heard)


def test_an_unknown_sandbox_is_a_404_without_an_error_class(socket_path: Path) -> None:
    status, doc = api_request(socket_path, "GET", "/v1/sandboxes/sbx-nope")
    assert (status, doc) == (404, {"detail": "no such sandbox"})
