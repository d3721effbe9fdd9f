"""Who the host's OOM killer takes first when the whole machine runs out of memory: a sandbox,
never one of the box's services.

Each sandbox's memory is bounded by its own cgroup and all of them together by their common
parent (the host's memory less the box's reserve), so the host's OOM killer should only act when
something outside the sandboxes takes the reserve. Then it picks by rss plus an adjustment
(/proc/PID/oom_score_adj, -1000 to 1000, in thousandths of the machine's memory): the services
run below 0 and each sandbox above (lnk-spawn writes it as root before the drop). Where root
holds CAP_SYS_RESOURCE the kernel also makes it the sandbox's floor (a process may raise its
own, never lower it below that floor) and the services go down to SERVICE_OOM_SCORE_ADJ; a
container's root without it sets no floor and leaves the services at 0: the sandbox still
stands above them, and its Landlock ruleset (no write under /proc) keeps it there.

Does NOT stop: a kill by a cgroup's own limit (it picks within that cgroup: the sandbox's, as
its limit says); a service that grows past half the machine's memory still outscores an idle
sandbox (the adjustment only shifts the score); a host without /proc/PID/oom_score_adj.
"""

from __future__ import annotations

__all__ = ["SANDBOX_OOM_SCORE_ADJ", "SERVICE_OOM_SCORE_ADJ"]

# Half the scale up: a sandbox's score passes any service's unless that service alone holds
# more than half the machine's memory.
SANDBOX_OOM_SCORE_ADJ = 500
# Half the scale down, not -1000: a service that leaks must still be killable, last.
SERVICE_OOM_SCORE_ADJ = -500
