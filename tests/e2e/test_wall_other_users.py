"""Another local user, while a sandbox runs: it reads nothing of the granted folders through the
sandbox's staging folder, and no process's command line or environment shows it a staging
path, the owner's folder, the caller's environment or the program's arguments (but the
program's own command line, which the kernel shows for every process: README's known gaps).

The attacker is a real second user on the host, reading /proc and the box's run dir as any
local user can; the sandbox's id it learns from whatever command line names it.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from as_user import as_user
from install_prefix import LNK

RunningBox = Any  # tests/e2e/conftest.py

pytestmark = pytest.mark.needs_root

READY = "lnk-others-test: ready"
WAIT_S = 60.0  # a sandbox start on a loaded 2-core machine, with margin
STAGED_GRANTS = 8  # staged mounts g0.. the attacker tries per sandbox id (one grant here)

# The second user's look around: every process's cmdline and environ it can read, the run dir's
# staging folder listed, and the granted file tried under every staged mount of every sandbox
# id any command line names.
SPY = r"""
import json, os, re, sys
run_dir, name = sys.argv[1], sys.argv[2]
found = {"cmdlines": [], "environs": [], "listed": None, "read": []}
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read()
        uid = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        continue
    argv = [a.decode(errors="replace") for a in cmd.split(b"\0") if a]
    found["cmdlines"].append([uid, argv])
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            found["environs"].append([uid, f.read().decode(errors="replace")])
    except OSError:
        pass
staging = os.path.join(run_dir, "sandboxes")
try:
    found["listed"] = os.listdir(staging)
except OSError:
    pass
ids = set(found["listed"] or [])
for _, argv in found["cmdlines"]:
    ids.update(re.findall(r"sbx-[0-9a-f]+", " ".join(argv)))
for sid in sorted(ids):
    for n in range(int(sys.argv[3])):
        for sub in (f"g{n}/{name}", f"tmp", f"home"):
            path = os.path.join(staging, sid, sub)
            try:
                with open(path, "rb") as f:
                    found["read"].append([path, f.read().decode(errors="replace")])
            except OSError:
                pass
print(json.dumps(found))
"""


@pytest.fixture
def other_user() -> Iterator[pwd.struct_passwd]:
    name = "lnko" + secrets.token_hex(3)
    subprocess.run(["useradd", "-M", "-s", "/bin/sh", "-K", "UID_MIN=1500", name], check=True)
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], capture_output=True, check=False)


@pytest.fixture
def private_folder(running_box: RunningBox) -> Iterator[Path]:
    """A folder in the owner's 0700 home with a world-readable file: only the home's mode keeps
    other users out."""
    owner = running_box.owner
    path = owner.home / f"priv-{secrets.token_hex(4)}"
    path.mkdir()
    (path / "notes.txt").write_text(f"notes {owner.secret}\n")
    os.chmod(path / "notes.txt", 0o644)
    for p in (path, path / "notes.txt"):
        os.chown(p, owner.uid, owner.gid)
    yield path
    subprocess.run(["chattr", "-R", "-i", str(path)], capture_output=True, check=False)
    shutil.rmtree(path, ignore_errors=True)


def test_another_user_reads_nothing_of_a_running_sandbox(
    running_box: RunningBox, other_user: pwd.struct_passwd, private_folder: Path
) -> None:
    owner = running_box.owner
    env_mark = "envmark" + secrets.token_hex(6)
    arg_mark = "argmark" + secrets.token_hex(6)
    spy = [str(Path(LNK).parent / "python"), "-I", "-c", SPY]
    direct = subprocess.run(
        as_user(
            other_user.pw_uid, other_user.pw_gid, "/bin/cat", str(private_folder / "notes.txt")
        ),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert direct.returncode != 0, "the owner's home lets the other user in: nothing to prove"
    client = subprocess.Popen(
        as_user(
            owner.uid,
            owner.gid,
            str(LNK),
            "sandbox",
            "run",
            "--yes",
            "--write=.",  # the client's own command line names no folder
            "--command=head",
            "--",
            "/bin/sh",
            "-c",
            f"echo {READY}; head -n 1 >/dev/null; : {arg_mark}",
        ),
        env={**running_box.owner_env(), "LC_LNKTEST": env_mark},
        cwd=str(private_folder),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert client.stdout is not None
        line = client.stdout.readline().strip()
        assert line == READY, f"the sandbox did not start: {line!r}"
        seen = subprocess.run(
            as_user(
                other_user.pw_uid,
                other_user.pw_gid,
                *spy,
                str(running_box.run_dir),
                "notes.txt",
                str(STAGED_GRANTS),
            ),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        client.communicate("go\n", timeout=WAIT_S)
    assert seen.returncode == 0, seen.stderr
    found = json.loads(seen.stdout)
    assert client.returncode == 0

    assert found["read"] == [], "read through the staging folder"
    assert found["listed"] is None
    leaks = []
    for uid, argv in found["cmdlines"]:
        text = " ".join(argv)
        if uid == owner.uid:
            continue  # the owner's own client and setpriv: the owner's command line
        for what, mark in (
            ("the owner's folder", str(private_folder)),
            ("a staging path", f"{running_box.run_dir}/sandboxes/"),
            ("the caller's environment", env_mark),
        ):
            if mark in text:
                leaks.append(f"{what} in the cmdline of uid {uid}: {text[:200]}")
        if arg_mark in text and argv[:1] != ["/bin/sh"]:
            leaks.append(f"the program's argument in uid {uid}'s {argv[0]}: {text[:200]}")
    for uid, environ in found["environs"]:
        if env_mark in environ or str(private_folder) in environ:
            leaks.append(f"the environment of uid {uid} readable")
    assert leaks == []
    # The one place the argument shows: the program's own command line (a known gap).
    assert any(
        arg_mark in " ".join(argv) for _, argv in found["cmdlines"] if argv[:1] == ["/bin/sh"]
    )
    assert re.search(r"sbx-[0-9a-f]+", json.dumps(found["cmdlines"])), "no sandbox id seen"
