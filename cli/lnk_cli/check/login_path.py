"""The check's login-PATH probes: the controller must refuse a write of any folder on the
owner's login PATH (lnk_shared.login_path: the profile files and the per-user bin folders),
whatever the caller's current PATH says.

Judging is the controller's, so each probe asks it: one "check" launch of the spec with that
folder added as a write and no probe steps. A refusal (exit 3) is `refused`; a sandbox that
starts is `leaked` (its probe program, given nothing to do, ends at once). Only folders that
exist under the home are asked (a grant must name something that exists), at most
MAX_FOLDERS of them; none existing is one finding saying so, not a pass of something untried.
"""

from __future__ import annotations

import argparse
import copy
import os

from lnk_cli.check.launch import Interrupts, RemoteError, run_probes
from lnk_cli.check.plan import LEAKED, REFUSED
from lnk_cli.check.verdicts import Finding, clean_text
from lnk_shared.errors import EXIT_REFUSED
from lnk_shared.login_path import login_path_dirs
from lnk_shared.refusals import inside

__all__ = ["MAX_FOLDERS", "login_path_findings"]

MAX_FOLDERS = 8  # one controller round trip each; a home has two or three of them
NO_STEPS = "[]"


def _folders(home: str) -> list[str]:
    found = login_path_dirs(os.getuid(), home)
    return [d for d in found if inside(d, home) and d != home and os.path.isdir(d)][:MAX_FOLDERS]


def login_path_findings(
    args: argparse.Namespace, home: str, interrupts: Interrupts
) -> list[Finding]:
    findings = []
    for folder in _folders(home):
        ident = f"login-path:{folder}"
        tried = f"write {folder}, on your login PATH (programs there run in your next shell)"
        asked = copy.copy(args)
        asked.write = [*(args.write or []), folder]
        try:
            run_probes(asked, NO_STEPS, interrupts)
        except RemoteError as exc:
            if exc.exit_code != EXIT_REFUSED:
                raise
            findings.append(Finding(ident, tried, REFUSED, clean_text(str(exc), 200), REFUSED))
            continue
        findings.append(Finding(ident, tried, REFUSED, "the controller built the sandbox", LEAKED))
    if not findings:
        findings.append(
            Finding(
                "login-path",
                "write a folder on your login PATH",
                REFUSED,
                "not tried: none of them exists under your home",
                REFUSED,
            )
        )
    return findings
