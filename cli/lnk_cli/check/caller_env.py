"""What `lnk sandbox check` tries against the caller's environment reaching the sandbox.

Only what a spec's `[env]` and `--env` name may reach the program (and the box's own variables,
and the caller's terminal and locale: `TERM`, `LANG`, `LC_*`). The check makes a variable of
its own with a random secret, puts it in its own environment for the run (not named by any
`--env`, so its client must not send it), and also sends it in the launch request's terminal
variables, as a client that passed its whole environment would: the controller must drop it.
Inside, the probe (lnk_inside/probes_env.py) reads its own environment (`os.environ` and
`/proc/self/environ`); the secret found there is `leaked` (controller.toml's
`unsafe_caller_env_unfiltered` reopens it).

Security limitations: this does NOT try what a program outside could hand the sandbox by other
means (a file in a granted folder, a socket it may reach); those are the folders' and the
proxy's probes. It tries one variable, not every name the caller has.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["CallerEnvBait", "caller_env_probes", "in_environment"]

BAIT_NAME_PREFIX = "LNK_CHECK_CALLER_"  # an LNK_ name: `--env` refuses it, so none can name it


@dataclass(frozen=True)
class CallerEnvBait:
    """A variable of the caller's environment that no `--env` names, holding a secret."""

    name: str
    value: str

    @classmethod
    def make(cls) -> CallerEnvBait:
        return cls(f"{BAIT_NAME_PREFIX}{secrets.token_hex(4).upper()}", secrets.token_hex(16))

    def request_env(self) -> dict[str, str]:
        """What the check sends as the request's terminal variables: the bait among them, as a
        client that sent its whole environment would (the controller keeps TERM, LANG, LC_*)."""
        return {self.name: self.value}


@contextlib.contextmanager
def in_environment(bait: CallerEnvBait) -> Iterator[None]:
    """The bait in this process's environment while the sandbox is made and runs."""
    old = os.environ.get(bait.name)
    os.environ[bait.name] = bait.value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(bait.name, None)
        else:
            os.environ[bait.name] = old


def caller_env_probes(bait: CallerEnvBait) -> list[Any]:
    """The probe, to add to the plan."""
    from lnk_cli.check.plan import REFUSED, Evidence, Probe

    return [
        Probe(
            "caller-env",
            "find a variable of the caller's environment no --env named "
            "(its own environment, /proc/self/environ)",
            REFUSED,
            {"id": "caller-env", "kind": "own_environ"},
            (Evidence("secret", bait.value),),
        )
    ]
