"""The `lnk` command's exit statuses, as `--help` and the README say them.

Every command exits 0 ok, 1 anything else, 2 a usage or spec error, 3 refused by a rule
(lnk_shared.errors). A command that runs a program exits with the program's own status, so its
own failures take the statuses `env`, `timeout` and `docker run` use, which a program is unlikely
to use for its own: 125, 126, 127 (each error's `run_exit_code`).
"""

from __future__ import annotations

# typing.TYPE_CHECKING without importing typing, which `lnk sandbox run` never needs.
TYPE_CHECKING = False

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["EPILOG", "RUNS", "RUN_EPILOG", "runs_a_program"]

EPILOG = """\
exit status:
  0  ok
  1  anything else (not approved, the box's state unusable, ...)
  2  usage error, or a spec that cannot be read (file, line and key named)
  3  refused by a rule (the rule and the entry named)

exit status of a command that runs a program (lnk sandbox run, lnk sandbox enter,
lnk agent start), as env, timeout and docker run:
  N    the program's own status (128+S when a signal S ended it; 137 when its lease ended)
  125  lnk's own error: a usage or spec error, the box not running, ... (nothing ran)
  126  refused by a rule, not approved, or the program cannot be run
  127  the program is not found
"""
RUN_EPILOG = """\
exit status: the program's own (128+S when a signal S ended it, 137 when its lease ended);
125 lnk's own error (usage, spec, the box not running: nothing ran), 126 refused by a rule,
not approved, or the program cannot be run, 127 the program is not found."""

# The commands that run a program and exit with its status: their own errors are 125-127.
RUNS = frozenset({("sandbox", "run"), ("sandbox", "enter"), ("agent", "start")})


def runs_a_program(words: Sequence[str]) -> bool:
    """Whether `words` (after `lnk`) name a command that runs a program: RUN_EPILOG's statuses."""
    return tuple(words[:2]) in RUNS
