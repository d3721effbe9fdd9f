"""The store bridge's config: one strict model. An unknown key, a wrong type or an impossible
value is fatal (`field: message`, exit 2); nothing falls back to a default silently.

Read from `<config dir>/bridge-store.toml` when it exists; LNK_CONFIG_DIR, LNK_STATE_DIR and
LNK_RUN_DIR override the three folders. Paths left out are derived: the bridge's own folder
`<run_dir>/bridge-store` (mode 0700: its admin socket and every agent's socket), and the
database `sqlite:///<state_dir>/bridge-store/store.db`. `database_url` is any SQLAlchemy URL,
so PostgreSQL can serve a fleet; it stays outside every sandbox.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from lnk_shared.box_env import DEFAULT_STATE_DIR
from lnk_shared.proofs import MAX_LIFETIME_BOUND_S, MAX_SKEW_BOUND_S
from lnk_shared.service_config import ServicePaths, load_service_config

__all__ = ["BRIDGE_RUN_DIR", "CONFIG_FILE", "StoreConfig", "load_config"]

CONFIG_FILE = "bridge-store.toml"
BRIDGE_RUN_DIR = "bridge-store"  # under run_dir: the bridge's own folder (admin, agents' sockets)
MAX_UID = 2**32 - 2  # (uid_t)-1 means "no change" to the kernel: never a real uid
MAX_URL = 4096


class StoreConfig(ServicePaths):
    """Where the store bridge keeps things, who may command it, and its proof window."""

    RUN_FOLDER = BRIDGE_RUN_DIR  # the admin socket: <run_dir>/bridge-store/admin.sock

    # Derived when absent (`_derived`); the placeholder could never pass `_check`.
    database_url: str = Field(default="", max_length=MAX_URL)
    controller_uid: int = Field(default=0, ge=0, le=MAX_UID)
    max_skew_s: int = Field(default=30, ge=1, le=MAX_SKEW_BOUND_S)
    max_lifetime_s: int = Field(default=60, ge=1, le=MAX_LIFETIME_BOUND_S)

    @model_validator(mode="before")
    @classmethod
    def _derived(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        values = dict(data)
        state = values.get("state_dir", DEFAULT_STATE_DIR)
        if isinstance(state, str | Path):
            values.setdefault("database_url", f"sqlite:///{Path(state) / BRIDGE_RUN_DIR}/store.db")
        return values

    @model_validator(mode="after")
    def _check(self) -> StoreConfig:
        if self.admin_socket.parent != self.bridge_dir:  # where the controller looks for it
            raise ValueError(f"admin_socket must be in {self.bridge_dir}")
        if not self.database_url or "://" not in self.database_url:
            raise ValueError("database_url must be an SQLAlchemy URL (sqlite:///PATH, ...)")
        return self

    @property
    def bridge_dir(self) -> Path:
        """The bridge's own folder: its admin socket and each agent's socket."""
        return self.service_dir


def load_config(env: Mapping[str, str] | None = None) -> StoreConfig:
    """Load and validate the bridge's config; raise ConfigError naming each bad field."""
    return load_service_config(StoreConfig, CONFIG_FILE, env)
