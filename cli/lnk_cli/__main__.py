"""Entry point of the `lnk` command."""

from __future__ import annotations

import os
import sys


def main() -> None:
    words = sys.argv[1:]
    if words[:2] == ["sandbox", "run"]:  # a sandbox's start: the path with the fewest imports
        from lnk_cli.launch_dialogue import quick_run

        status = quick_run(words[2:])
        if status is not None:
            # Without the interpreter's teardown (a quarter of this client's time): the path
            # holds no buffered data but what is flushed here, and no file or child to close.
            for stream in (sys.stdout, sys.stderr):
                try:  # noqa: SIM105 - contextlib is one more import on this path
                    stream.flush()
                except (OSError, ValueError):
                    pass
            os._exit(status)
    from lnk_cli.app import run

    sys.exit(run(words))


if __name__ == "__main__":
    main()
