"""`python -m lnk_proxy`: load the config and run the proxy. Nothing else happens here.

The proxy runs as its own system user: never root (a bug in it would then be root's), never a
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
    return identity_refusal("lnk_proxy", uid)


def main() -> int:
    import asyncio

    from lnk_proxy.admin import run_proxy
    from lnk_proxy.config import load_config
    from lnk_proxy.event_loop import loop_factory

    logging.basicConfig(level=logging.INFO, format="%(asctime)s lnk-proxy %(message)s")
    refusal = refuse_identity(os.geteuid()) or refuse_identity(os.getuid())
    if refusal is not None:
        print(f"lnk-proxy: {refusal}", file=sys.stderr)
        return EXIT_USAGE
    try:
        config = load_config()
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            runner.run(run_proxy(config))
    except LnkError as exc:
        print(f"lnk-proxy: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
