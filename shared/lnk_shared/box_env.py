"""Where the box's folders are, read from the environment once for every caller: LNK_CONFIG_DIR,
LNK_STATE_DIR and LNK_RUN_DIR, each the box's default when unset or empty (tests point a box at
a temp dir). Plain strings, on `os` alone: `lnk sandbox run` reads the run dir on its way to the
launch socket and imports neither pathlib nor dataclasses (tests/unit/lnk_cli/
test_app_startup.py). `lnk_shared.paths.BoxPaths` is the typed view of the same three.
"""

from __future__ import annotations

import os

# typing.TYPE_CHECKING without importing typing, which `lnk sandbox run` never needs.
TYPE_CHECKING = False

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "DEFAULT_CONFIG_DIR",
    "DEFAULT_RUN_DIR",
    "DEFAULT_STATE_DIR",
    "box_config_dir",
    "box_run_dir",
    "box_state_dir",
]

DEFAULT_CONFIG_DIR = "/etc/lnk"
DEFAULT_STATE_DIR = "/var/lib/lnk"
DEFAULT_RUN_DIR = "/run/lnk"


def box_config_dir(env: Mapping[str, str] | None = None) -> str:
    """The box's config folder (admin-written settings)."""
    return (os.environ if env is None else env).get("LNK_CONFIG_DIR") or DEFAULT_CONFIG_DIR


def box_state_dir(env: Mapping[str, str] | None = None) -> str:
    """The box's state folder (databases, logs)."""
    return (os.environ if env is None else env).get("LNK_STATE_DIR") or DEFAULT_STATE_DIR


def box_run_dir(env: Mapping[str, str] | None = None) -> str:
    """The box's run folder (every service's sockets)."""
    return (os.environ if env is None else env).get("LNK_RUN_DIR") or DEFAULT_RUN_DIR
