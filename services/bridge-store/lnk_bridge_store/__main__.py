"""`python -m lnk_bridge_store`: load the config and run the store bridge. Nothing else here.

The bridge runs as its own system user: never root (a bug in it would then be root's), never a
uid from the range sandboxes are given (a sandbox could then signal or trace it).
"""

from __future__ import annotations

import logging
import os
import sys

from lnk_shared.errors import EXIT_USAGE, LnkError
from lnk_shared.service_identity import identity_refusal


def refuse_identity(uid: int) -> str | None:
    """Why this service must not run as `uid`, or None when it may."""
    return identity_refusal("lnk_bridge_store", uid)


def main() -> int:
    from lnk_bridge_store.config import load_config
    from lnk_bridge_store.service import run_bridge

    logging.basicConfig(level=logging.INFO, format="%(asctime)s lnk-bridge-store %(message)s")
    refusal = refuse_identity(os.geteuid()) or refuse_identity(os.getuid())
    if refusal is not None:
        print(f"lnk-bridge-store: {refusal}", file=sys.stderr)
        return EXIT_USAGE
    try:
        run_bridge(load_config())
    except LnkError as exc:
        print(f"lnk-bridge-store: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
