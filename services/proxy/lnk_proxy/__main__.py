"""`python -m lnk_proxy`: load the config and run the proxy, as its own system user
(`lnk_shared.service_main`). Nothing else happens here."""

from __future__ import annotations

import sys

from lnk_shared.service_main import service_main


def _run() -> None:
    import asyncio

    from lnk_proxy.admin import run_proxy
    from lnk_proxy.config import load_config
    from lnk_proxy.event_loop import loop_factory

    config = load_config()
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        runner.run(run_proxy(config))


def main() -> int:
    return service_main("lnk-proxy", "lnk_proxy", _run)


if __name__ == "__main__":
    sys.exit(main())
