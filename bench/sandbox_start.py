"""Sandbox start, end to end, against a bare bwrap baseline in the same run.

    sudo /opt/lnk/venv/bin/python bench/sandbox_start.py [--runs 30] [--concurrent 20]
    sudo /opt/lnk/venv/bin/python bench/sandbox_start.py --history 200000
    sudo /opt/lnk/venv/bin/python bench/sandbox_start.py --rows [--old-prefix P] (start_rows.py)

With --history N: two boxes at once, one with an empty database and one with N ended records,
their launches interleaved, side by side (the cost must stay flat in history: within 10 %).

Starts a private box (its own run/state dirs, `lnk box up`), then measures:
- `lnk sandbox run --yes -- /bin/true` end to end (client start, judging, fresh user, idmapped
  mounts, bwrap, confiner with Landlock and seccomp, cleanup), median and p95;
- a bare `bwrap` running /bin/true with similar binds, as the baseline, and the ratio;
- N concurrent launches: all must succeed; time until all are done;
- the memory of an idle sandbox's own helpers (every process of its uid but the program).
- where the time goes: the controller's own phases per launch (judged, started, ran, cleaned,
  from its log), and inside "ran" the confiner's share (bare bwrap running lnk-sandbox with a
  sandbox's kind of policy, then /bin/true, vs bare bwrap running /bin/true).
Limits are on as on any box (`--limits off` sets limits.unsafe_no_limits to see their cost);
the owner's count and memory sum are raised for the concurrent launches, all one owner's.
The client is the installed `lnk`: for this plain form without a terminal, the C client
(lnk_cli/native/lnk_client.c); `bench/native_client.py` sets it against the Python one.
Reports figures only; asserts nothing but success.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from private_box import LNK, PREFIX, private_box

BARE = [
    "bwrap",
    "--unshare-all",
    "--die-with-parent",
    "--new-session",
    "--clearenv",
    "--ro-bind",
    "/usr",
    "/usr",
    "--symlink",
    "usr/bin",
    "/bin",
    "--symlink",
    "usr/lib",
    "/lib",
    "--symlink",
    "usr/lib64",
    "/lib64",
    "--ro-bind",
    "/etc",
    "/etc",
    "--proc",
    "/proc",
    "--dev",
    "/dev",
    "--tmpfs",
    "/tmp",
    "--",
    "/bin/true",
]


# Bare bwrap running the confiner (lnk-sandbox) with a sandbox's kind of policy, which applies
# Landlock and both seccomp programs, then execs /bin/true: minus bare bwrap, its share.
POLICY_INSIDE = "/run/lnk-confiner/policy"


def confiner_argv(policy_file: Path) -> list[str]:
    from lnk_controller.spawn import confiner_policy, encode_policy

    policy = confiner_policy(
        reads=["/usr", "/etc", "/proc"],
        writes=["/tmp", "/dev"],
        execute=(os.path.realpath("/bin/true"), os.path.realpath("/lib64/ld-linux-x86-64.so.2")),
        network_host=False,
        pretend_abi=None,
    )
    policy_file.write_text(encode_policy(policy))
    binary = Path(site_packages()) / "lnk_controller" / "native" / "lnk-sandbox"
    return [
        *BARE[:-2],
        "--ro-bind",
        str(PREFIX),
        str(PREFIX),
        "--ro-bind",
        str(policy_file),
        POLICY_INSIDE,
        "--",
        str(binary),
        "--",
        "/bin/true",
    ]


UID_BASE, UID_BLOCKS = 2_000_000_000, 100  # this bench's span of uid blocks (private_box)
PHASES = ("judged", "started", "ran", "cleaned")
_PHASE = re.compile(
    r"judged ([0-9.]+) ms, started ([0-9.]+) ms, ran ([0-9.]+) ms, cleaned ([0-9.]+)"
)


def site_packages() -> str:
    return subprocess.run(
        [sys.executable, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def phases(log: Path, last: int) -> dict[str, float]:
    """Medians of the controller's phases over its `last` launches."""
    rows = [tuple(map(float, m.groups())) for m in _PHASE.finditer(log.read_text())][-last:]
    return {name: statistics.median(r[i] for r in rows) for i, name in enumerate(PHASES)}


