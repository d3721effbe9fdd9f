"""`lnk` inside a sandbox that may call a bridge (an agent's: the only sandboxes with a bridge
grant): the box grants its own client and puts `lnk` on the sandbox's PATH, whatever the spec's
`[commands]` list says; the Python that client runs for a bridge call only where the list
already lets that Python run (`*`, or `python3` in it).

How: the client is the install's `bin/lnk` (the static C client, native/lnk_client.c), which
runs `python3` beside it (the install's venv, Debian's /usr/bin/python3.11) for every bridge
call: signing a call with the agent's Ed25519 key is done by `lnk_shared.proof_client`, in
Python. What is granted is added to what Landlock lets the sandbox execute (real paths) and is
bound as the very files judged, like any granted program (`bound.py`); the prefix they live in
is root's and read-only inside. PATH inside starts with `BOX_BIN_INSIDE`, a folder of bwrap's
read-only root holding one link, `lnk`, to the client: nothing else of the venv (its pip, its
`python`) is put on PATH. Shown as "granted by the box" in the approval and `lnk spec show`.

The box's ssh connector, `lnk-connect` (native/lnk_connect.c, beside the client in bin/), is
granted the same way to every sandbox with a proxy, under any `[commands]` list: it is the
`ProxyCommand` of the GIT_SSH_COMMAND the box sets (client_proxy_env.py), a static program that
only opens a CONNECT through the sandbox's own proxy, which judges it. Not on PATH (ssh names it
by its full path); shown as "granted by the box" too.

Why not the Python too, under every list: an interpreter runs what it likes (`python3 -c ...`),
so granting it would let a finite list's sandbox run any code, which the list exists to stop
(the loader guarantee). Under a finite list without Python, `lnk` inside starts, and a bridge
call fails naming the grant it needs. What this does NOT do: bridge calls under such a list;
doing them in the C client alone (Ed25519 in static C) would, and is what is left to build.
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "BOX_BIN_INSIDE",
    "CLIENT_NAME",
    "CLIENT_PYTHON",
    "CONNECTOR_NAME",
    "box_client_links",
    "inside_path",
]

CLIENT_NAME, CLIENT_PYTHON = "lnk", "python3"  # the box's client and the Python it runs, in bin/
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
