"""The check's report: for a person, a table of verdicts by area (read, write, exec, kernel,
network, proxy, services, ...: check/areas.py) and a line for each probe not refused (with
`--verbose`, every probe); for CI, a stable JSON document, which areas do not change.

JSON (`REPORT_VERSION` 1):
    {"version": 1, "sandbox": ID, "spec": PATH | null, "leaked": BOOL, "limits": TEXT,
     "limit_met": TEXT | null,
     "summary": {"refused": N, "allowed": N, "known gap": N, "leaked": N},
     "probes": [{"id", "tried", "expected", "observed", "verdict"}, ...]}
Probe ids are stable across runs (paths and addresses in them are this machine's); new probes
may be added, fields are never renamed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TextIO

from lnk_cli.check.areas import area_of, in_order
from lnk_cli.check.plan import REFUSED
from lnk_cli.check.verdicts import VERDICTS, Finding, clean_text
from lnk_cli.tables import table

__all__ = ["REPORT_VERSION", "human_lines", "print_human", "print_json", "summary"]

REPORT_VERSION = 1
# Above the lines of what a person should look at: what got through (allowed, a known gap,
# leaked) and a grant that did not work (refused where a grant allows it).
NOT_REFUSED_HEADING = "not refused, or not as expected (--verbose: every probe):"
AREA_WIDTH = 24  # characters of an area's name shown: a kind is a short word from a probe id


def summary(findings: Sequence[Finding]) -> dict[str, int]:
    return {v: sum(1 for f in findings if f.verdict == v) for v in VERDICTS}


def print_json(
    findings: Sequence[Finding],
    out: TextIO,
    *,
    sandbox: str,
    spec: str | None,
    limits: str = "",
    limit_met: str = "",
) -> None:
    counts = summary(findings)
    doc = {
        "version": REPORT_VERSION,
        "sandbox": sandbox,
        "spec": spec,
        "leaked": counts["leaked"] > 0,
        "limits": limits,  # as the controller set them; the limits:* probes try them
        # The limit the sandbox met, in the words `lnk sandbox run` uses (null: none).
        "limit_met": limit_met or None,
        "summary": counts,
        "probes": [
            {
                "id": f.id,
                "tried": f.tried,
                "expected": f.expected,
                "observed": f.observed,
                "verdict": f.verdict,
            }
            for f in findings
        ],
    }
    json.dump(doc, out, indent=2)
    out.write("\n")


def print_human(
    findings: Sequence[Finding],
    out: TextIO,
    *,
    spec: str | None,
    limits: str = "",
    limit_met: str = "",
    verbose: bool = False,
) -> None:
    """A table of verdicts by area, then one line for each probe that was not refused or not as
    expected (every probe with `verbose`), then the summary."""
    for line in human_lines(
        findings, spec=spec, limits=limits, limit_met=limit_met, verbose=verbose
    ):
        out.write(line + "\n")


def human_lines(
    findings: Sequence[Finding],
    *,
    spec: str | None,
    limits: str = "",
    limit_met: str = "",
    verbose: bool = False,
) -> list[str]:
    lines = [f"lnk sandbox check: {clean_text(spec or 'the spec given by flags', 4096)}"]
    if limits:
        lines.append(f"limits: {clean_text(limits)}")
    if limit_met:
        lines.append(f"limit met: {clean_text(limit_met)}")
    areas = in_order(f.id for f in findings)
    by_area = {a: [f for f in findings if area_of(f.id) == a] for a in areas}
    rows = [
        [
            clean_text(a, AREA_WIDTH),
            str(len(fs)),
            *(str(sum(f.verdict == v for f in fs)) for v in VERDICTS),
        ]
        for a, fs in by_area.items()
    ]
    # Lower case: the verdicts' own words; "LEAKED" is printed only when something leaked.
    header = ["area", "probes", *VERDICTS]
    lines += ["", *table(header, rows)]
    shown = [
        f
        for a in areas
        for f in by_area[a]
        if verbose or f.verdict != REFUSED or f.verdict != f.expected
    ]
    if shown:
        width = max(len(clean_text(a, AREA_WIDTH)) for a in areas)
        lines += ["", "every probe:" if verbose else NOT_REFUSED_HEADING]
        for f in shown:  # paths in them are names from disk: no control character gets out
            note = "" if f.verdict == f.expected else f"  (expected {f.expected})"
            tried, observed = clean_text(f.tried, 4096), clean_text(f.observed, 4096)
            area = clean_text(area_of(f.id), AREA_WIDTH).ljust(width)
            lines.append(f"{f.verdict:<9}  {area}  {tried}: {observed}{note}")
    counts = summary(findings)
    parts = ", ".join(f"{n} {v}" for v, n in counts.items() if n)
    lines.append("")
    if counts["leaked"]:
        lines.append(f"LEAKED: {parts}. Something got out that no grant allows.")
    else:
        lines.append(f"nothing leaked: {parts}.")
    return lines
