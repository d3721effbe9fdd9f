"""Each probe's verdict, from what the sandbox answered and what the outside saw. Pure.

The sandbox's answer is hostile input (`untrusted_…`): it is checked for shape, its text cut
and every control, bidi and zero-width character in it shown as an escape
(`lnk_shared.display.shown`), and it can only make a verdict worse, never better, where
the outside can see for itself. For a file read, a listing, a file written or marked and the
process status and the modes left on disk, the outside's evidence decides (a secret found in
anything the sandbox printed, a name of the real folder, a file that exists, an mtime that
moved, a mode left by what the filter cannot refuse). A set-id or shared-write mode or an ACL
the sandbox could set is a leak when either side saw it: it was there while the sandbox ran.
For connections and the confiner's folder (whose probe removes at once what it made), the
sandbox's answer and the outside's (the bait server's accept log, the proxy's wire log, the
folder's identity) are joined: either one seeing it get through is enough.

verdict = leaked   when it got through and no grant allows it
          allowed  when it got through and a grant allows it (or a grant allows it and trying
                   would leave this machine: then "not tried")
          known gap  when it got through and the wall documents it does not stop it
          refused  when it did not get through
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lnk_cli.check.plan import ALLOWED, KNOWN_GAP, LEAKED, REFUSED, Evidence, Probe
from lnk_cli.check.plan_models import NAMES_SHOWN, not_allowed
from lnk_inside.probes import MARKER_TIME
from lnk_shared.display import shown_cut
from lnk_shared.errors import StateError

__all__ = ["VERDICTS", "Finding", "Outside", "ProbesFailed", "judge_all", "judge_probe"]

VERDICTS = (REFUSED, ALLOWED, KNOWN_GAP, LEAKED)
DETAIL_LIMIT = 160  # characters of the sandbox's own words shown per probe
# Seconds a boot time may differ from this machine's and still be it: btime is the wall clock
# less the boot clock, whole seconds, so a clock step (NTP) moves it by one or so.
CLOCK_SLACK = 2
# Evidence the outside sees for itself: it alone decides the probe.
# ("mode" is not: a set-id bit the sandbox set leaks while it runs, even if swept after it;
# "mode-swept" is, for what the filter cannot refuse and only the sweep strips.)
_DECISIVE = frozenset(
    {
        "secret",
        "clock",
        "names",
        "created",
        "marked",
        "privilege",
        "mode-swept",
        "identity",
        "staging",
        "cmdline",
        "listing",
    }
)
_PRIVILEGE_CAPS = ("CapInh", "CapPrm", "CapEff", "CapAmb")


class ProbesFailed(StateError):
    """The probes did not report: the sandbox was not built or did not run them."""


@dataclass(frozen=True)
class Outside:
    """What the outside saw after the sandbox ended."""

    exists: Mapping[str, bool] = field(default_factory=dict)
    mtimes: Mapping[str, int] = field(default_factory=dict)
    accepted: Sequence[str] = ()  # the first line of each bait-server connection
    abstract_accepts: int = 0
    wire_allowed: frozenset[str] = frozenset()
    wire_refusals: Mapping[str, int] = field(default_factory=dict)  # refusal lines per target
    wire_refused: frozenset[str] = frozenset()  # `TARGET RULE: REASON` of each refusal
    confiner_after: Mapping[str, Any] = field(default_factory=dict)
    output: str = ""  # everything the sandbox printed
    appended_kept: bool = True  # the append-only stderr still starts with what was there
    modes: Mapping[str, int] = field(default_factory=dict)  # st_mode of what a probe made
    acls: frozenset[str] = frozenset()  # paths that hold a POSIX ACL after the run
    # What the check saw while the sandbox ran, as a user other than its own (outside_look.py):
    # evidence kind -> what got through, or None.
    during: Mapping[str, str | None] = field(default_factory=dict)


@dataclass(frozen=True)
class Finding:
    id: str
    tried: str
    expected: str
    observed: str
    verdict: str


def clean_text(untrusted: object, limit: int = DETAIL_LIMIT) -> str:
    text = untrusted if isinstance(untrusted, str) else json.dumps(untrusted)[:limit]
    return shown_cut(text, limit)


def _result(untrusted: object) -> tuple[bool, str, Any] | None:
    """(got through inside, detail, data) from one step's answer, or None if malformed."""
    if not isinstance(untrusted, dict):
        return None
    outcome = untrusted.get("outcome")
    if outcome not in ("through", "stopped"):
        return None
    return outcome == "through", clean_text(untrusted.get("detail", "")), untrusted.get("data")


