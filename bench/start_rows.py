"""Sandbox start by kind of launch and by box, side by side in one run (sandbox_start.py --rows).

    sudo /opt/lnk/venv/bin/python bench/sandbox_start.py --rows [--old-prefix /opt/lnk-old]
    sudo /opt/lnk/venv/bin/python bench/sandbox_start.py --rows --protections

With --protections the boxes are the shipped one (limits off) and one more per wall switch of
PROTECTION_SWITCHES, turned on (`unsafe_...`, a test setting): each ratio below 1 is what that
protection costs.

Boxes, all up at once, their launches interleaved so every one sees the same machine:
- `old`: the box installed in --old-prefix (a checkout of an earlier commit, installed with
  `LNK_PREFIX=... ./scripts/install`), when given; its config carries no [limits] (it may
  predate them);
- `limits off`: this box with limits.unsafe_no_limits;
- `limits on`: this box as any box runs it.
Rows: `lnk sandbox run -- /bin/true` plain, with `--read` of a small project folder, and with
`--write` of one (PROJECT_DIRS x PROJECT_FILES files), against bare bwrap /bin/true. Each
cell is the median in ms with its ratio to bare bwrap and to the first box's same row; below,
each box's paired ratio to the first (the median of each round's ratio, one round being every
box's launch of a row back to back) and its controller phases for each row (judged, started,
ran, cleaned: its log's line per launch, in launch order, so the n-th line is the n-th launch
of that box).

The projects (and every box's state) live under $TMPDIR (tempfile's folder). The header names
its filesystem and, for ext4, whether it keeps a journal: a journal-less ext4 (this machine's
root) looks, for each new inode, past every inode its group freed in the last 30 s
(`recently_deleted` in `find_inode_bit`), and a write grant makes and removes ~49 placeholders
a launch, so its `started` phase grows with the bench's own rate of launches. To see the rows
on a journaled ext4, as Debian's installer makes it:

    truncate -s 2G /var/tmp/j.img && mkfs.ext4 -q /var/tmp/j.img && mkdir -p /mnt/j
    mount -o loop /var/tmp/j.img /mnt/j && chmod 1777 /mnt/j
    TMPDIR=/mnt/j sudo -E /opt/lnk/venv/bin/python bench/sandbox_start.py --rows ...
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from private_box import PREFIX, PrivateBox, private_box

PROJECT_DIRS, PROJECT_FILES = 10, 10  # a small project: 100 files in 10 folders
ROW_NAMES = ("plain", "read grant", "write grant")


def project(root: Path, name: str) -> Path:
    """A folder of PROJECT_DIRS x PROJECT_FILES small files, owned by the bench's caller."""
    top = root / name
    for d in range(PROJECT_DIRS):
        (top / f"d{d}").mkdir(parents=True)
        for f in range(PROJECT_FILES):
            (top / f"d{d}" / f"f{f}.txt").write_text("x\n")
    return top


