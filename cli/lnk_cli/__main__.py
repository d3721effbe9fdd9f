"""Entry point of the `lnk` command."""

from __future__ import annotations

import sys


def main() -> None:
    words = sys.argv[1:]
    if words[:2] == ["sandbox", "run"]:  # a sandbox's start: the path with the fewest imports
        from lnk_cli.quick_run import quick_run

        status = quick_run(words[2:])
        if status is not None:
            sys.exit(status)
    from lnk_cli.app import run

    sys.exit(run(words))


if __name__ == "__main__":
    main()
