"""`wire_log.format_line` builds its JSON by hand: byte for byte what `json.JSONEncoder` with
the log's options writes for the same fields in the same order, for texts that need escaping,
cutting or neither, and for the optional fields; with its fixed fields' text kept from earlier
lines, the same bytes again."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone

import pytest

from lnk_proxy.http_request import LOG_LIMIT, cut_for_log
from lnk_proxy.wire_log import (
    MAX_KEPT_FIELDS,
    METHOD_LIMIT,
    REASON_LIMIT,
    KeptFields,
    WireEntry,
    format_line,
)

ENCODER = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"))
NOW = datetime(2026, 12, 1, 18, 30, 5, 123456, tzinfo=timezone(timedelta(hours=2)))


def expected(entry: WireEntry) -> str:
    document: dict[str, str | int] = {
        "time": NOW.astimezone(UTC).isoformat(timespec="milliseconds"),
        "sandbox": entry.sandbox,
        "method": cut_for_log(entry.method, METHOD_LIMIT),
        "target": cut_for_log(entry.target, LOG_LIMIT),
        "address": cut_for_log(entry.address, LOG_LIMIT),
        "decision": entry.decision,
        "rule": cut_for_log(entry.rule, METHOD_LIMIT),
        "up": entry.up,
        "down": entry.down,
        "reason": cut_for_log(entry.reason, REASON_LIMIT),
    }
    if entry.error:
        document["error"] = cut_for_log(entry.error, REASON_LIMIT)
    if entry.repeated:
        document["repeated"] = entry.repeated
    return ENCODER.encode(document) + "\n"


@pytest.mark.parametrize(
    "entry",
    [
        WireEntry("sbx-1", "GET", "http://a.example/", "allowed", "internet", "192.0.2.1", 80, 9),
        WireEntry("sbx-1", "", "", "refused", "too-many-connections", reason="9 open"),
        WireEntry("s", "G\x1b[31m", 'http://x/"\\\u202e\u00e9\U0001f600', "refused", "r"),
        WireEntry("s", "M" * 100, "t" * 1000, "allowed", "x", "::1", reason="w" * 2000),
        WireEntry("s", "GET", "x", "allowed", "x", error="ended: OSError('\n\t')"),
        WireEntry("s", "GET", "x", "refused", "x", reason="3 more", repeated=3),
    ],
    ids=["allowed", "empty", "escapes", "cut", "error", "repeated"],
)
def test_a_line_is_what_the_json_encoder_writes(entry: WireEntry) -> None:
    line = format_line(entry, NOW)
    assert line == expected(entry)
    assert json.loads(line)["sandbox"] == entry.sandbox
    kept: KeptFields = {}
    assert format_line(entry, NOW, kept) == line  # kept now
    again = replace(entry, up=entry.up + 7, down=entry.down * 3, error=entry.error or "e")
    assert format_line(again, NOW, kept) == expected(again)  # the kept text, other counts


def test_the_kept_fields_are_bounded_and_never_mix_entries() -> None:
    kept: KeptFields = {}
    for number in range(2 * MAX_KEPT_FIELDS):
        entry = WireEntry("s", "GET", f"http://h{number}/", "allowed", "x", "192.0.2.1")
        assert format_line(entry, NOW, kept) == expected(entry)
    assert len(kept) <= MAX_KEPT_FIELDS
    refused = WireEntry("s", "GET", "http://h1/", "refused", "x", "192.0.2.1")
    assert format_line(refused, NOW, kept) == expected(refused)


def test_a_bad_sandbox_id_is_refused() -> None:
    with pytest.raises(ValueError, match="not a sandbox id"):
        format_line(WireEntry("../x", "GET", "x", "allowed", "x"), NOW)
