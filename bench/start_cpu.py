"""The CPU a plain sandbox start costs, this box against an earlier one, in one run: a figure the
machine's load moves far less than the wall clock (other runs only add wall time, not the work
a launch itself does), for a loaded shared machine where a 10 % wall-clock gap cannot be seen.

    sudo LNK_PREFIX=/opt/lnk /opt/lnk/venv/bin/python bench/start_cpu.py --old-prefix P [--runs 40]

Two private boxes (the old one as it ships, or with limits off too with --old-limits-off; this
one with limits off, as in sandbox_start.py --rows' `limits off` row), their `lnk sandbox run
-- /bin/true` launches interleaved. Each
controller is moved into a v1 `cpuacct` group of its own at the start, so its sandboxes' chain
(lnk-spawn, bwrap, the confiner, the program: born there, and with limits off never moved to
another cpuacct group) is counted with it, in nanoseconds. Per launch: that group's CPU,
split into the controller's own (all its threads, /proc/PID/stat) and the rest (the chain);
the client's own CPU; and the group's CPU while idle for the same time (the controller's
background threads: the lease reaper, the denials reader), which the launch figure includes.
Needs a v1 `cpuacct` hierarchy (hybrid hosts); it says so and exits where there is none.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

from private_box import PREFIX, PrivateBox, private_box

CPUACCT = Path("/sys/fs/cgroup/cpuacct")
UID_BASE = 2_100_000_000  # this bench's span of uid blocks, away from sandbox_start.py's
IDLE_S = 5.0  # the idle measure's length: periodic threads (an older reaper's 0.25 s) average out
TICK_MS = 1000 / os.sysconf("SC_CLK_TCK")


def _controller_pid(box: PrivateBox) -> int:
    return int((Path(box.env["LNK_RUN_DIR"]) / "controller.pid").read_text())


def _own_ms(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * TICK_MS  # utime + stime, every thread


def _group_ms(group: Path) -> float:
    return int((group / "cpuacct.usage").read_text()) / 1e6


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--old-prefix", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument(
        "--old-limits-off", action="store_true", help="the old box with limits off too"
    )
    args = parser.parse_args()
    if not (CPUACCT / "cpuacct.usage").exists():
        print(f"no v1 cpuacct hierarchy at {CPUACCT}: this bench needs one", file=sys.stderr)
        return 2
    limits_off = "[limits]\nunsafe_no_limits = true\n"
    boxes = [
        ("old", args.old_prefix, limits_off if args.old_limits_off else ""),
        ("this", PREFIX, limits_off),
    ]
    with ExitStack() as stack:
        running = []
        for n, (label, prefix, config) in enumerate(boxes):
            box = stack.enter_context(private_box(UID_BASE + n * 100_000, 100, config, prefix))
            group = CPUACCT / f"lnk-bench-cpu-{os.getpid()}-{label}"
            group.mkdir()
            stack.callback(_remove_group, group)
            (group / "cgroup.procs").write_text(str(_controller_pid(box)))
            lnk = str(prefix / "venv" / "bin" / "lnk")
            _run([lnk, "sandbox", "run", "--yes", "--", "/bin/true"], box.env)  # approve once
            running.append((label, lnk, box, group))
        sums = {label: [0.0, 0.0, 0.0, 0.0] for label, *_ in running}  # group, own, client, wall
        for _ in range(args.runs):
            for label, lnk, box, group in running:
                pid = _controller_pid(box)
                g0, o0, c0, w0 = _group_ms(group), _own_ms(pid), _client_ms(), time.monotonic()
                _run([lnk, "sandbox", "run", "--", "/bin/true"], box.env)
                deltas = (_group_ms(group) - g0, _own_ms(pid) - o0, _client_ms() - c0)
                for i, d in enumerate((*deltas, (time.monotonic() - w0) * 1000)):
                    sums[label][i] += d
        idle = {label: _idle_ms_per_s(group) for label, _, _, group in running}
    print(f"runs: {args.runs}; per launch, ms of CPU (mean); the wall clock's mean for scale")
    print(f"{'':6} {'group':>7} {'ctrl':>7} {'chain':>7} {'client':>7} {'idle/s':>7} {'wall':>7}")
    for label, (total, own, client, wall) in sums.items():
        t, o, c, w = (x / args.runs for x in (total, own, client, wall))
        print(f"{label:6} {t:7.2f} {o:7.2f} {t - o:7.2f} {c:7.2f} {idle[label]:7.2f} {w:7.1f}")
    return 0


def _run(argv: list[str], env: dict[str, str]) -> None:
    subprocess.run(argv, env=env, check=True, stdin=subprocess.DEVNULL, capture_output=True)


def _client_ms() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (usage.ru_utime + usage.ru_stime) * 1000


def _idle_ms_per_s(group: Path) -> float:
    before = _group_ms(group)
    time.sleep(IDLE_S)  # a measuring window, not a wait for anything
    return (_group_ms(group) - before) / IDLE_S


def _remove_group(group: Path) -> None:
    """Move what is in the group (its controller, before its box goes down) back to the root,
    then remove it."""
    for pid in (group / "cgroup.procs").read_text().split():
        (CPUACCT / "cgroup.procs").write_text(pid)
    group.rmdir()


if __name__ == "__main__":
    sys.exit(main())
