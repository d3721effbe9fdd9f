"""Where the box is: its folders from the environment (an empty variable is unset, never the
current folder), the controller's socket in its run folder, and a service's log named."""

from __future__ import annotations

from pathlib import Path

import pytest

from lnk_shared.paths import BoxPaths


@pytest.mark.parametrize(
    ("env", "config", "state", "run"),
    [
        ({}, "/etc/lnk", "/var/lib/lnk", "/run/lnk"),
        ({"LNK_RUN_DIR": ""}, "/etc/lnk", "/var/lib/lnk", "/run/lnk"),  # empty: never "."
        (
            {"LNK_CONFIG_DIR": "/t/c", "LNK_STATE_DIR": "/t/s", "LNK_RUN_DIR": "/t/r"},
            "/t/c",
            "/t/s",
            "/t/r",
        ),
    ],
)
def test_the_boxs_folders_come_from_the_environment(
    env: dict[str, str], config: str, state: str, run: str
) -> None:
    box = BoxPaths.from_env(env)
    assert (box.config_dir, box.state_dir, box.run_dir) == (Path(config), Path(state), Path(run))
    assert box.all() == (Path(config), Path(state), Path(run))


def test_the_controllers_socket_and_database_are_in_the_boxs_folders() -> None:
    box = BoxPaths.from_env({"LNK_STATE_DIR": "/t/s", "LNK_RUN_DIR": "/t/r"})
    assert box.controller_socket == Path("/t/r/controller.sock")
    assert box.controller_db == Path("/t/s/controller.db")


def test_a_services_log_is_named_both_where_box_up_writes_it_and_in_the_journal() -> None:
    said = BoxPaths.from_env({"LNK_STATE_DIR": "/t/s"}).log_of("controller")
    assert "/t/s/logs/controller.log" in said and "journalctl -u lnk-controller" in said
