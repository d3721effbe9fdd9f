"""A service's config: the three folders and the admin socket every service's model starts
from (derived from the run dir, refused when relative or outside it), and the loader's strict
reading of the file with the folders' overrides from the environment."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import Field, ValidationError

from lnk_shared.errors import ConfigError
from lnk_shared.service_config import ServicePaths, load_service_config


class DemoConfig(ServicePaths):
    RUN_FOLDER = "demo"

    limit: int = Field(default=1, ge=1)


def test_every_folder_defaults_to_the_box_s_and_the_admin_socket_is_in_its_own() -> None:
    config = DemoConfig()
    assert (config.config_dir, config.state_dir, config.run_dir) == (
        Path("/etc/lnk"),
        Path("/var/lib/lnk"),
        Path("/run/lnk"),
    )
    assert config.admin_socket == Path("/run/lnk/demo/admin.sock")
    assert config.service_dir == Path("/run/lnk/demo")


def test_the_admin_socket_follows_the_run_dir_unless_given() -> None:
    assert DemoConfig(run_dir="/r").admin_socket == Path("/r/demo/admin.sock")
    given = DemoConfig(run_dir="/r", admin_socket="/r/other/a.sock")
    assert given.admin_socket == Path("/r/other/a.sock")


@pytest.mark.parametrize(
    ("values", "said"),
    [
        ({"run_dir": "run"}, "run_dir must be an absolute path"),
        ({"state_dir": "state"}, "state_dir must be an absolute path"),
        ({"config_dir": "etc"}, "config_dir must be an absolute path"),
        ({"admin_socket": "admin.sock"}, "admin_socket must be an absolute path"),
        ({"admin_socket": "/elsewhere/admin.sock"}, "admin_socket must be under run_dir"),
        ({"unknown": 1}, "Extra inputs are not permitted"),
    ],
)
def test_a_bad_folder_is_refused_naming_it(values: dict[str, object], said: str) -> None:
    with pytest.raises(ValidationError) as raised:
        DemoConfig(**values)
    assert said in str(raised.value)


def test_the_environment_s_folders_override_the_file_s(tmp_path: Path) -> None:
    (tmp_path / "demo.toml").write_text('run_dir = "/from-file"\nlimit = 3\n')
    env = {"LNK_CONFIG_DIR": str(tmp_path), "LNK_RUN_DIR": "/from-env"}
    config = load_service_config(DemoConfig, "demo.toml", env)
    assert config.run_dir == Path("/from-env") and config.limit == 3
    assert config.admin_socket == Path("/from-env/demo/admin.sock")
    assert config.config_dir == tmp_path


def test_an_invalid_field_is_a_config_error_naming_the_file_and_field(tmp_path: Path) -> None:
    (tmp_path / "demo.toml").write_text("limit = 0\n")
    with pytest.raises(ConfigError) as raised:
        load_service_config(DemoConfig, "demo.toml", {"LNK_CONFIG_DIR": str(tmp_path)})
    assert f"{tmp_path / 'demo.toml'}: invalid config" in str(raised.value)
    assert "limit:" in str(raised.value)


def test_an_absent_file_is_every_default(tmp_path: Path) -> None:
    config = load_service_config(DemoConfig, "demo.toml", {"LNK_CONFIG_DIR": str(tmp_path)})
    assert config.limit == 1 and config.config_dir == tmp_path
