"""Loading a service's config file: strict TOML into a strict pydantic model, the box's folders
overridable by LNK_CONFIG_DIR, LNK_STATE_DIR and LNK_RUN_DIR (tests run a box in a temp dir).
An unreadable file or an invalid field is a ConfigError naming the file and each bad field;
nothing falls back to a default silently."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from lnk_shared.errors import ConfigError
from lnk_shared.paths import BoxPaths

__all__ = ["load_service_config"]

Model = TypeVar("Model", bound=BaseModel)
_DIR_OVERRIDES = (
    ("config_dir", "LNK_CONFIG_DIR"),
    ("state_dir", "LNK_STATE_DIR"),
    ("run_dir", "LNK_RUN_DIR"),
)


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
