"""What a box's state folder holds after many launches: one private box, N write-grant launches
(`lnk sandbox run --write DIR -- /bin/true`, the launch that grew it ~57 KB each), the folder's
parts measured every --every launches (the database and its WAL, the wire logs, the logs,
the rest), then after a `lnk box prune`.

    flock /work/bench.lock env LNK_PREFIX=/opt/lnk /opt/lnk/venv/bin/python \
        bench/state_growth.py [--launches 100] [--every 20] [--config 'ended_keep_count = 10']

Sizes are allocated bytes (st_blocks), as `du` counts them.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from private_box import PREFIX, private_box

UID_BASE = 2_140_000_000  # this bench's span of uid blocks, away from the other benches'
PARTS = ("controller.db", "controller.db-wal", "controller.db-shm", "wire", "logs")


def _du(path: Path) -> int:
    if path.is_symlink() or not path.is_dir():
        try:
            return path.lstat().st_blocks * 512
        except FileNotFoundError:
            return 0
    total = path.lstat().st_blocks * 512
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except FileNotFoundError:
                continue
    return total


def _sizes(state: Path) -> dict[str, int]:
    sizes = {part: _du(state / part) for part in PARTS}
    sizes["rest"] = _du(state) - sum(sizes.values())
    sizes["total"] = _du(state)
    return sizes


def _line(label: str, sizes: dict[str, int]) -> str:
    cells = " ".join(f"{sizes[k] / 1024:9.0f}" for k in (*PARTS, "rest", "total"))
    return f"{label:>10} {cells}"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--launches", type=int, default=100)
    parser.add_argument("--every", type=int, default=20)
    parser.add_argument("--config", default="", help="lines added to the box's controller.toml")
    args = parser.parse_args()
    lnk = str(PREFIX / "venv" / "bin" / "lnk")
    work = Path(tempfile.mkdtemp(prefix="lnk-bench-growth-"))
    config = args.config.replace("\\n", "\n") + "\n"
    with private_box(UID_BASE, 100, config) as box:
        state = Path(box.env["LNK_STATE_DIR"])
        argv = [lnk, "sandbox", "run", "--yes", "--write", str(work), "--", "/bin/true"]
        print(f"{'launches':>10} " + " ".join(f"{p[-9:]:>9}" for p in (*PARTS, "rest", "total")))
        print(_line("0", _sizes(state)) + "  (KiB)")
        for n in range(1, args.launches + 1):
            subprocess.run(argv, env=box.env, cwd=work, check=True, capture_output=True)
            if n % args.every == 0:
                print(_line(str(n), _sizes(state)))
        subprocess.run([lnk, "box", "prune"], env=box.env, check=True, capture_output=True)
        print(_line("pruned", _sizes(state)))
    work.rmdir()
    return 0


if __name__ == "__main__":
    sys.exit(main())
