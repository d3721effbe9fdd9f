"""The controller's config: one strict model. An unknown key, a wrong type or an impossible
value is fatal (`field: message`, exit 2); nothing falls back to a default silently.

Read from `<config dir>/controller.toml` when it exists; LNK_CONFIG_DIR, LNK_STATE_DIR and
LNK_RUN_DIR override the three folders, so a test runs an isolated box in a temp dir.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from lnk_controller.limits import BoxLimits
from lnk_shared.paths import BoxPaths
from lnk_shared.service_config import load_service_config
from lnk_shared.service_identity import MIN_SANDBOX_UID

__all__ = ["CONFIG_FILE", "ControllerConfig", "load_config"]

log = logging.getLogger(__name__)

CONFIG_FILE = "controller.toml"
MAX_SANDBOX_UID = 2**31 - 1  # bwrap 0.8 writes its uid_map with "%d": larger uids fail there
DAY = 86_400


class ControllerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    config_dir: Path = Field(default=Path("/etc/lnk"), strict=False)
    state_dir: Path = Field(default=Path("/var/lib/lnk"), strict=False)
    run_dir: Path = Field(default=Path("/run/lnk"), strict=False)
    prefix: Path = Field(default_factory=lambda: Path(sys.prefix).parent, strict=False)
    python: Path = Field(default_factory=lambda: Path(sys.prefix) / "bin" / "python", strict=False)
    bwrap: Path = Field(default=Path("/usr/bin/bwrap"), strict=False)
    confiner: Path = Field(  # lnk-sandbox, built into the package at install (native/build.py)
        default_factory=lambda: Path(__file__).resolve().parent / "native" / "lnk-sandbox",
        strict=False,
    )
    spawner: Path = Field(  # lnk-spawn, the launcher the controller runs as root (native/build.py)
        default_factory=lambda: Path(__file__).resolve().parent / "native" / "lnk-spawn",
        strict=False,
    )
    uid_first: int = Field(default=2_000_000_000, ge=MIN_SANDBOX_UID, le=MAX_SANDBOX_UID)
    uid_last: int = Field(default=2_000_099_999, ge=MIN_SANDBOX_UID, le=MAX_SANDBOX_UID)
    lease_seconds: int = Field(default=12 * 3600, ge=1, le=30 * DAY)
    max_lease_seconds: int = Field(default=7 * DAY, ge=1, le=30 * DAY)
    tmp_size_mb: int = Field(default=256, ge=1, le=64 * 1024)
    unsafe_pretend_landlock_abi: int | None = Field(default=None, ge=1, le=64)
    # Each sandbox's limits and each owner's (`[limits]`, lnk_controller.limits.BoxLimits).
    limits: BoxLimits = Field(default_factory=BoxLimits)

    @model_validator(mode="after")
    def _check(self) -> ControllerConfig:
        if self.uid_last < self.uid_first:
            raise ValueError("uid_last must not be below uid_first")
        if self.lease_seconds > self.max_lease_seconds:
            raise ValueError("lease_seconds must not exceed max_lease_seconds")
        for name in (
            "config_dir",
            "state_dir",
            "run_dir",
            "prefix",
            "python",
            "bwrap",
            "confiner",
            "spawner",
        ):
            if not getattr(self, name).is_absolute():
                raise ValueError(f"{name} must be an absolute path")
        if self.unsafe_pretend_landlock_abi is not None:
            log.warning(
                "unsafe_pretend_landlock_abi=%d: sandboxes are built as if the kernel had only "
                "that Landlock ABI (a test setting; never on a real box)",
                self.unsafe_pretend_landlock_abi,
            )
        if self.limits.unsafe_no_limits:
            log.warning(
                "limits.unsafe_no_limits: sandboxes run with NO process, memory, CPU or "
                "open-file limit (a test setting; never on a real box)"
            )
        if self.limits.unsafe_allow_unlimited:
            log.warning(
                "limits.unsafe_allow_unlimited: sandboxes start even where no cgroup limit "
                "can be applied"
            )
        return self

    @property
    def paths(self) -> BoxPaths:
        return BoxPaths(self.config_dir, self.state_dir, self.run_dir)

    @property
    def api_socket(self) -> Path:
        return self.run_dir / "controller.sock"

    @property
    def launch_socket(self) -> Path:
        return self.run_dir / "launch.sock"

    @property
    def homes_dir(self) -> Path:
        return self.state_dir / "homes"

    @property
    def proxy_dir(self) -> Path:
        """The proxy's folder: its admin socket and each sandbox's listener."""
        return self.run_dir / "proxy"

    @property
    def proxy_admin_socket(self) -> Path:
        return self.proxy_dir / "admin.sock"

    @property
    def flags_dir(self) -> Path:
        """Stop and pause marker files the controller writes and the proxy reads."""
        return self.run_dir / "flags"

    @property
    def staging_root(self) -> Path:
        return self.run_dir / "sandboxes"

    @property
    def database(self) -> Path:
        return self.state_dir / "controller.db"


def load_config(env: Mapping[str, str] | None = None) -> ControllerConfig:
    """Load and validate the controller's config; raise ConfigError naming each bad field."""
    return load_service_config(ControllerConfig, CONFIG_FILE, env)
