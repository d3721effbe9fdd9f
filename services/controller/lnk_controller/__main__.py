"""`python -m lnk_controller`: load the config and run the controller. Nothing else happens here."""

from __future__ import annotations

import logging
import sys

from lnk_shared.errors import LnkError


def main() -> int:
    from lnk_controller.config import load_config
    from lnk_controller.service import run_controller

    logging.basicConfig(level=logging.INFO, format="%(asctime)s lnk-controller %(message)s")
    try:
        run_controller(load_config())
    except LnkError as exc:
        print(f"lnk-controller: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
