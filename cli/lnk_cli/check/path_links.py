"""The check's PATH-link probe: a `[commands]` name found on PATH through links someone else
may change must be refused (lnk_shared.refusals: programs found on PATH).

The attack, as another local user would set it up: the name is found through a link in a
folder anyone may write (mode 0777, no sticky bit), so that user chooses what the name runs at
the next discovery. The check makes such a folder under a 0700 folder of its own in the
caller's home (no one else can reach it: only the rule is tried), a link `lnk-check-tool ->
/usr/bin/true` in it, and asks the controller for one "check" launch granting the name, found
on a PATH holding that folder. Judging is the controller's: a refusal (exit 3) is `refused`; a
sandbox that starts is `leaked` (its probe program, given nothing to do, ends at once).
`unsafe_path_links_unjudged` in controller.toml reopens it. Everything made is removed after.

What this does NOT try: a link of another user (the caller cannot make one), a chain longer
than the bound, or a swap of the link between judging and binding (the real program is bound
by identity: tests/e2e/test_path_links.py and test_wall_judged_identity.py).
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil

from lnk_cli.check.bait import PREFIX
from lnk_cli.check.launch import Interrupts, RemoteError, run_probes
from lnk_cli.check.plan import LEAKED, REFUSED
from lnk_cli.check.verdicts import Finding, clean_text
from lnk_shared.errors import EXIT_REFUSED
from lnk_shared.spec_flags import namespace_from_document

__all__ = ["PROBE_ID", "path_link_findings"]

PROBE_ID = "path-link:shared-folder"
TRIED = "grant a name found on PATH through a link in a folder anyone may write (0777)"
TARGET = "/usr/bin/true"  # what the link leads to: any system program will do
NO_STEPS = "[]"
SHARED_MODE = 0o777  # what the rule refuses: every user may replace the link


def _args(name: str) -> argparse.Namespace:
    args = namespace_from_document({})
    args.with_fd = []
    args.command = [name]
    return args


def path_link_findings(home: str, interrupts: Interrupts) -> list[Finding]:
    root = os.path.join(home, f"{PREFIX}path-{secrets.token_hex(6)}")
    try:
        os.mkdir(root, 0o700)
    except OSError as exc:
        why = f"not tried: cannot make a folder in your home ({exc.strerror})"
        return [Finding(PROBE_ID, TRIED, REFUSED, why, REFUSED)]
    try:
        shared = os.path.join(root, "shared")
        os.mkdir(shared)
        os.chmod(shared, SHARED_MODE)  # past the umask: the mode is the point
        name = f"{PREFIX}tool"
        os.symlink(TARGET, os.path.join(shared, name))
        try:
            run_probes(_args(name), NO_STEPS, interrupts, path_env=f"{shared}:/usr/bin:/bin")
        except RemoteError as exc:
            if exc.exit_code != EXIT_REFUSED:
                raise
            return [Finding(PROBE_ID, TRIED, REFUSED, clean_text(str(exc), 200), REFUSED)]
        built = "the controller built the sandbox granting it"
        return [Finding(PROBE_ID, TRIED, REFUSED, built, LEAKED)]
    finally:
        shutil.rmtree(root, ignore_errors=True)
