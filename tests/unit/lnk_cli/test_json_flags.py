"""Every command that lists or reports has `--json` for scripts: the parser is walked, so a
command added later must be put in one of the tables below, and a report without --json fails."""

from __future__ import annotations

import argparse

from lnk_cli.app import build_parser, leaves

# What lists or reports: scripts read these, so each has --json.
REPORTS = {
    ("sandbox", "list"),
    ("sandbox", "show"),
    ("sandbox", "wire"),
    ("sandbox", "check"),
    ("spec", "show"),
    ("spec", "list"),
    ("box", "status"),
    ("box", "authorize"),  # --list
    ("agent", "list"),
    ("secret", "list"),
}
# Inside an agent's sandbox: their answer is the bridge's JSON, always.
JSON_ALWAYS = {
    ("bridge", "store", "append"),
    ("bridge", "store", "read"),
    ("bridge", "store", "lease"),
    ("bridge", "inbox", "read"),
    ("bridge", "inbox", "ack"),
    ("bridge", "inbox", "send"),
}
# What acts: its exit status is its answer (and a line for a person).
ACTIONS = {
    ("sandbox", "run"),
    ("sandbox", "stop"),
    ("sandbox", "pause"),
    ("sandbox", "resume"),
    ("sandbox", "lease"),
    ("sandbox", "enter"),
    ("spec", "approve"),
    ("spec", "forget"),
    ("box", "up"),
    ("box", "down"),
    ("box", "prune"),
    ("agent", "create"),
    ("agent", "start"),
    ("agent", "stop"),
    ("agent", "remove"),
    ("agent", "send"),
    ("secret", "set"),
    ("secret", "remove"),
}


def _has_json(parser: argparse.ArgumentParser) -> bool:
    return any("--json" in a.option_strings for a in parser._actions)


def test_every_command_is_a_report_or_an_action_and_every_report_has_json() -> None:
    commands = dict(leaves(build_parser()))
    unclassified = set(commands) - REPORTS - JSON_ALWAYS - ACTIONS
    assert not unclassified, f"put each in REPORTS or ACTIONS: {sorted(unclassified)}"
    assert not (REPORTS | JSON_ALWAYS | ACTIONS) - set(commands), "a command listed is gone"
    missing = sorted(" ".join(p) for p in REPORTS if not _has_json(commands[p]))
    assert not missing, f"these list or report without --json: {missing}"
