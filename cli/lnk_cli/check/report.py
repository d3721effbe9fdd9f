"""The check's report: one line per probe for a person, or a stable JSON document for CI.

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

from lnk_cli.check.verdicts import VERDICTS, Finding, clean_text

__all__ = ["REPORT_VERSION", "print_human", "print_json", "summary"]

REPORT_VERSION = 1


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
) -> None:
    out.write(f"lnk sandbox check: {clean_text(spec or 'the spec given by flags', 4096)}\n")
    if limits:
        out.write(f"limits: {clean_text(limits)}\n")
    if limit_met:
        out.write(f"limit met: {clean_text(limit_met)}\n")
    for f in findings:  # paths in them are names from disk: no control character gets out
        note = "" if f.verdict == f.expected else f"  (expected {f.expected})"
        tried, observed = clean_text(f.tried, 4096), clean_text(f.observed, 4096)
        out.write(f"{f.verdict:<9}  {tried}: {observed}{note}\n")
    counts = summary(findings)
    parts = ", ".join(f"{n} {v}" for v, n in counts.items() if n)
    if counts["leaked"]:
        out.write(f"LEAKED: {parts}. Something got out that no grant allows.\n")
    else:
        out.write(f"nothing leaked: {parts}.\n")
