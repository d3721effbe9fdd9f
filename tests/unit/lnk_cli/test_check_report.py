"""The report: one line per probe and a summary for a person; a stable document for CI."""

from __future__ import annotations

import io
import json

from lnk_cli.check.report import (
    NOT_REFUSED_HEADING,
    REPORT_VERSION,
    print_human,
    print_json,
    summary,
)
from lnk_cli.check.verdicts import Finding

FINDINGS = [
    Finding("read.home", "read ~/lnk-check-1", "refused", "ENOENT", "refused"),
    Finding("server:127.0.0.1", "connect to the bait server", "refused", "connected", "leaked"),
    Finding("port:8080", "reach port 8080", "known gap", "connected", "known gap"),
    Finding("write.folder:/w", "write a new file in /w", "allowed", "EROFS", "refused"),
]


def test_the_json_document_has_every_field_ci_reads() -> None:
    out = io.StringIO()
    print_json(FINDINGS, out, sandbox="sbx-1", spec="/home/u/spec.toml")
    doc = json.loads(out.getvalue())
    assert doc["version"] == REPORT_VERSION
    assert (doc["sandbox"], doc["spec"], doc["leaked"]) == ("sbx-1", "/home/u/spec.toml", True)
    assert doc["summary"] == {"refused": 2, "allowed": 0, "known gap": 1, "leaked": 1}
    assert [set(p) for p in doc["probes"]] == [
        {"id", "tried", "expected", "observed", "verdict"}
    ] * len(FINDINGS)
    assert doc["probes"][1]["verdict"] == "leaked"


def test_nothing_leaked_says_so() -> None:
    out = io.StringIO()
    print_json(FINDINGS[:1], out, sandbox="s", spec=None)
    assert json.loads(out.getvalue())["leaked"] is False
    human = io.StringIO()
    print_human(FINDINGS[:1], human, spec=None, verbose=True)
    assert human.getvalue().splitlines()[-1] == "nothing leaked: 1 refused."
    assert "LEAKED" not in human.getvalue()  # the word scripts and people look for


def test_the_human_report_is_a_table_by_area_then_what_was_not_refused() -> None:
    out = io.StringIO()
    print_human(FINDINGS, out, spec=None)
    lines = out.getvalue().splitlines()
    assert lines[0] == "lnk sandbox check: the spec given by flags"
    table = lines[lines.index("") + 1 : lines.index("", 2)]
    assert table[0].split() == ["area", "probes", "refused", "allowed", "known", "gap", "leaked"]
    assert [row.split() for row in table[1:]] == [
        ["read", "1", "1", "0", "0", "0"],
        ["network", "2", "0", "0", "1", "1"],  # server: and port: are the network's
        ["write", "1", "1", "0", "0", "0"],
    ]
    details = lines[lines.index(NOT_REFUSED_HEADING) + 1 : -2]
    assert details == [
        "leaked     network  connect to the bait server: connected  (expected refused)",
        "known gap  network  reach port 8080: connected",
        "refused    write    write a new file in /w: EROFS  (expected allowed)",  # a grant failed
    ]
    assert "read ~/lnk-check-1" not in out.getvalue()  # refused as expected: only counted
    assert lines[-1].startswith("LEAKED: 2 refused, 1 known gap, 1 leaked")
    assert summary(FINDINGS)["leaked"] == 1


def test_verbose_shows_every_probe_grouped_by_area() -> None:
    out = io.StringIO()
    print_human(FINDINGS, out, spec=None, verbose=True)
    lines = out.getvalue().splitlines()
    every = lines[lines.index("every probe:") + 1 : -2]
    assert [line.split()[0] for line in every] == ["refused", "leaked", "known", "refused"]
    assert every[0] == "refused    read     read ~/lnk-check-1: ENOENT"


def test_a_probe_of_a_kind_no_table_knows_gets_an_area_of_its_own() -> None:
    new = Finding("models:local-runtime", "reach the model's runtime", "refused", "ok", "leaked")
    out = io.StringIO()
    print_human([*FINDINGS, new], out, spec=None)
    text = out.getvalue()
    assert any(line.split()[:2] == ["models", "1"] for line in text.splitlines())
    assert "leaked     models   reach the model's runtime: ok" in text


def test_no_control_character_reaches_the_terminal() -> None:
    hostile = Finding("read.hidden:~/.x", "read ~/.\x1b]0;x\x07/f", "refused", "EACCES", "refused")
    out = io.StringIO()
    print_human([hostile], out, spec="/home/u/\x1b[2Jspec.toml", verbose=True)  # shown
    assert "read ~/." in out.getvalue()
    assert "\x1b" not in out.getvalue() and "\x07" not in out.getvalue()


def test_bidi_zero_width_and_c1_are_shown_as_escapes() -> None:
    hostile = Finding("read.x", "read ~/\u202eevil\u200b", "refused", "\x9b2J", "refused")
    out = io.StringIO()
    print_human([hostile], out, spec="/home/u/\ufeffspec.toml", verbose=True)  # shown
    text = out.getvalue()
    assert "\\u202eevil\\u200b" in text and "\\x9b2J" in text and "/home/u/\\ufeffspec" in text
    assert all(line.isprintable() for line in text.splitlines())


def test_the_limit_the_sandbox_met_is_reported_both_ways() -> None:
    met = "the sandbox reached its process limit (64): 3 new processes were refused"
    out = io.StringIO()
    print_json(FINDINGS, out, sandbox="s", spec=None, limits="64 processes", limit_met=met)
    assert json.loads(out.getvalue())["limit_met"] == met
    none = io.StringIO()
    print_json(FINDINGS, none, sandbox="s", spec=None)
    assert json.loads(none.getvalue())["limit_met"] is None
    human = io.StringIO()
    print_human(FINDINGS, human, spec=None, limits="64 processes", limit_met=met + "\x1b[2J")
    lines = human.getvalue().splitlines()
    assert lines[1:3] == ["limits: 64 processes", f"limit met: {met}\\x1b[2J"]
