"""Entry point of the `lnk` command."""

from __future__ import annotations

import sys


def main() -> None:
    from lnk_cli.app import run

    sys.exit(run(sys.argv[1:]))


if __name__ == "__main__":
    main()
