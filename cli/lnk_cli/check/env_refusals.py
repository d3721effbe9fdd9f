"""The check's environment-name probes: the controller must refuse an `--env` that would change
what a granted program runs (`lnk_shared.env_names`), whatever this client judged.

Judging is the controller's, so each probe asks it: one "check" launch of the spec with the
name added to its `--env`, sent as NAME=VALUE without this client's own judgement, and no probe
steps. A refusal (exit 3) is `refused`; a sandbox that starts is `leaked` (its probe program,
given nothing to do, ends at once). The values are harmless where they leak (a path that does
not exist): the probe is whether the controller let the name through, not what it would do.
controller.toml's `unsafe_env_names_unjudged` reopens the class.

Security limitations: this tries one name of the loader's and one of the shells', not every
name the table refuses (the table itself is tested name by name in tests/unit).
"""

from __future__ import annotations

import argparse
import copy
import secrets

from lnk_cli.check.launch import Interrupts, RemoteError, run_probes
from lnk_cli.check.plan import LEAKED, REFUSED
from lnk_cli.check.verdicts import Finding, clean_text
from lnk_shared.errors import EXIT_REFUSED

__all__ = ["TRIED_NAMES", "env_refusal_findings"]

NO_STEPS = "[]"
# (name, what it would do): one the loader reads in every program, one a shell runs at start.
TRIED_NAMES = (
    ("LD_PRELOAD", "map a library into every granted program"),
    ("BASH_ENV", "make bash run a file before every script"),
)


def env_refusal_findings(args: argparse.Namespace, interrupts: Interrupts) -> list[Finding]:
    findings = []
    for name, what in TRIED_NAMES:
        ident = f"env-name:{name}"
        tried = f"give the program {name} with --env ({what})"
        asked = copy.copy(args)
        missing = f"/nonexistent/lnk-check-{secrets.token_hex(4)}"  # nothing there to load
        asked.env = [*(getattr(args, "env", None) or []), f"{name}={missing}"]
        try:
            run_probes(asked, NO_STEPS, interrupts)
        except RemoteError as exc:
            if exc.exit_code != EXIT_REFUSED:
                raise
            findings.append(Finding(ident, tried, REFUSED, clean_text(str(exc), 200), REFUSED))
            continue
        findings.append(Finding(ident, tried, REFUSED, "the controller built the sandbox", LEAKED))
    return findings
