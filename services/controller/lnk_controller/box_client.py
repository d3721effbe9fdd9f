"""`lnk` inside a sandbox that may call a bridge (an agent's: the only sandboxes with a bridge
grant): the box grants its own client and the Python that client runs, whatever the spec's
`[commands]` list says, and puts `lnk` on the sandbox's PATH.

How: the client is the install's `bin/lnk` (the static C client, native/lnk_client.c), which
runs `python3` beside it (the install's venv, Debian's /usr/bin/python3.11) for every bridge
call: signing a call with the agent's Ed25519 key is done by `lnk_shared.proof_client`, in
Python. Both are added to what Landlock lets the sandbox execute (their real paths) and are
bound as the very files judged, like any granted program (`bound.py`); the prefix they live in
is root's and read-only inside. PATH inside starts with `BOX_BIN_INSIDE`, a folder of bwrap's
read-only root holding one link, `lnk`, to the client: nothing else of the venv (its pip, its
`python`) is put on PATH. Shown as "granted by the box" in the approval and `lnk spec show`.

What this does NOT stop: the granted Python is an interpreter, and an interpreter runs what it
likes (`python3 -c ...`, as with any granted interpreter: `exec_mounts.py`); so under a finite
`[commands]` list an agent's sandbox can run Python code, and with it any code it can write to
anonymous executable memory. It stays inside the sandbox's walls (Landlock's file and network
rules, seccomp, the proxy): what the list no longer limits is which code runs, not what that
code reaches. Doing the bridge calls in the C client alone (Ed25519 in static C) would close
it; until then this is a known gap, stated in the README's known gaps.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["BOX_BIN_INSIDE", "CLIENT_NAME", "CLIENT_PYTHON", "box_client_links", "inside_path"]

CLIENT_NAME, CLIENT_PYTHON = "lnk", "python3"  # the box's client and the Python it runs, in bin/
BOX_BIN_INSIDE = "/run/lnk-box/bin"  # on PATH inside, first: the box's `lnk` and nothing else


def box_client_links(box_bin: Path) -> dict[str, str]:
    """The link bwrap makes in the sandbox's read-only root: `BOX_BIN_INSIDE/lnk` -> the
    install's client (the prefix is bound at its own path inside)."""
    return {f"{BOX_BIN_INSIDE}/{CLIENT_NAME}": str(box_bin / CLIENT_NAME)}


def inside_path(system_path: str, *, with_client: bool) -> str:
    """PATH inside: the system's folders, after the box's `lnk` where the sandbox may call a
    bridge."""
    return f"{BOX_BIN_INSIDE}:{system_path}" if with_client else system_path
