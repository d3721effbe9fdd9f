"""Keep a background loop running: a thread whose body ends by any exception (or returns before
it was told to stop) is logged and started again, after a back-off that grows while it keeps
dying at once and starts over once it has run RESTART_RESET_S.

The supervisor's own loop does nothing that can fail but start threads and wait on them.

Does NOT: notice a body that hangs without ending (a hung body is the body's own bound to keep);
restart anything after the process itself dies (the service manager's job, and the next start's
reconcile).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

__all__ = ["RESTART_FIRST_S", "RESTART_MAX_S", "RESTART_RESET_S", "restart_delay", "supervise"]

log = logging.getLogger(__name__)

RESTART_FIRST_S = 0.05  # a body that died is started again this soon: its duty waits meanwhile
# At most this long: it bounds how long a dying body's duty (the reaper's leases) waits, and
# caps a body that dies at once every time at a few logged tracebacks a second.
RESTART_MAX_S = 0.5
RESTART_RESET_S = 5.0  # a body that ran this long died of something new: start at the first


def restart_delay(deaths_in_a_row: int) -> float:
    """Seconds before starting a body that has died `deaths_in_a_row` times without running
    RESTART_RESET_S in between (>= 1)."""
    if deaths_in_a_row < 1:
        return 0.0
    return min(RESTART_FIRST_S * float(2 ** min(deaths_in_a_row - 1, 32)), RESTART_MAX_S)


def _guarded(name: str, body: Callable[[threading.Event], None], stop: threading.Event) -> None:
    try:
        body(stop)
    except BaseException:  # logged here; the supervisor starts it again
        log.exception("%s thread ended by an exception", name)


def supervise(
    name: str, body: Callable[[threading.Event], None], stop: threading.Event
) -> threading.Thread:
    """Run `body(stop)` in a thread of its own, started again whenever it ends before `stop`
    is set; returns the supervisor's thread (a daemon, ending once `stop` is set)."""

    def supervisor() -> None:
        deaths = 0
        while not stop.is_set():
            worker = threading.Thread(
                target=_guarded, args=(name, body, stop), name=name, daemon=True
            )
            started = time.monotonic()
            worker.start()
            worker.join()
            if stop.is_set():
                return
            deaths = 1 if time.monotonic() - started >= RESTART_RESET_S else deaths + 1
            delay = restart_delay(deaths)
            log.error("%s thread ended: restarted in %.2f s", name, delay)
            stop.wait(delay)

    thread = threading.Thread(target=supervisor, name=f"{name}-supervisor", daemon=True)
    thread.start()
    return thread
