"""The `lnk` client in C (cli/lnk_cli/native/lnk_client*.c) against the Python client, on one
private box.

    sudo /opt/lnk/venv/bin/python bench/native_client.py [--runs 40]

The installed `lnk` is the C client; the Python client is what it runs for every other
command. On a private box (private_box.py), interleaved so both see the same machine:
- `sandbox run -- /bin/true` end to end with each client (median and p95);
- each client alone: the same words against a run dir with no launch socket, so the time is
  the client's own start up to its refused connect.
Reports figures only; asserts nothing but success.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time

from private_box import LNK, PREFIX, private_box

# The Python client as the installed (C) `lnk` runs it for everything but this plain form.
PYTHON_LNK = [
    str(PREFIX / "venv" / "bin" / "python3"),
    "-P",
    "-c",
    "from lnk_cli.__main__ import main; main()",
]
# A uid block of its own, far from sandbox_start.py's and the e2e tests' blocks.
UID_BASE, UID_BLOCKS = 2_101_000_000, 10_000
TRUE = ["sandbox", "run", "--", "/bin/true"]


def timed(argv: list[str], env: dict[str, str], expect: int) -> float:
    start = time.perf_counter()
    ran = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True)
    elapsed = (time.perf_counter() - start) * 1000
    if ran.returncode != expect:
        raise RuntimeError(f"{argv[0]} exited {ran.returncode}: {ran.stderr[-300:]!r}")
    return elapsed


def summary(values: list[float]) -> str:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return f"median {statistics.median(values):6.1f} ms   p95 {p95:6.1f} ms"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=40)
    args = parser.parse_args()
    with private_box(UID_BASE, UID_BLOCKS) as box:
        env = box.env
        timed([LNK, "sandbox", "run", "--yes", "--", "/bin/true"], env, 0)  # approve once
        no_box = env | {"LNK_RUN_DIR": "/nonexistent"}
        figures: dict[str, list[float]] = {
            "end to end, Python client": [],
            "end to end, C client": [],
            "client alone, Python": [],
            "client alone, C": [],
        }
        for _ in range(args.runs):
            figures["end to end, Python client"].append(timed([*PYTHON_LNK, *TRUE], env, 0))
            figures["end to end, C client"].append(timed([LNK, *TRUE], env, 0))
            figures["client alone, Python"].append(timed([*PYTHON_LNK, *TRUE], no_box, 1))
            figures["client alone, C"].append(timed([LNK, *TRUE], no_box, 1))

    print(f"`lnk {' '.join(TRUE)}`, {args.runs} runs each, interleaved:")
    for name, values in figures.items():
        print(f"  {name:<26} {summary(values)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
