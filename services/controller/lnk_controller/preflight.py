"""The box's own capabilities checked before a launch is judged: bubblewrap, the confiner and
the launcher installed, a syscall filter for this machine, and the Landlock ABI the wall needs.
Each missing one refuses the launch, naming it, before anything of a sandbox exists.

What this does NOT do: check the kernel's other features (`lnk box up` reports them), or
anything of the spec.
"""

from __future__ import annotations

import os

from lnk_controller import landlock, seccomp
from lnk_controller.config import ControllerConfig
from lnk_controller.spawn import MIN_LANDLOCK_ABI
from lnk_shared.errors import LaunchRefused

__all__ = ["preflight"]


def preflight(cfg: ControllerConfig) -> None:
    """Refuse, naming the missing capability, before anything of a sandbox exists."""
    if not os.access(cfg.bwrap, os.X_OK):
        raise LaunchRefused("bubblewrap", f"{cfg.bwrap} is missing: install bubblewrap")
    if not os.access(cfg.confiner, os.X_OK) or not cfg.confiner.is_file():
        raise LaunchRefused(
            "the confiner",
            f"{cfg.confiner} (the confiner, lnk-sandbox) is missing or not executable: "
            "reinstall lnk",
        )
    if not os.access(cfg.spawner, os.X_OK) or not cfg.spawner.is_file():
        raise LaunchRefused(
            "the launcher",
            f"{cfg.spawner} (the launcher, lnk-spawn) is missing or not executable: reinstall lnk",
        )
    if not cfg.confiner.resolve().is_relative_to(cfg.prefix.resolve()):
        raise LaunchRefused(
            "the confiner",
            f"{cfg.confiner} is outside {cfg.prefix}, so a sandbox cannot see it",
        )
    machine = os.uname().machine
    if machine not in seccomp.SUPPORTED_MACHINES:
        raise LaunchRefused("seccomp", f"no syscall filter for the architecture {machine}")
    seccomp.programs()  # compiled once per process; a failure refuses, naming libseccomp
    abi = landlock.probe_abi()
    if cfg.unsafe_pretend_landlock_abi is not None:
        abi = min(abi, cfg.unsafe_pretend_landlock_abi)
    if abi < MIN_LANDLOCK_ABI:
        raise LaunchRefused(
            "Landlock",
            f"Landlock ABI {MIN_LANDLOCK_ABI} (abstract-socket and signal scoping) is needed, "
            f"the kernel has {abi}",
        )
