"""`lnk sandbox check` with no grants, end to end, against `lnk sandbox run -- /bin/true` in the
same run (issue 5's target: under 10 s on a 2-core machine).

    sudo /opt/lnk/venv/bin/python bench/check.py [--runs 10]

Starts a private box (its own run/state/config dirs and uid block, `lnk box up`) and a
throwaway owner user, then times, interleaved: the whole check (bait, plan, one sandbox of
probes, verdicts, bait removed) and a plain run of /bin/true (the sandbox's own cost), both as
that owner. Reports figures and whether every check passed; asserts nothing else. Removes the
user and the box after.
"""

from __future__ import annotations

import argparse
import os
import pwd
import secrets
import statistics
import subprocess
import sys
import time

from private_box import LNK, private_box

TARGET_S = 10.0  # the bound for a check with no grants
UID_BLOCKS_START, UID_BLOCKS = 2_001_000_000, 100_000  # this bench's span (private_box)


def _as(user: pwd.struct_passwd, env: dict[str, str], *args: str) -> tuple[float, int]:
    argv = [
        "/usr/bin/setpriv",
        f"--reuid={user.pw_uid}",
        f"--regid={user.pw_gid}",
        "--init-groups",
        "--",
        LNK,
        *args,
    ]
    start = time.perf_counter()
    done = subprocess.run(
        argv, env=env, cwd=user.pw_dir, capture_output=True, stdin=subprocess.DEVNULL, check=False
    )
    return time.perf_counter() - start, done.returncode


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    name = f"lnkb{secrets.token_hex(3)}"
    subprocess.run(["useradd", "-m", "-s", "/bin/bash", "-K", "UID_MIN=1500", name], check=True)
    try:
        with private_box(UID_BLOCKS_START, UID_BLOCKS) as box:
            user = pwd.getpwnam(name)
            env = {**box.env, "PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": user.pw_dir}
            env["USER"] = name
            _as(user, env, "sandbox", "run", "--yes", "--", "/bin/true")  # approve once
            check_s, run_s, codes = [], [], []
            for _ in range(args.runs):  # interleaved, so both see the same machine
                took, code = _as(user, env, "sandbox", "check")
                check_s.append(took)
                codes.append(code)
                run_s.append(_as(user, env, "sandbox", "run", "--", "/bin/true")[0])
    finally:
        subprocess.run(["userdel", "-r", name], check=False, capture_output=True)

    cm, rm = statistics.median(check_s), statistics.median(run_s)
    print(f"runs: {args.runs}, cores: {os.cpu_count()}, load: {os.getloadavg()[0]:.1f}")
    print(f"lnk sandbox check (no grants): median {cm:6.2f} s  p95 {_p95(check_s):6.2f} s")
    print(f"lnk sandbox run -- /bin/true : median {rm:6.2f} s  p95 {_p95(run_s):6.2f} s")
    print(f"the check's own share        : median {cm - rm:6.2f} s")
    passed = sum(1 for c in codes if c == 0)
    print(f"checks that passed (exit 0)  : {passed}/{args.runs}; target under {TARGET_S:.0f} s")
    return 0 if passed == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
