"""A box service's `main`: its log lines, the identity it must not run as, and the one place
its errors become an exit status. Each service's `__main__` names itself and what it runs;
the work (loading the config, serving) happens in `run`, after the identity check.

A service other than the controller runs as its own system user: never root (a bug in it would
then be root's), never a uid from the range sandboxes are given (a sandbox could then signal or
trace it, or own its files) (`service_identity`). Both the effective and the real uid are
judged: either one is what the kernel checks for some operation.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable

from lnk_shared.errors import EXIT_OK, EXIT_USAGE, LnkError
from lnk_shared.service_identity import identity_refusal

__all__ = ["service_main"]


def service_main(name: str, module: str, run: Callable[[], None], *, own_user: bool = True) -> int:
    """Run the service `module` (its log lines and errors said as `name`); its exit status.

    `own_user`: it must run as its own system user (the controller alone runs as root)."""
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {name} %(message)s")
    if own_user:
        refusal = identity_refusal(module, os.geteuid()) or identity_refusal(module, os.getuid())
        if refusal is not None:
            print(f"{name}: {refusal}", file=sys.stderr)
            return EXIT_USAGE
    try:
        run()
    except LnkError as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return exc.exit_code
    return EXIT_OK
