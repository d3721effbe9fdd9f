"""A write grant's start, one box against another, paired: only the write row, many rounds.

    sudo LNK_PREFIX=/opt/lnk-new /opt/lnk-new/venv/bin/python bench/start_ab.py \
        /opt/lnk-base /opt/lnk-new [--runs 60]

Both boxes run with limits off (`unsafe_no_limits`, so both must know the setting) and launch
`lnk sandbox run --spec write.toml -- /bin/true` on one 100-file project (start_rows.project),
one after the other each round, the order swapped every round so neither always goes first
(the first of a pair runs on the other's freed inodes and warm caches). Prints each box's
median, the median of each round's ratio B/A (p25-p75) and each box's controller phases
(judged / started / ran / cleaned, medians). A box set against itself gives ~1.00: the
method's own bias. Asserts nothing but success.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import tempfile
from contextlib import ExitStack
from pathlib import Path

from private_box import private_box
from start_rows import LIMITS_OFF, _timed, project

_PHASES = re.compile(
    r"judged ([\d.]+) ms, started ([\d.]+) ms, ran ([\d.]+) ms, cleaned ([\d.]+) ms"
)
UID_BASE = 3_100_000  # away from sandbox_start's and the e2e tests' spans


def _phases(state_dir: str) -> str:
    log = (Path(state_dir) / "logs" / "controller.log").read_text()
    rows = [tuple(map(float, m)) for m in _PHASES.findall(log)][1:]  # not the approval's
    return " / ".join(f"{statistics.median(r[k] for r in rows):.1f}" for k in range(4))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("a", type=Path, help="the prefix of box A (the baseline)")
    parser.add_argument("b", type=Path, help="the prefix of box B (the candidate)")
    parser.add_argument("--runs", type=int, default=60)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="lnk-bench-ab-"))
    spec = work / "write.toml"
    spec.write_text(f'[folders]\nwrite = ["{project(work, "write")}"]\n')
    command = ["sandbox", "run", "--spec", str(spec), "--", "/bin/true"]
    times: list[list[float]] = [[], []]
    try:
        with ExitStack() as stack:
            boxes = []
            for n, prefix in enumerate((args.a, args.b)):
                box = stack.enter_context(
                    private_box(UID_BASE + n * 100_000, 50, LIMITS_OFF, prefix)
                )
                lnk = str(prefix / "venv" / "bin" / "lnk")
                _timed([lnk, "sandbox", "run", "--yes", *command[2:]], box.env)  # approve
                boxes.append((lnk, box))
            for r in range(args.runs):
                for i in (0, 1) if r % 2 == 0 else (1, 0):
                    lnk, box = boxes[i]
                    times[i].append(_timed([lnk, *command], box.env))
            phases = [_phases(box.env["LNK_STATE_DIR"]) for _, box in boxes]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ratios = [b / a for a, b in zip(times[0], times[1], strict=True)]
    q1, _, q3 = statistics.quantiles(ratios, n=4)
    print(
        f"A {statistics.median(times[0]):.1f} ms, B {statistics.median(times[1]):.1f} ms, "
        f"paired B/A {statistics.median(ratios):.3f} ({q1:.2f}-{q3:.2f}), {args.runs} rounds"
    )
    print(f"phases (judged / started / ran / cleaned, ms): A {phases[0]}; B {phases[1]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