def _privileged(data: Any, owner_uid: int) -> str | None:
    if not isinstance(data, dict):
        return "its status was not readable"
    if data.get("NoNewPrivs") != "1":
        return "no_new_privs is off"
    if data.get("Seccomp") != "2":
        return "no seccomp filter"
    for cap in _PRIVILEGE_CAPS:
        if data.get(cap) != "0000000000000000":
            return f"{cap} is {clean_text(data.get(cap), 20)}"
    uids = str(data.get("Uid", "")).split()
    if not uids or "0" in uids or str(owner_uid) in uids:
        return f"it runs as uid {clean_text(' '.join(uids), 40)}"
    return None


def _mode_left(e: Evidence, outside: Outside) -> str | None:
    """A mode with any of the evidence's bits, or an ACL, on what the probe made (outside)."""
    for path in e.names:
        if path in outside.acls:
            return f"{path} has a POSIX ACL outside"
        mode = outside.modes.get(path)
        if mode is not None and mode & int(e.value):
            return f"{path} is {oct(mode & 0o7777)} outside"
    return None


def _wire_said(e: Evidence, outside: Outside) -> str | None:
    """`wire`: an allowed decision for the target `value`; `wire-refusals`: more refusal lines
    for it than `names[0]` (a flood the log did not fold)."""
    if e.kind == "wire":
        return "the proxy's log shows it allowed" if e.value in outside.wire_allowed else None
    lines = outside.wire_refusals.get(str(e.value), 0)
    if lines > int(e.names[0]):
        return f"the proxy's log holds {lines} lines for it (at most {e.names[0]} expected)"
    return None


def _listed(e: Evidence, data: Any) -> str | None:
    """The models a listing's answer named that its rule (`value`) does not allow, or None."""
    names = not_allowed(e.value, e.path, data)
    if not names:
        return None
    shown = ", ".join(clean_text(n, 60) for n in names[:NAMES_SHOWN])
    more = f" and {len(names) - NAMES_SHOWN} more" if len(names) > NAMES_SHOWN else ""
    return f"it listed {shown}{more}, which the rule does not allow"


def _costlier(data: Any, ratio: float) -> str | None:
    """`cost`: the deep body's least time over the flat one's past `ratio` (plan_bodies), or
    no times to compare (the probe did not measure: counted as through, never as refused)."""
    times = data if isinstance(data, dict) else {}
    deep, flat = times.get("deep"), times.get("flat")
    if not all(
        isinstance(t, list) and t and all(isinstance(x, int | float) and x >= 0 for x in t)
        for t in (deep, flat)
    ):
        return "no times came back to compare"
    assert isinstance(deep, list) and isinstance(flat, list)
    seen = min(deep) / max(min(flat), 1e-6)
    if seen > ratio:
        return (
            f"the deep body took {seen:.1f}x the flat one's time to be refused (the least of"
            f" {len(deep)} each; {ratio:g}x is a leak): its nesting was counted level by level"
        )
    return None


def _unsaid(value: tuple[str, str], outside: Outside) -> str | None:
    """None when a refusal of `value[0]` (a target) in the wire log says `value[1]`."""
    target, said = value
    lines = [r for r in outside.wire_refused if r.startswith(f"{target} ")]
    if any(said in r for r in lines):
        return None
    return f"the proxy's refusal does not say {said!r} (it was not judged so)"


