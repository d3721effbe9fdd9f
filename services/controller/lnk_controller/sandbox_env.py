"""A sandbox's environment, composed in one place: what the launch hands bwrap (`--clearenv`,
then each variable from a memfd of options, never a command line).

Order, each layer over the one before:
1. the box's identity of the sandbox (`PATH`, `HOME`, `USER`, `LOGNAME`, `SHELL`, `TMPDIR`,
   `LNK_SANDBOX_ID`);
2. the caller's terminal and locale (`TERM`, `LANG`, `LC_*`: launch_request's filter);
3. the user's own: the spec's `[env]` and `--env` (`lnk_shared.env_names` judged each name);
4. the box's services: the proxy's variables, secret placeholders, an agent's (its `HOME`).
A user's name that a box layer also sets is refused (`EnvRefused`) rather than overridden in
silence: the names table should have refused it already; this holds when a box layer grows a
name the table does not list yet.

Security limitations: this does NOT keep a value from the sandbox's program once it runs: every
value given is the program's to read, print or send wherever its spec lets it. Values are kept
out of the controller's database, its log and its errors by the callers (the spec's `env` is
not a grant, and not in any repr); this module never logs.
"""

from __future__ import annotations

from collections.abc import Mapping

from lnk_shared.env_names import refusal_reason
from lnk_shared.errors import EnvRefused

__all__ = ["compose_environment"]


def compose_environment(
    *,
    identity: Mapping[str, str],
    terminal: Mapping[str, str],
    user: Mapping[str, str],
    services: Mapping[str, str],
    unsafe_unjudged: bool = False,
) -> dict[str, str]:
    """The sandbox's whole environment, the layers in the module's order. `unsafe_unjudged`
    (controller.toml's unsafe_env_names_unjudged, a test switch) skips the names table; a name
    a box layer sets is refused all the same."""
    for name in user:
        why = None if unsafe_unjudged else refusal_reason(name)
        if why is None and (name in identity or name in services):
            why = "the box sets it for this sandbox"
        if why is not None:
            raise EnvRefused(f"[env] {name}", why)
    return {**identity, **terminal, **user, **services}
