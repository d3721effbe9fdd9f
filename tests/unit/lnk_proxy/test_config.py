"""The proxy's config: a strict model read from a real file in a temp config dir. Anything
unknown, mistyped or impossible is fatal and named; derived paths follow the folders; the
unsafe test settings warn."""

from __future__ import annotations

import ipaddress
import logging
from pathlib import Path

import pytest

from lnk_proxy.config import CONFIG_FILE, ProxyConfig, load_config
from lnk_shared.errors import ConfigError


@pytest.fixture
def config_dir(tmp_path: Path) -> Path:
    path = tmp_path / "etc"
    path.mkdir()
    return path


@pytest.fixture
def env(config_dir: Path) -> dict[str, str]:
    return {"LNK_CONFIG_DIR": str(config_dir)}


def write(config_dir: Path, text: str) -> Path:
    path = config_dir / CONFIG_FILE
    path.write_text(text, encoding="utf-8")
    return path


def test_no_file_gives_the_defaults(env: dict[str, str], config_dir: Path) -> None:
    cfg = load_config(env)
    assert cfg.config_dir == config_dir
    assert cfg.run_dir == Path("/run/lnk")
    assert cfg.admin_socket == Path("/run/lnk/proxy/admin.sock")
    assert cfg.flags_dir == Path("/run/lnk/flags")
    assert cfg.wire_log_dir == Path("/var/lib/lnk/wire")
    assert cfg.controller_uid == 0
    assert cfg.unsafe_public_networks == []
    assert cfg.unsafe_dns_table is None
    assert cfg.public_networks == ()


def test_derived_paths_follow_the_folders_from_the_environment(
    env: dict[str, str], tmp_path: Path
) -> None:
    env |= {"LNK_RUN_DIR": str(tmp_path / "run"), "LNK_STATE_DIR": str(tmp_path / "state")}
    cfg = load_config(env)
    assert cfg.admin_socket == tmp_path / "run" / "proxy" / "admin.sock"
    assert cfg.flags_dir == tmp_path / "run" / "flags"
    assert cfg.wire_log_dir == tmp_path / "state" / "wire"


def test_file_values_are_read(env: dict[str, str], config_dir: Path) -> None:
    write(
        config_dir,
        "controller_uid = 0\nconnect_timeout_s = 3\nmax_tunnels_per_sandbox = 8\n"
        'wire_log_dir = "/srv/wire"\nflags_dir = "/srv/flags"\n',
    )
    cfg = load_config(env)
    assert cfg.connect_timeout_s == 3.0
    assert cfg.max_tunnels_per_sandbox == 8
    assert cfg.wire_log_dir == Path("/srv/wire")
    assert cfg.flags_dir == Path("/srv/flags")


def test_unsafe_settings_are_read_and_warn(
    env: dict[str, str], config_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write(
        config_dir,
        'unsafe_public_networks = ["198.18.0.0/15"]\nunsafe_dns_table = "/tmp/dns.json"\n',
    )
    with caplog.at_level(logging.WARNING, logger="lnk_proxy.config"):
        cfg = load_config(env)
    assert cfg.public_networks == (ipaddress.ip_network("198.18.0.0/15"),)
    assert cfg.unsafe_dns_table == Path("/tmp/dns.json")
    text = caplog.text
    assert "unsafe_public_networks" in text
    assert "unsafe_dns_table" in text


def test_safe_config_does_not_warn(env: dict[str, str], caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="lnk_proxy.config"):
        load_config(env)
    assert caplog.records == []


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("unknown_key = 1\n", "unknown_key"),
        ('controller_uid = "0"\n', "controller_uid"),
        ("controller_uid = -1\n", "controller_uid"),
        ("controller_uid = 4294967295\n", "controller_uid"),
        ('connect_timeout_s = "10"\n', "connect_timeout_s"),
        ("connect_timeout_s = 0\n", "connect_timeout_s"),
        ("connect_timeout_s = 1000\n", "connect_timeout_s"),
        ("max_tunnels_per_sandbox = 0\n", "max_tunnels_per_sandbox"),
        ("max_tunnels_per_sandbox = true\n", "max_tunnels_per_sandbox"),
        ("max_connections_per_sandbox = 0\n", "max_connections_per_sandbox"),
        ('unsafe_public_networks = "198.18.0.0/15"\n', "unsafe_public_networks"),
        ('unsafe_public_networks = ["198.18.0.1/15"]\n', "unsafe_public_networks"),
        ('unsafe_public_networks = ["example.com"]\n', "unsafe_public_networks"),
        ('unsafe_dns_table = "dns.json"\n', "unsafe_dns_table"),
        ('admin_socket = "/elsewhere/proxy.sock"\n', "admin_socket"),
        ('wire_log_dir = "wire"\n', "wire_log_dir"),
        ('flags_dir = "flags"\n', "flags_dir"),
        ("run_dir = 5\n", "run_dir"),
    ],
)
def test_bad_value_is_fatal_and_named(
    env: dict[str, str], config_dir: Path, text: str, field: str
) -> None:
    write(config_dir, text)
    with pytest.raises(ConfigError) as info:
        load_config(env)
    assert field in str(info.value)
    assert info.value.exit_code == 2


def test_unreadable_toml_is_fatal(env: dict[str, str], config_dir: Path) -> None:
    write(config_dir, "controller_uid = \n")
    with pytest.raises(ConfigError, match="cannot be read as TOML"):
        load_config(env)


def test_the_model_is_frozen() -> None:
    cfg = ProxyConfig()
    with pytest.raises(ValueError, match="frozen"):
        cfg.controller_uid = 1000


@pytest.mark.parametrize(
    "name",
    [
        "unsafe_unbounded_tunnels",
        "unsafe_log_every_refusal",
        "unsafe_hosted_tunnel_by_address",
        "unsafe_unbounded_model_bodies",
        "unsafe_uncut_model_listings",
        "unsafe_per_level_nesting",
        "unsafe_naive_content_screen",
    ],
)
def test_the_test_only_switches_are_off_by_default_and_warn_when_set(
    env: dict[str, str], config_dir: Path, caplog: pytest.LogCaptureFixture, name: str
) -> None:
    assert getattr(load_config(env), name) is False
    write(config_dir, f"{name} = true\n")
    with caplog.at_level(logging.WARNING, logger="lnk_proxy.config"):
        assert getattr(load_config(env), name) is True
    assert name in caplog.text and "never on a real box" in caplog.text