def client_alone(env: dict[str, str]) -> float:
    """`lnk sandbox run -- /bin/true` against a run dir with no launch socket: the client's own
    start (interpreter, imports, reading its words) up to the refused connect."""
    start = time.perf_counter()
    ran = subprocess.run(
        [LNK, "sandbox", "run", "--", "/bin/true"],
        env=env | {"LNK_RUN_DIR": "/nonexistent"},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        check=False,
    )
    elapsed = (time.perf_counter() - start) * 1000
    if b"the box is not running" not in ran.stderr:
        raise RuntimeError(f"the client did not stop at connect: {ran.stderr[-300:]!r}")
    return elapsed


def timed(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(
        argv,
        env=env,
        check=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    return (time.perf_counter() - start) * 1000


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def idle_helper_memory(env: dict[str, str], uids: range) -> tuple[float, int]:
    """RSS (MiB) of an idle sandbox's processes other than its program, and how many."""
    proc = subprocess.Popen(
        [LNK, "sandbox", "run", "--yes", "--", "/bin/sleep", "30"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            pids = _sandbox_pids(uids)
            if any(_comm(p) == "sleep" for p in pids):
                break
            time.sleep(0.05)
        pids = _sandbox_pids(uids)
        helpers = [p for p in pids if _comm(p) != "sleep"]
        rss = sum(_rss_kib(p) for p in helpers) / 1024
        return rss, len(helpers)
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def _sandbox_pids(uids: range) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/status") as f:
                    uid = int(next(line for line in f if line.startswith("Uid:")).split()[1])
            except (OSError, StopIteration):
                continue
            if uid in uids:
                out.append(int(entry))
    return out


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def _rss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            return int(next(line for line in f if line.startswith("VmRSS:")).split()[1])
    except (OSError, StopIteration):
        return 0


HISTORY_UID = 1_999_000_000  # ended records' uids: below every bench block, never allocated
HISTORY_BATCH = 10_000  # ended records per insert transaction
CONCURRENT_ROUNDS = 3  # bursts of --concurrent launches per box, alternating boxes


def add_history(database: Path, count: int) -> None:
    """`count` ended sandbox records, as months of use leave them, written beside the running
    controller (WAL: it sees them at its next read)."""
    import sqlite3

    ended = "2026-01-01 00:00:00"
    with sqlite3.connect(database, timeout=30) as db:
        for start in range(0, count, HISTORY_BATCH):
            db.executemany(
                "INSERT INTO sandboxes (id, owner_uid, host_uid, host_name, state, paused,"
                " stop_requested, staging_dir, mounts_json, command_json, spec_hash, created_at,"
                " lease_expires_at, ended_at, exit_status) VALUES (?, 0, ?, 'lnk-sbx-old',"
                " 'ended', 0, 0, '/gone', '[]', '[\"/bin/true\"]', '', ?, ?, ?, 0)",
                [
                    (f"sbx-h{n:011d}", HISTORY_UID + n % 1000, ended, ended, ended)
                    for n in range(start, min(count, start + HISTORY_BATCH))
                ],
            )
            db.commit()
        db.execute("ANALYZE")


def launch_rounds(
    envs: tuple[dict[str, str], dict[str, str]], runs: int, concurrent: int
) -> tuple[list[list[float]], list[list[float]]]:
    """For each of the two boxes, `runs` single launches and `concurrent` launches at once (each
    one's time), interleaved box by box so both see the same machine at the same moments."""
    run = [LNK, "sandbox", "run", "--", "/bin/true"]
    alone: list[list[float]] = [[], []]
    together: list[list[float]] = [[], []]
    for _ in range(runs):
        for n, env in enumerate(envs):
            alone[n].append(timed(run, env))
    for _ in range(CONCURRENT_ROUNDS):
        for n, env in enumerate(envs):
            with ThreadPoolExecutor(max_workers=concurrent) as pool:
                together[n] += pool.map(lambda _, e=env: timed(run, e), range(concurrent))
    return alone, together


def history_main(args: argparse.Namespace) -> int:
    """Launch times on a box with an empty database and on one with `--history` ended records,
    side by side: two boxes up at once, their launches interleaved."""
    with (
        private_box(UID_BASE, UID_BLOCKS) as empty,
        private_box(UID_BASE, UID_BLOCKS) as full,
    ):
        envs = (empty.env, full.env)
        for env in envs:
            timed([LNK, "sandbox", "run", "--yes", "--", "/bin/true"], env)  # approve once
        add_history(Path(full.env["LNK_STATE_DIR"]) / "controller.db", args.history)
        alone, together = launch_rounds(envs, args.runs, args.concurrent)
    print(
        f"runs: {args.runs}, {args.concurrent} at once x {CONCURRENT_ROUNDS}; history: "
        f"{args.history} ended records"
    )
    print(f"{'':30} {'empty':>10} {'history':>10} {'ratio':>7}")
    for name, series, stat in (
        ("one launch, median (ms)", alone, statistics.median),
        ("one launch, p95 (ms)", alone, p95),
        (f"{args.concurrent} at once, median (ms)", together, statistics.median),
    ):
        a, b = stat(series[0]), stat(series[1])
        print(f"{name:30} {a:10.1f} {b:10.1f} {b / a:7.2f}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--concurrent", type=int, default=20)
    parser.add_argument(
        "--history", type=int, default=0, help="compare with this many ended records (200000)"
    )
    parser.add_argument("--limits", choices=["on", "off"], default="on")
    parser.add_argument(
        "--rows", action="store_true", help="plain, read and write grant; limits on and off"
    )
    parser.add_argument("--old-prefix", type=Path, help="with --rows: an earlier box, beside")
    parser.add_argument(
        "--protections", action="store_true", help="with --rows: one box per wall switch off"
    )
    args = parser.parse_args()
    if args.history:
        return history_main(args)
    if args.rows:
        from start_rows import boxes_for, rows_main

        boxes = boxes_for(args.protections, args.old_prefix)
        return rows_main(args.runs, boxes, BARE, UID_BASE)
    config = (
        f"[limits]\nowner_sandboxes = {args.concurrent + 1}\n"
        f"owner_memory_mb = {(args.concurrent + 1) * 1024}\n"
        + ("unsafe_no_limits = true\n" if args.limits == "off" else "")
    )
    with private_box(UID_BASE, UID_BLOCKS, config) as box:
        env, uids = box.env, box.uids
        timed([LNK, "sandbox", "run", "--yes", "--", "/bin/true"], env)  # approve once
        lnk_ms, bare_ms, confiner_ms = [], [], []
        confiner = confiner_argv(Path(env["LNK_STATE_DIR"]) / "bench-policy")
        for _ in range(args.runs):  # interleaved, so all see the same machine
            lnk_ms.append(timed([LNK, "sandbox", "run", "--", "/bin/true"], env))
            bare_ms.append(timed(BARE, env))
            confiner_ms.append(timed(confiner, env))
        phase_ms = phases(Path(env["LNK_STATE_DIR"]) / "logs" / "controller.log", args.runs)
        client_ms = [client_alone(env) for _ in range(10)]
        start = time.perf_counter()
        with ThreadPoolExecutor(max_workers=args.concurrent) as pool:
            codes = list(
                pool.map(
                    lambda _: (
                        subprocess.run(
                            [LNK, "sandbox", "run", "--", "/bin/true"],
                            env=env,
                            stdin=subprocess.DEVNULL,
                            capture_output=True,
                        ).returncode
                    ),
                    range(args.concurrent),
                )
            )
        concurrent_ms = (time.perf_counter() - start) * 1000
        rss, helpers = idle_helper_memory(env, uids)

    lm, bm = statistics.median(lnk_ms), statistics.median(bare_ms)
    print(f"runs: {args.runs}, limits {args.limits}")
    print(f"lnk sandbox run -- /bin/true : median {lm:7.1f} ms  p95 {p95(lnk_ms):7.1f} ms")
    print(f"bare bwrap /bin/true         : median {bm:7.1f} ms  p95 {p95(bare_ms):7.1f} ms")
    print(f"ratio (median)               : {lm / bm:7.1f}x")
    print(f"client alone (no box there)  : median {statistics.median(client_ms):7.1f} ms")
    print(
        "controller phases (median)   : "
        + ", ".join(f"{name} {phase_ms[name]:.1f}" for name in PHASES)
        + " ms"
    )
    cm = statistics.median(confiner_ms)
    print(
        f"bare bwrap + confiner start  : median {cm:7.1f} ms (the confiner's share {cm - bm:.1f})"
    )
    ok = sum(1 for c in codes if c == 0)
    print(
        f"{args.concurrent} concurrent launches     : {ok}/{args.concurrent} ok, "
        f"all done in {concurrent_ms:.0f} ms"
    )
    print(f"idle sandbox helpers         : {helpers} processes, {rss:.1f} MiB RSS")
    return 0 if ok == args.concurrent else 1


if __name__ == "__main__":
    sys.exit(main())
