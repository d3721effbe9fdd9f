"""The wire's log: one JSON line per decision, untrusted texts cleaned of control characters
and cut at 300 characters, files 0640 appended without following links, bounded in size."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import pytest

from lnk_proxy import wire_log
from lnk_proxy.wire_log import LOG_LIMIT, WireEntry, WireLog, format_line

NOW = datetime(2030, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)


def entry(**changes: object) -> WireEntry:
    base: dict[str, object] = {
        "sandbox": "sbx-0123abcd",
        "method": "CONNECT",
        "target": "www.example.com:443",
        "decision": "allowed",
        "rule": "allowed-internet",
        "address": "198.51.100.7",
        "up": 517,
        "down": 4242,
        "reason": "'www.example.com' at 198.51.100.7",
    }
    base.update(changes)
    return WireEntry(**base)  # type: ignore[arg-type]


def test_a_line_holds_every_field() -> None:
    line = format_line(entry(), NOW)
    assert line.endswith("\n")
    assert line.count("\n") == 1
    document = json.loads(line)
    assert document == {
        "time": "2030-01-02T03:04:05.678+00:00",
        "sandbox": "sbx-0123abcd",
        "method": "CONNECT",
        "target": "www.example.com:443",
        "address": "198.51.100.7",
        "decision": "allowed",
        "rule": "allowed-internet",
        "up": 517,
        "down": 4242,
        "reason": "'www.example.com' at 198.51.100.7",
    }


def test_an_error_is_logged_only_when_there_is_one() -> None:
    assert "error" not in json.loads(format_line(entry(), NOW))
    assert json.loads(format_line(entry(error="dial failed"), NOW))["error"] == "dial failed"


def test_a_10_kb_hostname_is_cut_to_300_characters() -> None:
    host = "a" * 10_000 + ".example"
    document = json.loads(format_line(entry(target=host, reason=f"{host!r} not listed"), NOW))
    assert len(document["target"]) == LOG_LIMIT
    assert document["target"].endswith("…")
    assert len(document["reason"]) <= 2 * LOG_LIMIT


@pytest.mark.parametrize(
    "hostile",
    [
        "\x1b[31mred\x1b[0m.example",  # terminal colours
        "evil\x1b]0;title\x07.example",  # terminal title
        "a\r\nb.example",  # a forged second line
        "a\u2028b.example",  # a Unicode line separator
        "\u202eelpmaxe.evil",  # a bidi override
        "nul\x00.example",
    ],
)
def test_escape_sequences_and_line_breaks_are_removed(hostile: str) -> None:
    line = format_line(entry(target=hostile, method=hostile, reason=hostile, error=hostile), NOW)
    assert line.count("\n") == 1
    document = json.loads(line)
    for key in ("target", "method", "reason", "error"):
        assert not any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in document[key])
        assert "\u2028" not in document[key]
        assert "\u202e" not in document[key]


@pytest.mark.parametrize("sandbox", ["", "../etc", "a/b", ".hidden", "x" * 65, "sbx\n1"])
def test_a_bad_sandbox_id_is_refused(sandbox: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="sandbox id"):
        format_line(entry(sandbox=sandbox), NOW)
    with pytest.raises(ValueError, match="sandbox id"):
        WireLog(tmp_path).write(entry(sandbox=sandbox))


def test_lines_are_appended_to_the_sandbox_file_with_mode_0640(tmp_path: Path) -> None:
    log = WireLog(tmp_path / "wire")
    log.prepare()
    old = os.umask(0o077)
    try:
        log.write(entry())
        log.write(entry(decision="refused", rule="not-listed", address=""))
    finally:
        os.umask(old)
    path = tmp_path / "wire" / "sbx-0123abcd.log"
    lines = path.read_text(encoding="ascii").splitlines()
    assert [json.loads(line)["decision"] for line in lines] == ["allowed", "refused"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert stat.S_IMODE((tmp_path / "wire").stat().st_mode) == 0o750


def test_a_link_planted_at_the_log_is_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("untouched\n")
    log = WireLog(tmp_path)
    (tmp_path / "sbx-1.log").symlink_to(victim)
    log.write(entry(sandbox="sbx-1"))
    assert victim.read_text() == "untouched\n"


def test_a_full_log_drops_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wire_log, "MAX_LOG_BYTES", 1000)
    log = WireLog(tmp_path)
    for _ in range(20):
        log.write(entry())
    size = (tmp_path / "sbx-0123abcd.log").stat().st_size
    assert 0 < size <= 1000


def lines_of(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_repeated_refusals_are_one_line_then_one_count_per_window() -> None:
    counter = wire_log.RefusalCounter(window_s=5, max_keys=2)
    a, b = ("not-listed", "CONNECT", "a:443", ""), ("not-listed", "GET", "a:443", "")
    c = ("x", "", "c", "")
    assert counter.admit(a, 0.0) is True  # the first is written at once
    assert [counter.admit(a, t) for t in (1.0, 2.0, 3.0)] == [False] * 3
    assert counter.admit(b, 1.0) is True  # another method is another refusal
    assert counter.admit(c, 1.0) is False  # past max_keys: counted by rule, "many targets"
    assert counter.admit(("x", "", "d", ""), 1.5) is False
    assert counter.due(4.0) == []
    assert counter.due(5.0) == [(a, 3)]  # b had no repeats: nothing to add
    assert counter.due(0, every=True) == [(("x", "", wire_log.MANY_TARGETS, ""), 2)]
    assert counter.admit(a, 6.0) is True  # a new window


def test_a_refusal_flood_leaves_room_for_allowed_lines(tmp_path: Path) -> None:
    log = WireLog(tmp_path, max_bytes=64 * 1024)
    path = tmp_path / "sbx-0123abcd.log"
    for i in range(5000):  # every target new: aggregation cannot fold them
        log.write(entry(decision="refused", rule="not-listed", target=f"h{i}.example:443"))
    log.flush("sbx-0123abcd", every=True)
    assert path.stat().st_size <= log.refusal_bytes
    assert log.can_admit("sbx-0123abcd")
    admitted = 0
    while log.can_admit("sbx-0123abcd"):
        log.write(entry())  # allowed decisions still fit, until the margin is reached
        admitted += 1
    assert admitted > 10
    assert path.stat().st_size <= log.max_bytes
    allowed = [line for line in lines_of(path) if line["decision"] == "allowed"]
    assert len(allowed) == admitted


def test_refusals_for_another_reason_are_not_hidden_in_the_first_ones_count() -> None:
    """One rule refuses for several reasons (a hosted rule: a refused model, then a refused
    spelling of a tool): each reason's first refusal is written at once, not counted into the
    first reason's line, where a reader (and check) would never see it."""
    counter = wire_log.RefusalCounter(window_s=5, max_keys=8)
    model = ("hosted", "POST", "api:443", "model not listed")
    spelling = ("hosted", "POST", "api:443", "a fetch key spelt with an escape")
    assert counter.admit(model, 0.0) is True
    assert counter.admit(model, 0.5) is False
    assert counter.admit(spelling, 1.0) is True
    assert counter.due(5.0) == [(model, 1)]


