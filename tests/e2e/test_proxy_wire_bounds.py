"""The whole box's wire logs are bounded, and a running sandbox's exchanges are refused before
one goes unlogged: the proxy (as nobody, in a namespace of its own: `test_proxy_routes.Machine`)
with a small `wire_box_max_bytes`, whose wire folder already holds ended sandboxes' logs.

A refusal flood from the running sandbox (every target new: aggregation cannot fold them), then
allowed requests until the proxy refuses them (`log-full`): every allowed exchange that reached
the LAN host is in the log, and the folder's bytes on disk never pass the box's bound. Once an
ended sandbox's log is removed (as the controller's retention does, oldest ended first), the
sandbox's requests are admitted again. Before, only each sandbox's own log was bounded: the
folder grew past any box bound.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # pytest's importlib mode adds no test dir
from proxy_alone import ask, connect_request, get
from test_proxy_routes import SANDBOX, built

pytestmark = [pytest.mark.needs_root, pytest.mark.e2e]

BOX_BOUND = 512 * 1024  # the proxy's wire_box_max_bytes here
SANDBOX_BOUND = 4 * BOX_BOUND  # its wire_log_max_bytes: the box's bound is the one met
ENDED = {"sbx-ended-1": BOX_BOUND // 4, "sbx-ended-2": BOX_BOUND // 4}  # half the box
FLOOD = 2000  # refusals of about 200 bytes: 400 KB offered to the 128 KiB of refusal room left
ROOM_SEEN_S = 10.0  # the proxy reads the folder's size again within 1 s (BOX_SCAN_S)


def _on_disk(wire: Path) -> int:
    return sum(p.stat().st_size for p in wire.glob("*.log"))


def test_a_flood_keeps_the_box_bounded_and_refuses_before_anything_goes_unlogged() -> None:
    config = f"wire_log_max_bytes = {SANDBOX_BOUND}\nwire_box_max_bytes = {BOX_BOUND}\n"
    with built(skip_route_check=False, config=config) as made:
        wire = made.proxy.wire
        for sandbox, size in ENDED.items():  # before the first request: its admit scans
            (wire / f"{sandbox}.log").write_bytes(b'{"ended":1}\n' * (size // 12))
        for i in range(FLOOD):
            _, body = ask(made.socket, connect_request(f"h{i}.nowhere.test-lan.example:80"))
            assert body == b"lnk: refused (no-address)\n"
        assert _on_disk(wire) <= BOX_BOUND * 3 // 4  # refusals stop at their share
        before = len(made.accepted(made.lan))
        allowed = 0
        while True:
            head, body = ask(made.socket, get("nas.test-lan.example"))
            if not head.startswith(b"HTTP/1.1 200"):
                break
            allowed += 1
            assert allowed < FLOOD, "the box's bound was never met"
        assert body == b"lnk: refused (log-full)\n"
        assert allowed > 0
        assert len(made.accepted(made.lan)) - before == allowed  # the refused one went nowhere
        logged = [e for e in made.proxy.log(SANDBOX) if e["decision"] == "allowed"]
        assert len(logged) == allowed  # every exchange that went out is in the log
        assert _on_disk(wire) <= BOX_BOUND
        own = (wire / f"{SANDBOX}.log").stat().st_size
        assert own < SANDBOX_BOUND // 2  # the box's bound was met, not the sandbox's
        # Retention removes the oldest ended sandbox's log: room again, within a scan.
        (wire / "sbx-ended-1.log").unlink()
        deadline = time.monotonic() + ROOM_SEEN_S
        while True:
            head, body = ask(made.socket, get("nas.test-lan.example"))
            if head.startswith(b"HTTP/1.1 200"):
                break
            assert body == b"lnk: refused (log-full)\n"
            assert time.monotonic() < deadline, "no room after an ended log was removed"
            time.sleep(0.05)
        assert _on_disk(wire) <= BOX_BOUND
