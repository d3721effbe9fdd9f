"""The controller's keeper of proxy listeners: a proxy that does not answer (killed, not yet
restarted) is waited for, never the end of the keeper, so a restarted proxy gets every
running sandbox's listener back."""

from __future__ import annotations

import os
import threading
from typing import Any, cast

import pytest

from lnk_controller import proxy_link
from lnk_controller.config import ControllerConfig
from lnk_shared.errors import StateError

ROUNDS = 3


def test_the_keeper_outlives_a_proxy_that_does_not_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    stop = threading.Event()
    asked: list[str] = []

    def down(_cfg: object, message: dict[str, Any], _fds: object = None) -> dict[str, Any]:
        asked.append(message["op"])
        if asked.count("list") >= ROUNDS:
            stop.set()
        raise StateError("the filtering proxy does not answer at /run/x (refused)")

    monkeypatch.setattr(proxy_link, "_call", down)
    monkeypatch.setattr(proxy_link, "KEEP_INTERVAL_S", 0.001)
    read, write = os.pipe()
    os.close(write)
    proxy_link.HELD.keep("sbx-keeper", read, {"op": "adopt"})
    try:
        proxy_link.keep_listeners(cast(ControllerConfig, None), stop)  # returns at `stop`
    finally:
        proxy_link.HELD.drop("sbx-keeper")
    # A round per "list" (the thread lived through each refusal); between them, the stand-in
    # that answers the listeners asks whether the proxy is back ("ping"), and nothing else.
    assert asked.count("list") == ROUNDS
    assert set(asked) == {"list", "ping"}
