"""The controller's CPU at rest, this box against an earlier one, in one run: both controllers
measured over the same window (so the machine's load falls on both), first with no sandbox, then
with one idle sandbox each (`sleep`), as ms of CPU per second of wall time (utime + stime of
every thread, /proc/PID/stat).

    flock /work/bench.lock env LNK_PREFIX=/opt/lnk /opt/lnk/venv/bin/python \
        bench/controller_idle.py --old-prefix P [--seconds 60] [--internet-host example.com]

Also the busiest threads of each (by tid: Python does not name them for the kernel), so a
periodic thread stands out, and every other process of each box over the same window (the
proxy, the store bridge, the log keepers of `lnk box up`), found by the box's LNK_RUN_DIR in
their environment.
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
OTHERS: dict[str, str] = {}  # the last window's line for each box's other processes


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


def _box_processes(box: PrivateBox, controller: int) -> dict[int, str]:
    """The box's other processes (pid: what runs), by LNK_RUN_DIR=<its run dir> in theirs."""
    mark = f"LNK_RUN_DIR={box.env['LNK_RUN_DIR']}".encode()
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in (controller, os.getpid()):
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if mark in environ:
            modules = [a.decode() for a in argv if a.startswith(b"lnk_")]
            found[int(entry)] = modules[0] if modules else os.path.basename(argv[0].decode())
    return found


def _others(boxes: dict[str, tuple[PrivateBox, int]]) -> dict[str, dict[int, float]]:
    """Each box's other processes' CPU ms so far, by pid."""
    now: dict[str, dict[int, float]] = {}
    for label, (box, controller) in boxes.items():
        now[label] = {}
        for pid in _box_processes(box, controller):
            try:
                now[label][pid] = _ms(Path(f"/proc/{pid}/stat"))
            except OSError:
                continue
    return now


def _window(
    pids: dict[str, int], seconds: float, boxes: dict[str, tuple[PrivateBox, int]]
) -> dict[str, tuple[float, list[str]]]:
    """ms/s of each controller over one window, and its busiest threads' ms/s (and into
    OTHERS, each box's other processes' ms/s by kind)."""
    names = {label: _box_processes(box, c) for label, (box, c) in boxes.items()}
    before = {label: (_ms(Path(f"/proc/{pid}/stat")), _threads(pid)) for label, pid in pids.items()}
    others0 = _others(boxes)
    t0 = time.monotonic()
    time.sleep(seconds)  # the measuring window itself, not a wait for anything
    wall = time.monotonic() - t0
    others1 = _others(boxes)
    for label in boxes:
        kinds: dict[str, float] = {}
        for pid, ms in others1[label].items():
            if pid in others0[label]:
                kind = names[label].get(pid, "?")
                kinds[kind] = kinds.get(kind, 0.0) + (ms - others0[label][pid]) / wall
        said = " ".join(f"{kind}:{rate:.2f}" for kind, rate in sorted(kinds.items()))
        OTHERS[label] = f"    {label:4} its other processes (ms/s, summed by kind): {said}"
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
    for line in OTHERS.values():
        print(line)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--old-prefix", type=Path, required=True)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument(  # a sandbox with a proxy listener: the controller keeps it, the proxy
        "--internet-host",  # serves it (nothing is dialed: the sandbox only sleeps)
        help="the idle sandbox gets [internet] hosts = [HOST]",
    )
    args = parser.parse_args()
    with ExitStack() as stack:
        boxes = {}
        for n, (label, prefix) in enumerate((("old", args.old_prefix), ("this", PREFIX))):
            box = stack.enter_context(private_box(UID_BASE + n * 100_000, 100, "", prefix))
            boxes[label] = (box, str(prefix / "venv" / "bin" / "lnk"))
        pids = {label: _controller_pid(box) for label, (box, _) in boxes.items()}
        measured = {label: (box, pids[label]) for label, (box, _) in boxes.items()}
        time.sleep(SETTLE_S)  # let each start's own work end before the window
        print(f"load before: {Path('/proc/loadavg').read_text().strip()}")
        _print("no sandbox", _window(pids, args.seconds, measured))
        sleepers = []
        for box, lnk in boxes.values():
            net = [f"--internet-host={args.internet_host}"] if args.internet_host else []
            argv = [lnk, "sandbox", "run", "--yes", *net, "--", "/usr/bin/sleep", "3600"]
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
        _print("one idle sandbox", _window(pids, args.seconds, measured))
        print(f"load after: {Path('/proc/loadavg').read_text().strip()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
