"""What `lnk sandbox check` tries against the shared proxy's per-sandbox caps (issue 16): what one
sandbox could pin in the proxy every sandbox shares, or blind the proxy's log with.

- **Unread tunnels** (`proxy:tunnel-caps`): `HOLD_TUNNELS` CONNECT tunnels to a host the spec
  lists, each kept open and never read, until the proxy refuses one. Each unread tunnel pins
  kernel buffers in the proxy (`lnk_proxy.tunnel_buffers`: fixed sizes, a per-sandbox budget)
  and two of its descriptors; the proxy must refuse before `HOLD_TUNNELS` (its default cap is
  256 tunnels, `max_tunnels_per_sandbox`; the buffer budget refuses earlier when it is set
  lower). The relay hands each connection to the proxy and keeps none of it
  (`lnk_proxy.handoff`), so a held tunnel costs the sandbox one descriptor (the probe's own
  socket) and no thread: 300 fit a default box's 1024 open files, so the proxy's caps are
  what refuse there too (counted, not run on a default box here). Where the
  kernel cannot name network namespaces (no `SO_NETNS_COOKIE`, Linux < 5.14) the relay still
  relays bytes (a thread and six descriptors per tunnel) and, with the box's default sandbox
  limits, runs out first near 170 tunnels: the probe says so. Either way it asks once more, to
  tell a proxy that still answers from one that fell over (`leaked`: every sandbox's way out).
  `leaked` too when every one was held open. The proxy's `unsafe_unbounded_tunnels` setting
  (test boxes only) reopens the class.
- **A refusal flood** (`proxy:refusal-flood`): `FLOOD_REFUSALS` requests the proxy always
  refuses (this machine's loopback, whatever the spec lists), one connection each. The proxy
  must fold repeats into one line with a count (`lnk_proxy.wire_log`), so the flood cannot
  fill the sandbox's log and blind it to what does go out; `leaked` when the log holds more
  than `FLOOD_LINES` lines for it, or any request was not refused. The proxy's
  `unsafe_log_every_refusal` setting reopens the class.

Both run only with `lnk sandbox check --caps`: the tunnels are hundreds of connections to a
host the spec lists (a plain check reaches each listed host once), and the flood takes a few
seconds. Without it both are named, "not tried", with the flag that runs them.

Does NOT try: the proxy's box-wide descriptor cap (it would take every sandbox's share), the
box-wide log bound, lookups in flight (a name the spec lists would be asked of the real DNS),
nor measure the kernel memory itself (it is the proxy's, which the check cannot see).
"""

from __future__ import annotations

from lnk_cli.check.plan import REFUSED, Evidence, Probe
from lnk_shared.grants import Grants

__all__ = ["FLOOD_LINES", "FLOOD_REFUSALS", "FLOOD_TARGET", "HOLD_TUNNELS", "cap_probes"]

# Past the proxy's default tunnel cap (256) with room: handed over, each costs the sandbox one
# descriptor (the probe's socket), so a default box shows whether the proxy's caps hold (a
# relay that relays bytes, on Linux < 5.14, needs six descriptors and a thread each).
HOLD_TUNNELS = 300
# Enough that one line each would be plain in the log (hundreds of lines), done in seconds.
FLOOD_REFUSALS = 500
# Lines the log may hold for the flood: the first refusal, then one count per 5 s window
# (`wire_log.AGGREGATE_WINDOW_S`) the flood spans; a slow box's flood spans a few.
FLOOD_LINES = 16
# Refused whatever the spec lists (this machine), and by address, so no name is looked up.
FLOOD_TARGET = "127.0.0.1:9"
HTTP_PORT = 80
HTTPS_PORT = 443


def _listed_target(grants: Grants) -> str | None:
    """A host:port the spec lists by one name or address, to open tunnels to; None if none."""
    spec = grants.spec
    for host in spec.internet:
        if not host.wildcard:
            return f"{host.name}:{host.port or HTTPS_PORT}"
    for entry in spec.lan:
        if entry.network is None or entry.network.num_addresses == 1:  # as plan.py's lan-host
            shown = str(entry)
            return f"[{shown}]:{HTTP_PORT}" if ":" in shown else f"{shown}:{HTTP_PORT}"
    return None


def cap_probes(grants: Grants, *, tried: bool) -> list[Probe]:
    """The two probes above for a spec with a proxy (none for one without); only named, not
    tried, unless `tried` (`lnk sandbox check --caps`)."""
    if not grants.spec.has_proxy:
        return []
    target = _listed_target(grants)
    hold = f"hold {HOLD_TUNNELS} tunnels open and unread through the proxy"
    flood = (
        f"flood the proxy with {FLOOD_REFUSALS} refused requests (CONNECT {FLOOD_TARGET}) "
        "to fill its log"
    )
    if not tried:
        why = f"run with --caps (it opens up to {HOLD_TUNNELS} tunnels to a listed host)"
        return [
            Probe("proxy:tunnel-caps", hold, REFUSED, None, not_tried=why),
            Probe("proxy:refusal-flood", flood, REFUSED, None, not_tried=why),
        ]
    probes = []
    if target is None:
        probes.append(
            Probe(
                "proxy:tunnel-caps",
                hold,
                REFUSED,
                None,
                not_tried="the spec lists no single host to open tunnels to",
            )
        )
    else:
        probes.append(
            Probe(
                "proxy:tunnel-caps",
                f"{hold} (to {target})",
                REFUSED,
                {
                    "id": "proxy:tunnel-caps",
                    "kind": "proxy_hold",
                    "target": target,
                    "count": HOLD_TUNNELS,
                },
                (Evidence("inside"),),
            )
        )
    probes.append(
        Probe(
            "proxy:refusal-flood",
            flood,
            REFUSED,
            {
                "id": "proxy:refusal-flood",
                "kind": "proxy_flood",
                "target": FLOOD_TARGET,
                "count": FLOOD_REFUSALS,
            },
            (Evidence("wire-refusals", FLOOD_TARGET, names=(str(FLOOD_LINES),)),),
        )
    )
    return probes