def test_a_second_reason_of_one_rule_and_target_is_written_at_once(tmp_path: Path) -> None:
    """Through the log itself: the key the log builds holds the reason (it once held only the
    rule, method and target, so the second reason was counted into the first's line)."""
    log = WireLog(tmp_path)
    log.write(entry(decision="refused", rule="hosted", reason="model not listed"))
    log.write(entry(decision="refused", rule="hosted", reason="a fetch key spelt with an escape"))
    reasons = [line["reason"] for line in lines_of(tmp_path / "sbx-0123abcd.log")]
    assert reasons == ["model not listed", "a fetch key spelt with an escape"]


def test_a_count_line_says_the_reason_it_counts(tmp_path: Path) -> None:
    log = WireLog(tmp_path)
    for _ in range(3):
        log.write(entry(decision="refused", rule="not-listed", reason="not in [internet]"))
    log.close("sbx-0123abcd")
    _, summary = lines_of(tmp_path / "sbx-0123abcd.log")
    assert summary["repeated"] == 2
    assert summary["reason"] == "2 more like it within 5 s: not in [internet]"


def test_the_counts_of_a_closed_sandbox_are_written(tmp_path: Path) -> None:
    log = WireLog(tmp_path)
    for _ in range(4):
        log.write(entry(decision="refused", rule="not-listed"))
    log.close("sbx-0123abcd")
    first, summary = lines_of(tmp_path / "sbx-0123abcd.log")
    assert "repeated" not in first
    assert (summary["rule"], summary["target"], summary["repeated"]) == (
        "not-listed",
        "www.example.com:443",
        3,
    )


