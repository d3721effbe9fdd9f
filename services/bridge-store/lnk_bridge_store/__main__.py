"""`python -m lnk_bridge_store`: load the config and run the store bridge, as its own system
user (`lnk_shared.service_main`). Nothing else happens here."""

from __future__ import annotations

import sys

from lnk_shared.service_main import service_main


def _run() -> None:
    from lnk_bridge_store.config import load_config
    from lnk_bridge_store.service import run_bridge

    run_bridge(load_config())


def main() -> int:
    return service_main("lnk-bridge-store", "lnk_bridge_store", _run)


if __name__ == "__main__":
    sys.exit(main())
