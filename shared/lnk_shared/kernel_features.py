"""Kernel features a box uses where the kernel has them, and says it does without otherwise.

Time namespaces (CONFIG_TIME_NS, Linux 5.6): each sandbox is born in one of its own
(`lnk-spawn --own-clock`), so /proc/uptime and the boot time in /proc/stat say how long the
sandbox has run, not when the host booted. A kernel built without them has no
/proc/self/ns/time; there a sandbox starts with the host's clocks (`lnk box up` and the
controller's log say so, and `lnk sandbox check` reports the boot time as leaked), rather than
every launch being refused.

What this does NOT do: probe a feature by using it (a namespace made and dropped at each
start); the link's presence is what the kernel offers, and a launch that still fails to make
one says why.
"""

from __future__ import annotations

import os

__all__ = ["TIME_NS_PROBE", "missing_features", "time_namespaces"]

TIME_NS_PROBE = "/proc/self/ns/time"  # present exactly when the kernel has CONFIG_TIME_NS


def time_namespaces(probe: str = TIME_NS_PROBE) -> bool:
    """Whether this kernel has time namespaces."""
    return os.path.lexists(probe)


def missing_features(time_probe: str = TIME_NS_PROBE) -> list[str]:
    """One line per feature this kernel lacks: what is off for sandboxes, and why."""
    if time_namespaces(time_probe):
        return []
    return [
        f"this kernel has no time namespaces (CONFIG_TIME_NS; {time_probe} is missing): "
        "sandboxes' own clock (--own-clock) is off, so they see when the host booted "
        "(/proc/uptime, btime); a kernel built with CONFIG_TIME_NS=y turns it on"
    ]
