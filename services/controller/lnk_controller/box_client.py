"""`lnk` inside a sandbox that may call a bridge (an agent's: the only sandboxes with a bridge
grant): the box grants its own client and puts `lnk` on the sandbox's PATH, whatever the spec's
`[commands]` list says, and grants nothing else: no interpreter.

How: the client is the install's `bin/lnk`, the static C client (lnk_cli/native/lnk_client.c), which
makes an agent's bridge calls itself (lnk_client_bridge.c), signing each with the agent's
Ed25519 key (lnk_client_proof.c, libsodium linked in). What is granted is added to what
Landlock lets the sandbox execute (its real path) and is bound as the very file judged, like
any granted program (`bound.py`); the prefix it lives in is root's and read-only inside. PATH
inside starts with `BOX_BIN_INSIDE`, a folder of bwrap's read-only root holding one link,
`lnk`, to the client: nothing else of the venv (its pip, its `python`) is put on PATH. Shown
as "granted by the box" in the approval and `lnk spec show`.

The box's ssh connector, `lnk-connect` (lnk_inside/native/lnk_connect.c, beside the client in bin/),
is granted the same way to every sandbox with a proxy, under any `[commands]` list: it is the
`ProxyCommand` of the GIT_SSH_COMMAND the box sets (client_proxy_env.py), a static program that
only opens a CONNECT through the sandbox's own proxy, which judges it. Not on PATH (ssh names it
by its full path); shown as "granted by the box" too.

Why not the Python behind the client too: an interpreter runs what it likes (`python3 -c
...`), so granting it would let a finite list's sandbox run any code, which the list exists to
stop (the loader guarantee). Before the client signed in C, the box granted its Python where
the list already let that same file run (`*`, or `python3` in it), which added nothing the
list did not; now no bridge call needs it, so the box grants the client alone. Where the list
lets Python run anyway, `lnk`'s other words (`--help`, a form the C client leaves to argparse)
still reach the Python CLI; where it does not, they fail naming the plain forms the client
takes. What this does NOT do: give an agent anything of `lnk` but its bridge calls (every
other command talks to the controller, which a sandbox cannot reach).
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "BOX_BIN_INSIDE",
    "CLIENT_NAME",
    "CONNECTOR_NAME",
    "box_client_links",
    "inside_path",
]

CLIENT_NAME = "lnk"  # the box's client, in bin/
CONNECTOR_NAME = "lnk-connect"  # ssh's ProxyCommand inside a sandbox with a proxy, in bin/
BOX_BIN_INSIDE = "/run/lnk-box/bin"  # on PATH inside, first: the box's `lnk` and nothing else


def box_client_links(box_bin: Path) -> dict[str, str]:
    """The link bwrap makes in the sandbox's read-only root: `BOX_BIN_INSIDE/lnk` -> the
    install's client (the prefix is bound at its own path inside)."""
    return {f"{BOX_BIN_INSIDE}/{CLIENT_NAME}": str(box_bin / CLIENT_NAME)}


def inside_path(system_path: str, *, with_client: bool) -> str:
    """PATH inside: the system's folders, after the box's `lnk` where the sandbox may call a
    bridge."""
    return f"{BOX_BIN_INSIDE}:{system_path}" if with_client else system_path