def _timed(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    ran = subprocess.run(argv, env=env, check=False, stdin=subprocess.DEVNULL, capture_output=True)
    elapsed = (time.perf_counter() - start) * 1000
    if ran.returncode != 0:
        raise RuntimeError(f"{argv} exited {ran.returncode}: {ran.stderr[-400:]!r}")
    return elapsed


def _phase_rows(box: PrivateBox, skip: int, rows: int) -> list[list[tuple[float, ...]]]:
    """Each row's phase tuples from the box's log, skipping its first `skip` launches."""
    from sandbox_start import _PHASE  # one pattern for both reports

    log = Path(box.env["LNK_STATE_DIR"]) / "logs" / "controller.log"
    lines = [tuple(map(float, m.groups())) for m in _PHASE.finditer(log.read_text())][skip:]
    return [lines[r::rows] for r in range(rows)]


# Each wall protection's switch that acts at a launch of these rows (config.WALL_SWITCHES):
# a box with one turned off, against the shipped box, shows what that protection costs.
PROTECTION_SWITCHES = (
    "unsafe_protected_names_unguarded",
    "unsafe_skip_mode_sweep",
    "unsafe_command_line_visible",
    "unsafe_writable_dev",
    "unsafe_host_identity",
    "unsafe_skip_identity_check",
    "unsafe_login_path_unjudged",
    "unsafe_loader_maps_anything",
    "unsafe_host_clock",
)
LIMITS_OFF = "[limits]\nunsafe_no_limits = true\n"


def boxes_for(protections: bool, old_prefix: Path | None) -> list[tuple[str, Path, str]]:
    """(label, prefix, controller.toml lines) of each box, the one the others are set against
    first: the old box and limits on and off; or, with `protections`, the shipped box (limits
    off, so only the wall differs) and one box per switch."""
    if protections:
        return [
            ("all on", PREFIX, LIMITS_OFF),
            *((s, PREFIX, f"{s} = true\n{LIMITS_OFF}") for s in PROTECTION_SWITCHES),
        ]
    old = [("old", old_prefix, "")] if old_prefix is not None else []
    return [*old, ("limits off", PREFIX, LIMITS_OFF), ("limits on", PREFIX, "[limits]\n")]


def filesystem(path: Path) -> str:
    """The filesystem holding path: its type and source, and for ext4 whether it has a journal
    (jbd2 lists a journaled ext4 device as /proc/fs/jbd2/<device>-<journal inode>)."""
    found = subprocess.run(
        ["findmnt", "--noheadings", "--output", "FSTYPE,SOURCE", "--target", str(path)],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.splitlines()[-1:]  # the last: the mount on top where one is mounted over another
    found = found[0].split() if found else []
    if len(found) != 2:
        return "unknown filesystem"
    fstype, source = found
    if fstype != "ext4":
        return f"{fstype} on {source}"
    device = Path(source).name
    jbd2 = Path("/proc/fs/jbd2")
    journaled = jbd2.is_dir() and any(e.name.startswith(f"{device}-") for e in jbd2.iterdir())
    return f"ext4 on {source}, {'with a journal' if journaled else 'no journal'}"


def rows_main(
    runs: int, boxes_wanted: list[tuple[str, Path, str]], bare: list[str], uid_base: int
) -> int:
    work = Path(tempfile.mkdtemp(prefix="lnk-bench-rows-"))
    print(f"projects in {work.parent}: {filesystem(work)}")
    read_dir, write_dir = project(work, "read"), project(work, "write")
    # spec files, not flags: a box keeps one approval for the flags' spec, one for each file
    (work / "read.toml").write_text(f'[folders]\nread = ["{read_dir}"]\n')
    (work / "write.toml").write_text(f'[folders]\nwrite = ["{write_dir}"]\n')
    commands = [
        ["sandbox", "run", "--", "/bin/true"],
        ["sandbox", "run", "--spec", str(work / "read.toml"), "--", "/bin/true"],
        ["sandbox", "run", "--spec", str(work / "write.toml"), "--", "/bin/true"],
    ]
    try:
        with ExitStack() as stack:
            boxes = [
                (label, str(prefix / "venv" / "bin" / "lnk"), box)
                for n, (label, prefix, config) in enumerate(boxes_wanted)
                # each box its own span of uid blocks (two boxes in one span could meet)
                for box in [
                    stack.enter_context(private_box(uid_base + n * 100_000, 100, config, prefix))
                ]
            ]
            for _, lnk, box in boxes:  # approve each spec once
                for c in commands:
                    _timed([lnk, *c[:2], "--yes", *c[2:]], box.env)
            times: dict[tuple[str, int], list[float]] = {}
            bare_ms: list[float] = []
            for _ in range(runs):
                for r, c in enumerate(commands):
                    for label, lnk, box in boxes:
                        times.setdefault((label, r), []).append(_timed([lnk, *c], box.env))
                bare_ms.append(_timed(bare, boxes[0][2].env))
            phases = {
                label: _phase_rows(box, len(commands), len(commands)) for label, _, box in boxes
            }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _report(runs, [label for label, _, _ in boxes], times, bare_ms, phases)
    return 0


def _report(
    runs: int,
    labels: list[str],
    times: dict[tuple[str, int], list[float]],
    bare_ms: list[float],
    phases: dict[str, list[list[tuple[float, ...]]]],
) -> None:
    """One line per box: each row's median, its ratio to bare bwrap and to the first box."""
    bm = statistics.median(bare_ms)
    base = labels[0]
    print(f"runs: {runs}; bare bwrap /bin/true median {bm:.1f} ms")
    print(f"median ms (x bare bwrap, x {base})")
    print(f"{'':34}" + "".join(f"{name:>24}" for name in ROW_NAMES))
    for label in labels:
        cells = []
        for r in range(len(ROW_NAMES)):
            m = statistics.median(times[(label, r)])
            vs = statistics.median(times[(base, r)])
            cells.append(f"{m:7.1f} ({m / bm:4.1f}x {m / vs:4.2f})")
        print(f"{label:34}" + "".join(f"{c:>24}" for c in cells))
    # Each round runs every box's launch of a row back to back, so a ratio within one round
    # sees one load: their median moves less with the load's swings than a ratio of medians.
    print(f"paired: median of each round's ratio to {base} (its p25-p75)")
    for label in labels:
        cells = []
        for r in range(len(ROW_NAMES)):
            ratios = [a / b for a, b in zip(times[(label, r)], times[(base, r)], strict=True)]
            q1, _, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else (0, 0, 0)
            cells.append(f"{statistics.median(ratios):4.2f} ({q1:4.2f}-{q3:4.2f})")
        print(f"{label:34}" + "".join(f"{c:>24}" for c in cells))
    print("controller phases, median ms: judged / started / ran / cleaned")
    for label in labels:
        cells = [
            " / ".join(f"{statistics.median(p[i] for p in rows):.0f}" for i in range(4))
            for rows in phases[label]
        ]
        print(f"{label:34}" + "".join(f"{c:>24}" for c in cells))
