"""The controller's CPU at rest, this box against an earlier one, in one run: both controllers
measured over the same window (so the machine's load falls on both), first with no sandbox, then
with one idle sandbox each (`sleep`), as ms of CPU per second of wall time (utime + stime of
every thread, /proc/PID/stat).

    flock /work/bench.lock env LNK_PREFIX=/opt/lnk /opt/lnk/venv/bin/python \
        bench/controller_idle.py --old-prefix P [--seconds 60]

Also the busiest threads of each (by tid: Python does not name them for the kernel), so a
periodic thread stands out.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

from private_box import PREFIX, PrivateBox, private_box

UID_BASE = 2_120_000_000  # this bench's span of uid blocks, away from the other benches'
TICK_MS = 1000 / os.sysconf("SC_CLK_TCK")
SETTLE_S = 3.0  # after a box's start or a sandbox's: its start's own work is not counted
TOP_THREADS = 3


def _controller_pid(box: PrivateBox) -> int:
    return int((Path(box.env["LNK_RUN_DIR"]) / "controller.pid").read_text())


def _ms(stat: Path) -> float:
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * TICK_MS  # utime + stime


def _threads(pid: int) -> dict[str, float]:
    found = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found[task.name] = _ms(task / "stat")
        except OSError:
            continue  # a thread that ended meanwhile
    return found


def _window(pids: dict[str, int], seconds: float) -> dict[str, tuple[float, list[str]]]:
    """ms/s of each controller over one window, and its busiest threads' ms/s."""
    before = {label: (_ms(Path(f"/proc/{pid}/stat")), _threads(pid)) for label, pid in pids.items()}
    t0 = time.monotonic()
    time.sleep(seconds)  # the measuring window itself, not a wait for anything
    wall = time.monotonic() - t0
    out = {}
    for label, pid in pids.items():
        total0, threads0 = before[label]
        threads = _threads(pid)
        busy = sorted(((ms - threads0.get(tid, 0.0)) / wall, tid) for tid, ms in threads.items())[
            ::-1
        ][:TOP_THREADS]
        rows = [f"{tid}{'(main)' if tid == str(pid) else ''}:{rate:.2f}" for rate, tid in busy]
        out[label] = ((_ms(Path(f"/proc/{pid}/stat")) - total0) / wall, rows)
    return out


def _print(title: str, got: dict[str, tuple[float, list[str]]]) -> None:
    old, new = got["old"][0], got["this"][0]
    ratio = f"{new / old:.2f}" if old else "-"
    print(f"{title}: old {old:.2f} ms/s, this {new:.2f} ms/s, this/old {ratio}")
    for label, (_, rows) in got.items():
        print(f"    {label:4} busiest threads (tid:ms/s): {' '.join(rows)}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--old-prefix", type=Path, required=True)
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    with ExitStack() as stack:
        boxes = {}
        for n, (label, prefix) in enumerate((("old", args.old_prefix), ("this", PREFIX))):
            box = stack.enter_context(private_box(UID_BASE + n * 100_000, 100, "", prefix))
            boxes[label] = (box, str(prefix / "venv" / "bin" / "lnk"))
        pids = {label: _controller_pid(box) for label, (box, _) in boxes.items()}
        time.sleep(SETTLE_S)  # let each start's own work end before the window
        print(f"load before: {Path('/proc/loadavg').read_text().strip()}")
        _print("no sandbox", _window(pids, args.seconds))
        sleepers = []
        for box, lnk in boxes.values():
            argv = [lnk, "sandbox", "run", "--yes", "--", "/usr/bin/sleep", "3600"]
            sleepers.append(
                subprocess.Popen(
                    argv, env=box.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL
                )
            )
            stack.callback(sleepers[-1].wait, 60)
            stack.callback(sleepers[-1].terminate)
        time.sleep(SETTLE_S)
        for box, lnk in boxes.values():
            listed = subprocess.run(
                [lnk, "sandbox", "list", "--json"], env=box.env, capture_output=True, text=True
            )
            if '"running"' not in listed.stdout:
                print(f"a sandbox is not running: {listed.stdout} {listed.stderr}", file=sys.stderr)
                return 1
        _print("one idle sandbox", _window(pids, args.seconds))
        print(f"load after: {Path('/proc/loadavg').read_text().strip()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
