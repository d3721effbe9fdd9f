"""The bridge's config: strict, paths derived from the box's folders, bounded proof window."""

from __future__ import annotations

from pathlib import Path

import pytest

from lnk_bridge_store.config import load_config
from lnk_shared.errors import ConfigError


def env(tmp_path: Path) -> dict[str, str]:
    return {
        "LNK_CONFIG_DIR": str(tmp_path / "etc"),
        "LNK_STATE_DIR": str(tmp_path / "state"),
        "LNK_RUN_DIR": str(tmp_path / "run"),
    }


def test_paths_are_derived_from_the_box_folders(tmp_path: Path) -> None:
    config = load_config(env(tmp_path))
    assert config.admin_socket == tmp_path / "run" / "bridge-store" / "admin.sock"
    assert config.database_url == f"sqlite:///{tmp_path}/state/bridge-store/store.db"
    assert (config.max_skew_s, config.max_lifetime_s) == (30, 60)


@pytest.mark.parametrize(
    "text",
    [
        "unknown = 1\n",
        "max_skew_s = 301\n",
        "max_lifetime_s = 0\n",
        'database_url = "store.db"\n',
        'admin_socket = "/tmp/admin.sock"\n',
        "controller_uid = -1\n",
    ],
)
def test_an_invalid_config_is_fatal(tmp_path: Path, text: str) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "bridge-store.toml").write_text(text)
    with pytest.raises(ConfigError, match="invalid config"):
        load_config(env(tmp_path))
