"""The watch on the bridge's run folder: its admin socket made says so, another name does not,
and the folder removed ends the watch (said, so the caller asks the bridge on its timer)."""

from __future__ import annotations

import select
import socket
from pathlib import Path

from lnk_controller.bridge_watch import BridgeWatch


def _ready(watch: BridgeWatch, wait_s: float = 1.0) -> bool:
    return bool(select.select([watch.fileno()], [], [], wait_s)[0])


def test_the_admin_socket_made_is_seen_and_another_name_is_not(tmp_path: Path) -> None:
    watch = BridgeWatch(tmp_path, "admin.sock")
    try:
        assert watch.arm() and watch.armed
        (tmp_path / "agents").mkdir()
        assert _ready(watch) and not watch.changed()
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(str(tmp_path / "admin.sock"))
            assert _ready(watch) and watch.changed()
    finally:
        watch.close()


def test_a_socket_renamed_into_place_is_seen(tmp_path: Path) -> None:
    watch = BridgeWatch(tmp_path, "admin.sock")
    try:
        assert watch.arm()
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(str(tmp_path / "tmp.sock"))
            watch.changed()
            (tmp_path / "tmp.sock").rename(tmp_path / "admin.sock")
            assert _ready(watch) and watch.changed()
    finally:
        watch.close()


def test_the_folder_removed_ends_the_watch_and_says_so(tmp_path: Path) -> None:
    folder = tmp_path / "bridge-store"
    folder.mkdir()
    watch = BridgeWatch(folder, "admin.sock")
    try:
        assert watch.arm()
        folder.rmdir()
        assert _ready(watch) and watch.changed()
        assert not watch.armed
        assert not watch.arm()  # not there: no watch
        folder.mkdir()
        assert watch.arm()
    finally:
        watch.close()


def test_a_folder_not_there_yet_is_not_armed(tmp_path: Path) -> None:
    watch = BridgeWatch(tmp_path / "missing", "admin.sock")
    try:
        assert not watch.arm() and not watch.armed
    finally:
        watch.close()