def test_the_box_bound_counts_every_sandboxs_log_and_refuses_before_anything_goes_unlogged(
    tmp_path: Path,
) -> None:
    """Ended sandboxes' logs fill the folder to near the box's bound: a running sandbox with
    room in its own log is no longer admitted (`log-full`), its refusals stop at three
    quarters, and once retention removes an ended log it is admitted again."""
    box = 256 * 1024
    log = WireLog(tmp_path, max_bytes=box, box_max_bytes=box)
    (tmp_path / "sbx-ended1.log").write_bytes(b"x" * (box // 2))
    (tmp_path / "sbx-ended2.log").write_bytes(b"x" * (box // 4))
    (tmp_path / "other.txt").write_bytes(b"y" * box)  # not a wire log: not counted
    assert log.box_used() == box * 3 // 4
    # Refusals: dropped at the box's refusal share (three quarters, already reached).
    log.write(entry(decision="refused", rule="not-listed", target="new.example:443"))
    assert (
        not (tmp_path / "sbx-0123abcd.log").exists()
        or lines_of(tmp_path / "sbx-0123abcd.log") == []
    )
    admitted = 0
    while log.can_admit("sbx-0123abcd"):
        log.write(entry())
        admitted += 1
        assert admitted < 10_000, "the box's bound was never reached"
    assert admitted > 10  # allowed lines used the last quarter
    assert log.box_used() + log.box_admit_margin > box
    assert sum(p.stat().st_size for p in tmp_path.glob("*.log")) <= box  # on disk
    (tmp_path / "sbx-ended1.log").unlink()  # retention removed the oldest ended one
    log._box_scanned -= wire_log.BOX_SCAN_S  # the next scan is due (instead of a 1 s wait)
    assert log.can_admit("sbx-0123abcd")
    assert len(lines_of(tmp_path / "sbx-0123abcd.log")) == admitted  # every admitted one logged


def test_with_a_scanner_the_folder_is_sized_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scan runs on the scanner's thread; its result counts once back; until then the
    last count stands."""
    box = 256 * 1024
    (tmp_path / "sbx-ended.log").write_bytes(b"x" * (box // 2))
    threads: list[str] = []
    real = wire_log._folder_size

    def sized(directory: Path) -> int:
        threads.append(threading.current_thread().name)
        return real(directory)

    monkeypatch.setattr(wire_log, "_folder_size", sized)

    async def run() -> tuple[int, int]:
        log = WireLog(tmp_path, max_bytes=box, box_max_bytes=box)
        scanner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="scan")
        log.scanner = scanner
        try:
            first = log.box_used()  # the scan started: nothing counted yet
            while log._scanning is not None:
                await asyncio.sleep(0.01)
            return first, log.box_used()
        finally:
            scanner.shutdown()

    first, after = asyncio.run(run())
    assert (first, after) == (0, box // 2)
    assert threads and threads[0].startswith("scan")


def test_unsafe_every_refusal_writes_each_repeat_and_lets_refusals_take_the_whole_log(
    tmp_path: Path,
) -> None:
    # what `lnk sandbox check`'s refusal flood must see reopened (and the default must not)
    for unsafe, most_lines in ((False, 1), (True, 200)):
        folder = tmp_path / str(unsafe)
        folder.mkdir()
        log = WireLog(folder, max_bytes=64 * 1024, unsafe_every_refusal=unsafe)
        for _ in range(200):
            log.write(entry(decision="refused", rule="not-listed"))
        assert len(lines_of(folder / "sbx-0123abcd.log")) == most_lines
    (tmp_path / "full").mkdir()
    log = WireLog(tmp_path / "full", max_bytes=64 * 1024, unsafe_every_refusal=True)
    for i in range(5000):
        log.write(entry(decision="refused", rule="not-listed", target=f"h{i}.example:443"))
    assert (tmp_path / "full" / "sbx-0123abcd.log").stat().st_size > log.max_bytes * 3 // 4
    assert not log.can_admit("sbx-0123abcd")  # blinded: nothing new may go out
