"""The probe step that reads the probe's own environment (`lnk sandbox check`'s caller-env
probe: lnk_cli/check/caller_env.py sets the bait outside and judges what comes back).

Part of the probe program (`probes.py`, which merges `STEPS` into its own table), run INSIDE
the sandbox with the box's Python (standard library only). It reports what it read and decides
nothing.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["ENVIRON_LIMIT", "STEPS"]

ENVIRON_LIMIT = 65536  # bytes of its own environment the probe sends back


def _own_environ(_step: dict[str, Any]) -> dict[str, Any]:
    """Inside: the probe's own environment, as the program would read it."""
    found = [f"{k}={v}" for k, v in os.environ.items()]
    with open("/proc/self/environ", "rb") as f:
        found.append(f.read(ENVIRON_LIMIT).decode("latin-1"))
    data = "\n".join(found)[:ENVIRON_LIMIT]
    return {"outcome": "through", "detail": "read its own environment", "data": data}


STEPS = {"own_environ": _own_environ}  # registered in probes.STEPS
