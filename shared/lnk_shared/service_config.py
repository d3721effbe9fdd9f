"""Loading a service's config file: strict TOML into a strict pydantic model, the box's folders
overridable by LNK_CONFIG_DIR, LNK_STATE_DIR and LNK_RUN_DIR (tests run a box in a temp dir).
An unreadable file or an invalid field is a ConfigError naming the file and each bad field;
nothing falls back to a default silently.

`ServiceFolders` is what every such model starts from (the three folders), `ServicePaths` that
of a service the controller commands: with the admin socket in the service's own folder under
the run dir (`lnk_shared.admin_socket`), derived when left out.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from lnk_shared.admin_socket import admin_socket_in
from lnk_shared.box_env import DEFAULT_CONFIG_DIR, DEFAULT_RUN_DIR, DEFAULT_STATE_DIR
from lnk_shared.errors import ConfigError
from lnk_shared.paths import BoxPaths

__all__ = ["ServiceFolders", "ServicePaths", "load_service_config"]

Model = TypeVar("Model", bound=BaseModel)
_DIR_OVERRIDES = (
    ("config_dir", "LNK_CONFIG_DIR"),
    ("state_dir", "LNK_STATE_DIR"),
    ("run_dir", "LNK_RUN_DIR"),
)


class ServiceFolders(BaseModel):
    """A service's folders: config (admin-written), state, run (sockets); each absolute."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    config_dir: Path = Field(default=Path(DEFAULT_CONFIG_DIR), strict=False)
    state_dir: Path = Field(default=Path(DEFAULT_STATE_DIR), strict=False)
    run_dir: Path = Field(default=Path(DEFAULT_RUN_DIR), strict=False)

    @model_validator(mode="after")
    def _folders_absolute(self) -> ServiceFolders:
        for name in ("config_dir", "state_dir", "run_dir"):
            if not getattr(self, name).is_absolute():
                raise ValueError(f"{name} must be an absolute path")
        return self


class ServicePaths(ServiceFolders):
    """The folders of a service the controller commands, and its admin socket:
    `<run_dir>/<RUN_FOLDER>/admin.sock` when not given, absolute and under the run dir (where
    the controller looks for it)."""

    RUN_FOLDER: ClassVar[str]  # the service's own folder under run_dir (mode 0700)

    # Derived when absent (`_derived_admin_socket`); the placeholder `.` never passes the check.
    admin_socket: Path = Field(default=Path(), strict=False)

    @model_validator(mode="before")
    @classmethod
    def _derived_admin_socket(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        run = data.get("run_dir", DEFAULT_RUN_DIR)
        if "admin_socket" in data or not isinstance(run, str | Path):
            return data
        return {**data, "admin_socket": admin_socket_in(Path(run), cls.RUN_FOLDER)}

    @model_validator(mode="after")
    def _admin_socket_checked(self) -> ServicePaths:
        if not self.admin_socket.is_absolute():
            raise ValueError("admin_socket must be an absolute path")
        if not self.admin_socket.is_relative_to(self.run_dir):
            raise ValueError("admin_socket must be under run_dir")
        return self

    @property
    def service_dir(self) -> Path:
        """The service's own folder: its admin socket and the sockets it serves."""
        return self.run_dir / self.RUN_FOLDER


def load_service_config(
    model: type[Model], file_name: str, env: Mapping[str, str] | None = None
) -> Model:
    """`<config dir>/<file_name>` (absent: every default) validated as `model`."""
    env = os.environ if env is None else env
    box = BoxPaths.from_env(env)
    path = box.config_dir / file_name
    values: dict[str, Any] = {}
    try:
        values = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        pass
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: cannot be read as TOML: {exc}") from None
    for key, var in _DIR_OVERRIDES:
        if env.get(var):
            values[key] = env[var]
    values.setdefault("config_dir", str(box.config_dir))
    try:
        return model(**values)
    except ValidationError as exc:
        lines = [
            f"{'.'.join(str(p) for p in err['loc']) or 'config'}: {err['msg']}"
            for err in exc.errors()
        ]
        raise ConfigError(f"{path}: invalid config:\n  " + "\n  ".join(lines)) from None