def _seen(e: Evidence, probe: Probe, data: Any, outside: Outside) -> str | None:
    """What the outside saw get through for this piece of evidence, or None."""
    kind = e.kind
    if kind == "secret":
        if e.value in json.dumps(data) or e.value in outside.output:
            return "the secret came back"
        return None
    if kind == "clock":
        seen = data.get("btime") if isinstance(data, dict) else None
        if isinstance(seen, int) and abs(seen - int(e.value)) <= CLOCK_SLACK:
            return "it read when this machine booted"
        return None
    if kind == "names":
        names = data if isinstance(data, list) else []
        common = set(e.names) & {n for n in names if isinstance(n, str)}
        return f"it listed {len(common)} real names" if common else None
    if kind == "created":
        return f"{e.path} exists outside" if outside.exists.get(e.path) else None
    if kind == "marked":
        marked = outside.mtimes.get(e.path) == MARKER_TIME * 1_000_000_000
        return f"{e.path} was changed outside" if marked else None
    if kind == "server":
        mine = f"lnk-check {probe.id}"
        ours = {a for a in outside.accepted if a.startswith("lnk-check ")}
        if mine in outside.accepted or any(a not in ours for a in outside.accepted):
            return "the bait server accepted a connection"
        return None
    if kind in ("wire", "wire-refusals"):
        return _wire_said(e, outside)
    if kind == "wire-said":
        return _unsaid(e.value, outside)
    if kind == "abstract":
        return "the socket accepted a connection" if outside.abstract_accepts else None
    if kind == "confiner":
        changed = outside.confiner_after.get(e.path) != e.value
        return "the folder changed outside" if changed else None
    if kind == "privilege":
        return _privileged(data, int(e.value))
    if kind == "appended":
        return None if outside.appended_kept else "what was there before was truncated"
    if kind in ("mode", "mode-swept"):
        return _mode_left(e, outside)
    if kind == "identity":
        if data == e.value:
            return None
        return f"another object than the one judged is bound at {e.path}"
    if kind in ("staging", "cmdline"):
        if kind not in outside.during:
            raise ProbesFailed(
                f"the check did not look at the sandbox while it ran ({probe.id}): "
                "the check is not complete"
            )
        return outside.during[kind]
    return None


def _seen_any(e: Evidence, probe: Probe, data: Any, outside: Outside) -> str | None:
    """`_seen`, a model listing's answer and a cost's times (each read alone, so kept out of
    its chain)."""
    if e.kind == "cost":
        return _costlier(data, float(e.value))
    return _listed(e, data) if e.kind == "listing" else _seen(e, probe, data, outside)


def judge_probe(probe: Probe, untrusted_result: object, outside: Outside) -> Finding:
    if probe.step is None:
        verdict = probe.expected if probe.expected != REFUSED else REFUSED
        return Finding(
            probe.id, probe.tried, probe.expected, f"not tried: {probe.not_tried}", verdict
        )
    if isinstance(untrusted_result, dict) and untrusted_result.get("outcome") == "error":
        said = clean_text(untrusted_result.get("detail", ""))
        raise ProbesFailed(f"the probe {probe.id!r} failed ({said}): the check is not complete")
    parsed = _result(untrusted_result)
    if parsed is None:
        raise ProbesFailed(f"the probe {probe.id!r} did not report: the check is not complete")
    inside_through, detail, data = parsed
    seen = [s for e in probe.evidence if (s := _seen_any(e, probe, data, outside)) is not None]
    decisive = any(e.kind in _DECISIVE for e in probe.evidence)
    through = bool(seen) if decisive else inside_through or bool(seen)
    observed = "; ".join([detail, *seen]) if detail else "; ".join(seen)
    if probe.expected == REFUSED:
        verdict = LEAKED if through else REFUSED
    else:
        verdict = probe.expected if through else REFUSED
    return Finding(probe.id, probe.tried, probe.expected, observed or "-", verdict)


def judge_all(
    probes: Sequence[Probe], untrusted_results: object, outside: Outside
) -> list[Finding]:
    if not isinstance(untrusted_results, dict):
        raise ProbesFailed("the probes sent back no results: the check is not complete")
    return [judge_probe(p, untrusted_results.get(p.id), outside) for p in probes]
