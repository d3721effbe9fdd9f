"""Where the box keeps things, and the paths every sandbox must never be granted.

Services and tests point the box at other dirs with LNK_CONFIG_DIR, LNK_STATE_DIR and
LNK_RUN_DIR, so a test runs an isolated box in a temp dir.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "AGENT_FOLDERS",
    "PROJECT_RUN_DOT_ENTRIES",
    "SOCKET_DIRS",
    "SYSTEM_DIRS",
    "TEMP_DIRS",
    "USER_SETTINGS_DIR",
    "BoxPaths",
]

USER_SETTINGS_DIR = ".lnk"  # per-user settings under the home: remembered specs, keys
AGENT_FOLDERS = ("Link/Agents", "Link/History")  # agents' homes and their history, under the home

# Folders whose contents run as someone else or at boot; writing them runs code outside.
SYSTEM_DIRS = (
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/opt",
    "/proc",
    "/sbin",
    "/sys",
    "/usr",
    "/var/cache",
    "/var/lib",
    "/var/spool",
    "/var/www",
)
# Shared scratch folders: anyone can plant a file there, so no program runs from them.
TEMP_DIRS = ("/tmp", "/var/tmp", "/dev/shm")
# Folders of other programs' sockets, besides the owner's $XDG_RUNTIME_DIR.
SOCKET_DIRS = ("/run", "/var/run", "/tmp/.X11-unix", "/tmp/.ICE-unix")

# Entries at the top of a written folder that tools run outside the sandbox (git hooks and
# config, direnv, editors' tasks, CI definitions): kept read-only inside every write grant.
PROJECT_RUN_DOT_ENTRIES = (
    ".devcontainer",  # postCreateCommand and friends run when the owner opens the container
    ".direnv",  # direnv's layouts (a virtualenv's bin) that .envrc puts on PATH
    ".envrc",  # direnv runs it on entering the folder
    ".git/config",  # core.fsmonitor, core.hooksPath, aliases, filters: commands git runs
    ".git/hooks",  # run by git on commit, checkout, push
    ".github",  # workflows run wherever the owner pushes
    ".gitlab-ci.yml",  # likewise
    ".gitmodules",  # submodule URLs and update commands
    ".husky",  # hooks that husky points git at
    ".idea",  # run configurations an IDE offers to start
    ".mise.toml",  # mise runs its tasks and env hooks on entering the folder
    ".npmrc",  # npm's script-shell and registry
    ".pre-commit-config.yaml",  # what pre-commit runs on commit
    ".vscode",  # tasks.json and settings the editor runs
)

DEFAULT_CONFIG_DIR = "/etc/lnk"
DEFAULT_STATE_DIR = "/var/lib/lnk"
DEFAULT_RUN_DIR = "/run/lnk"


@dataclass(frozen=True)
class BoxPaths:
    """The box's own folders: config (admin-written), state (databases), run (sockets)."""

    config_dir: Path
    state_dir: Path
    run_dir: Path

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> BoxPaths:
        env = os.environ if env is None else env
        return cls(
            config_dir=Path(env.get("LNK_CONFIG_DIR") or DEFAULT_CONFIG_DIR),
            state_dir=Path(env.get("LNK_STATE_DIR") or DEFAULT_STATE_DIR),
            run_dir=Path(env.get("LNK_RUN_DIR") or DEFAULT_RUN_DIR),
        )

    @property
    def controller_db(self) -> Path:
        return self.state_dir / "controller.db"

    def all(self) -> tuple[Path, ...]:
        return (self.config_dir, self.state_dir, self.run_dir)
