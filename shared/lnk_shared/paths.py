"""Where the box keeps things, and the paths every sandbox must never be granted.

Services and tests point the box at other dirs with LNK_CONFIG_DIR, LNK_STATE_DIR and
LNK_RUN_DIR (read in `box_env`), so a test runs an isolated box in a temp dir.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from lnk_shared.box_env import (
    DEFAULT_CONFIG_DIR,
    DEFAULT_RUN_DIR,
    DEFAULT_STATE_DIR,
    box_config_dir,
    box_run_dir,
    box_state_dir,
)
from lnk_shared.protected_names import protected_paths

__all__ = [
    "AGENT_FOLDERS",
    "DEFAULT_CONFIG_DIR",  # box_env's, here too for the typed callers
    "DEFAULT_RUN_DIR",
    "DEFAULT_STATE_DIR",
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
# Where each sandbox's own home is mounted (SANDBOX_HOMES/<its user>, a fresh tmpfs): a grant
# of this folder or one above it would hold that mount point, which bwrap cannot make there.
SANDBOX_HOMES = "/home"
# Folders of other programs' sockets, besides the owner's $XDG_RUNTIME_DIR.
SOCKET_DIRS = ("/run", "/var/run", "/tmp/.X11-unix", "/tmp/.ICE-unix")

# Entries at the top of a written folder that tools read or run outside the sandbox, and the
# files inside `.git` that redirect git: kept read-only inside every write grant. The table,
# with each name's tool and why, is protected_names.PROTECTED_NAMES.
PROJECT_RUN_DOT_ENTRIES = protected_paths()


@dataclass(frozen=True)
class BoxPaths:
    """The box's own folders: config (admin-written), state (databases), run (sockets)."""

    config_dir: Path
    state_dir: Path
    run_dir: Path

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> BoxPaths:
        return cls(
            config_dir=Path(box_config_dir(env)),
            state_dir=Path(box_state_dir(env)),
            run_dir=Path(box_run_dir(env)),
        )

    @property
    def controller_db(self) -> Path:
        return self.state_dir / "controller.db"

    @property
    def controller_socket(self) -> Path:
        """The controller's API socket (management: list, stop, leases, specs, agents)."""
        return self.run_dir / "controller.sock"

    def log_of(self, service: str) -> str:
        """Where a service's log is, said for a person: `lnk box up` writes it under the state
        folder, a box the Ansible role installed keeps it in the journal of its unit."""
        return (
            f"the {service}'s log ({self.state_dir / 'logs' / f'{service}.log'}, "
            f"or `journalctl -u lnk-{service}`)"
        )

    def all(self) -> tuple[Path, ...]:
        return (self.config_dir, self.state_dir, self.run_dir)
