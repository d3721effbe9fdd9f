"""The box's own folders, once: where each is, whose it is, its mode, and why.

The controller makes its own at start (`lnk_controller.service`), `lnk box up` makes each other
service's before it starts that service (`lnk_admin.box_commands`), and the Ansible role makes
them at converge (`deploy/ansible/roles/lnk_box/tasks/folders.yml`: a unit test holds the role's
list equal to this table). A mode is set explicitly after every mkdir, whatever the umask.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from lnk_shared.paths import BoxPaths

__all__ = ["FOLDERS", "BoxFolder", "box_path_of", "folder_named", "folders_for", "path_of"]

Base = Literal["state", "run"]
Owner = Literal["root", "proxy", "bridge-store"]  # root, or that service's own system user
Service = Literal["controller", "proxy", "bridge-store"]  # the services `lnk box up` starts


@dataclass(frozen=True)
class BoxFolder:
    """`name` under the box's state or run folder ("" is that folder itself). `service`: the
    one that needs it before it starts (and whose starter makes it: the controller itself, or
    `lnk box up` for the others). `by_role`: the Ansible role makes it too (the controller's
    staging folder it makes at every start, below a mount of its own)."""

    base: Base
    name: str
    owner: Owner
    mode: int
    service: Service
    why: str
    by_role: bool = True


FOLDERS = (
    BoxFolder("state", "", "root", 0o755, "controller", "the proxy reaches wire/ through it"),
    BoxFolder("state", "homes", "root", 0o711, "controller", "sandbox uids reach only their own"),
    BoxFolder("state", "wire", "proxy", 0o750, "proxy", "the wire's log, outside every sandbox"),
    BoxFolder("state", "bridge-store", "bridge-store", 0o700, "bridge-store", "its SQLite store"),
    BoxFolder("run", "", "root", 0o755, "controller", "clients reach the sockets in it"),
    BoxFolder(
        "run", "flags", "root", 0o755, "proxy", "the controller writes stop/pause, the proxy reads"
    ),
    BoxFolder("run", "proxy", "proxy", 0o700, "proxy", "its listeners and admin socket"),
    BoxFolder("run", "bridge-store", "bridge-store", 0o700, "bridge-store", "its sockets"),
    BoxFolder(
        "run",
        "sandboxes",
        "root",
        0o711,
        "controller",
        "staged mounts: sandbox uids traverse to their own, never list them",
        by_role=False,
    ),
)


def folders_for(service: str) -> tuple[BoxFolder, ...]:
    """The folders `service` needs before it starts, parents first (the table's order)."""
    return tuple(folder for folder in FOLDERS if folder.service == service)


def folder_named(base: Base, name: str) -> BoxFolder:
    """The table's entry for `name` under `base` ("" for the base folder itself)."""
    for folder in FOLDERS:
        if (folder.base, folder.name) == (base, name):
            return folder
    raise KeyError(f"the box has no folder {name!r} in its {base} folder")


def path_of(folder: BoxFolder, *, state_dir: Path, run_dir: Path) -> Path:
    """Where `folder` is on a box whose state and run folders are these."""
    base = state_dir if folder.base == "state" else run_dir
    return base / folder.name if folder.name else base


def box_path_of(folder: BoxFolder, box: BoxPaths) -> Path:
    return path_of(folder, state_dir=box.state_dir, run_dir=box.run_dir)
