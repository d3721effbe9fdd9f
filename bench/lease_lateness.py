"""How late the reaper kills a sandbox after its lease's end, this box against an earlier one, in
one run: a `sleep` sandbox in each box in turn, its lease set to 1 s (`lnk sandbox lease`, which
prints the end), and the time from that end to the controller's log line `lease of ID expired:
killing its processes` (the log's clock has milliseconds: the lateness is to about 1 ms).

    flock /work/bench.lock env LNK_PREFIX=/opt/lnk /opt/lnk/venv/bin/python \
        bench/lease_lateness.py --old-prefix P [--rounds 8]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path

from private_box import PREFIX, PrivateBox, private_box

UID_BASE = 2_130_000_000  # this bench's span of uid blocks, away from the other benches'
SETTLE_S = 30.0  # a hang guard for a sandbox to start or end
POLL_S = 0.02


def _lnk(lnk: str, box: PrivateBox, *args: str) -> str:
    done = subprocess.run([lnk, *args], env=box.env, capture_output=True, text=True, check=True)
    return done.stdout


def _running(lnk: str, box: PrivateBox) -> str:
    deadline = time.monotonic() + SETTLE_S
    while time.monotonic() < deadline:
        rows = json.loads(_lnk(lnk, box, "sandbox", "list", "--json") or "[]")
        if rows and rows[0]["state"] == "running":
            return str(rows[0]["id"])
        time.sleep(POLL_S)
    raise SystemExit("the sandbox did not start")


def _killed_at(box: PrivateBox, sandbox_id: str) -> datetime:
    log = Path(box.env["LNK_STATE_DIR"]) / "logs" / "controller.log"
    deadline = time.monotonic() + SETTLE_S
    pattern = re.compile(rf"^(\S+ \S+) \S+ lease of {sandbox_id} expired", re.M)
    while time.monotonic() < deadline:
        found = pattern.search(log.read_text())
        if found:  # logging's asctime: local time, here UTC
            return datetime.strptime(found[1], "%Y-%m-%d %H:%M:%S,%f").replace(tzinfo=UTC)
        time.sleep(POLL_S)
    raise SystemExit(f"no kill of {sandbox_id} logged")


def _one(lnk: str, box: PrivateBox) -> float:
    argv = [lnk, "sandbox", "run", "--yes", "--", "/usr/bin/sleep", "600"]
    client = subprocess.Popen(
        argv, env=box.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL
    )
    try:
        sandbox_id = _running(lnk, box)
        said = _lnk(lnk, box, "sandbox", "lease", sandbox_id, "--seconds", "1")
        until = datetime.fromisoformat(said.rsplit("lease until ", 1)[1].strip())
        client.wait(SETTLE_S)
        return (_killed_at(box, sandbox_id) - until).total_seconds() * 1000
    finally:
        client.kill()
        client.wait()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--old-prefix", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    late: dict[str, list[float]] = {"old": [], "this": []}
    with ExitStack() as stack:
        boxes = []
        for n, (label, prefix) in enumerate((("old", args.old_prefix), ("this", PREFIX))):
            box = stack.enter_context(private_box(UID_BASE + n * 100_000, 100, "", prefix))
            boxes.append((label, str(prefix / "venv" / "bin" / "lnk"), box))
        print(f"load before: {Path('/proc/loadavg').read_text().strip()}")
        for _ in range(args.rounds):
            for label, lnk, box in boxes:
                late[label].append(_one(lnk, box))
        print(f"load after: {Path('/proc/loadavg').read_text().strip()}")
    for label, values in late.items():
        shown = " ".join(f"{v:.0f}" for v in values)
        print(
            f"{label:4} ms after the lease's end: median {statistics.median(values):.0f}, "
            f"max {max(values):.0f} ({shown})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
