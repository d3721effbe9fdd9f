"""Which of the bridge's open sockets are stale: those no live sandbox's record names; and when
the reconcile runs: at its start, when the bridge's admin socket is made again, on a timer only
while the bridge does not answer or its folder cannot be watched, never every second at rest."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from lnk_controller import bridge_reconcile
from lnk_controller.bridge_reconcile import stale_agents
from lnk_controller.cleanup import BRIDGE_RECORD
from lnk_controller.models import SandboxRow
from lnk_shared.errors import StateError
from lnk_shared.waking_event import WakingEvent

WAIT_S = 5.0  # the bound of a hung test: each wake here is at once


def _row(*targets: str) -> SandboxRow:
    return SandboxRow(id="sbx-1", mounts_json=json.dumps(list(targets)))


@pytest.mark.parametrize(
    ("open_now", "rows", "stale"),
    [
        ([], [], []),
        (["u1-a"], [], ["u1-a"]),  # stopped while the bridge was down: no record has it
        (["u1-a"], [_row(f"{BRIDGE_RECORD}u1-a")], []),  # running (or being started)
        (["u1-a", "u1-b"], [_row("/staged/x", f"{BRIDGE_RECORD}u1-b")], ["u1-a"]),
        (["u1-a"], [_row("/run/lnk/bridge-store/agents/u1-a/bridge.sock")], ["u1-a"]),
        (["u1-ab"], [_row(f"{BRIDGE_RECORD}u1-a")], ["u1-ab"]),  # a prefix is not a name
    ],
)
def test_stale_agents(open_now: list[str], rows: list[SandboxRow], stale: list[str]) -> None:
    assert stale_agents(open_now, rows) == stale


# --- when it runs: at its start, then when the bridge's admin socket is made again ---


class _Rounds:
    """A stand-in for reconcile_bridge: counts its calls, failing the first `failing`."""

    def __init__(self, failing: int = 0) -> None:
        self.calls, self.failing = 0, failing
        self.called = threading.Event()

    def __call__(self, _cfg: Any, _store: Any) -> list[str]:
        self.calls += 1
        self.called.set()
        if self.calls <= self.failing:
            raise StateError("the store bridge does not answer")
        return []


def _run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rounds: _Rounds
) -> tuple[WakingEvent, threading.Thread, Path]:
    monkeypatch.setattr(bridge_reconcile, "reconcile_bridge", rounds)
    folder = tmp_path / "bridge-store"
    folder.mkdir()
    stop = WakingEvent()
    cfg = SimpleNamespace(run_dir=tmp_path)
    body = bridge_reconcile.reconcile_every(cfg, None)  # type: ignore[arg-type]
    thread = threading.Thread(target=body, args=(stop,), daemon=True)
    thread.start()
    assert rounds.called.wait(WAIT_S), "no reconcile at its start"
    return stop, thread, folder


def _stopped(stop: WakingEvent, thread: threading.Thread) -> float:
    t0 = time.monotonic()
    stop.set()
    thread.join(WAIT_S)
    stop.close()
    assert not thread.is_alive()
    return time.monotonic() - t0


def test_at_rest_the_bridge_is_not_asked_every_second(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rounds = _Rounds()
    stop, thread, _folder = _run(tmp_path, monkeypatch, rounds)
    try:
        time.sleep(2.5 * bridge_reconcile.BRIDGE_RECONCILE_S)  # two rounds of the old timer
        assert rounds.calls == 1, f"asked {rounds.calls} times at rest"
    finally:
        took = _stopped(stop, thread)
    assert took < 1.0, f"it took {took:.2f} s to stop"


def test_a_bridge_started_again_is_reconciled_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rounds = _Rounds()
    stop, thread, folder = _run(tmp_path, monkeypatch, rounds)
    try:
        rounds.called.clear()
        (folder / "other.sock").touch()  # another name: not the bridge's start
        time.sleep(0.2)
        assert rounds.calls == 1
        with socket.socket(socket.AF_UNIX) as sock:  # the bridge binds its admin socket
            sock.bind(str(folder / "admin.sock"))
            assert rounds.called.wait(WAIT_S)
            t0 = time.monotonic()
        assert rounds.calls == 2 and time.monotonic() - t0 < 1.0
    finally:
        _stopped(stop, thread)


def test_a_bridge_that_does_not_answer_is_asked_again_until_it_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bridge_reconcile, "BRIDGE_RECONCILE_S", 0.05)
    rounds = _Rounds(failing=3)
    stop, thread, _folder = _run(tmp_path, monkeypatch, rounds)
    try:
        deadline = time.monotonic() + WAIT_S
        while rounds.calls < 4:
            assert time.monotonic() < deadline, f"asked only {rounds.calls} times"
            time.sleep(0.02)
        time.sleep(0.3)  # answered: at rest again
        assert rounds.calls == 4
    finally:
        _stopped(stop, thread)


def test_with_its_folder_gone_it_asks_on_the_timer_and_watches_again_when_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bridge_reconcile, "BRIDGE_RECONCILE_S", 0.05)
    rounds = _Rounds()
    stop, thread, folder = _run(tmp_path, monkeypatch, rounds)
    try:
        folder.rmdir()  # the watch ends: every round asks
        deadline = time.monotonic() + WAIT_S
        while rounds.calls < 3:
            assert time.monotonic() < deadline, "not asked on the timer without a watch"
            time.sleep(0.02)
        folder.mkdir()
        time.sleep(0.3)  # armed again, asked once more, then at rest
        settled = rounds.calls
        time.sleep(0.3)
        assert rounds.calls == settled
    finally:
        _stopped(stop, thread)
