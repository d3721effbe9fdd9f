"""`python -m lnk_controller`: load the config and run the controller, the one service that runs
as root (`lnk_shared.service_main`). Nothing else happens here."""

from __future__ import annotations

import sys

from lnk_shared.service_main import service_main


def _run() -> None:
    from lnk_controller.config import load_config
    from lnk_controller.service import run_controller

    run_controller(load_config())


def main() -> int:
    return service_main("lnk-controller", "lnk_controller", _run, own_user=False)


if __name__ == "__main__":
    sys.exit(main())
