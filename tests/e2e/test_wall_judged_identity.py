"""One identity from judging to binding, attacked by the owner's other sandboxes and other users.

Each attack swaps a granted path, after it was judged, for a link to the owner's home, `~/.lnk`
or `~/.ssh` (another user who owns the parent), or for another folder (the owner's other
sandbox, which can make no link in its write grant): during the real approval question (on a
pty, the swap made while the client waits) or in a loop of renames and `RENAME_EXCHANGE` under
`--yes`. Every launch either runs on the folder judged or is refused; bait outside is checked
after each run. The same swap against a box with `unsafe_skip_identity_check` shows the leak
the check closes.
"""

from __future__ import annotations

import json
import os
import pty
import secrets
import select
import shutil
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from as_user import as_user
from install_prefix import LNK

pytestmark = pytest.mark.needs_root

QUESTION = b"[y/N]"
QUESTION_WAIT_S = 60  # a launch's judging on a loaded 2-core machine, with margin
LOOP_LAUNCHES = 200  # the bound for the looping swapper
CHANGED = "changed after it was judged"
EXCHANGER = r"""
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
out, links = sys.argv[1], sys.argv[2:]
print("swapping", flush=True)
n = 0
while True:
    # RENAME_EXCHANGE (2): the folder and a link to somewhere else trade names atomically, and
    # back, so the judged folder stands at `out` half of the time (exchanging onward from a
    # link would leave it under another name for good, and no launch could run at all)
    link = links[n % len(links)].encode()
    libc.renameat2(-100, out.encode(), -100, link, 2)
    libc.renameat2(-100, out.encode(), -100, link, 2)
    n += 1
"""

RunningBox = Any  # tests/e2e/conftest.py


@dataclass
class Race:
    """A folder the victim is granted (`out`), its parent (`parent`), and the places a swap
    points it at, each holding bait whose listing must not change."""

    parent: Path
    out: Path
    targets: dict[str, Path]

    def bait(self) -> dict[str, list[str]]:
        return {name: sorted(os.listdir(path)) for name, path in self.targets.items()}


def _owner_env(box: RunningBox, env: dict[str, str] | None = None) -> dict[str, str]:
    base = box.owner_env()
    if env is not None:  # a private box's sockets and state
        base.update({k: v for k, v in env.items() if k.startswith("LNK_")})
    return base


def _chown(path: Path, uid: int, gid: int) -> None:
    os.chown(path, uid, gid, follow_symlinks=False)


@pytest.fixture
def targets(running_box: RunningBox) -> dict[str, Path]:
    owner = running_box.owner
    lnk_dir = owner.home / ".lnk"
    if not lnk_dir.exists():
        lnk_dir.mkdir(mode=0o700)
        _chown(lnk_dir, owner.uid, owner.gid)
    bait = lnk_dir / "bait.txt"
    if not bait.exists():
        bait.write_text(f"{owner.secret}\n")
        _chown(bait, owner.uid, owner.gid)
    return {"home": owner.home, "~/.lnk": lnk_dir, "~/.ssh": owner.home / ".ssh"}


@pytest.fixture
def other_user() -> Iterator[tuple[str, int, int]]:
    """A second local user of the box (not the owner)."""
    name = "lnko" + secrets.token_hex(3)
    subprocess.run(["useradd", "-M", "-s", "/bin/sh", "-K", "UID_MIN=1500", name], check=True)
    import pwd

    entry = pwd.getpwnam(name)
    try:
        yield name, entry.pw_uid, entry.pw_gid
    finally:
        subprocess.run(["userdel", name], capture_output=True, check=False)


def _race(box: RunningBox, targets: dict[str, Path], parent_owner: tuple[int, int]) -> Race:
    """`parent/out`, the owner's folder, in a parent that `parent_owner` may change: the
    owner's own folder (a sandbox of theirs writes it) or another user's under /srv."""
    owner = box.owner
    tag = secrets.token_hex(4)
    if parent_owner[0] == owner.uid:
        parent = owner.home / f"race-{tag}"
    else:
        Path("/srv").mkdir(mode=0o755, exist_ok=True)
        parent = Path(f"/srv/lnk-race-{tag}")
    parent.mkdir(mode=0o755)
    _chown(parent, *parent_owner)
    out = parent / "out"
    out.mkdir()
    (out / "readme.txt").write_text("the folder judged\n")
    for path in (out, out / "readme.txt"):
        _chown(path, owner.uid, owner.gid)
    return Race(parent, out, targets)


@pytest.fixture
def races(
    running_box: RunningBox, targets: dict[str, Path]
) -> Iterator[Callable[[tuple[int, int]], Race]]:
    """`races((uid, gid))` makes a Race whose parent that user owns; all removed after."""
    made: list[Race] = []

    def make(parent_owner: tuple[int, int]) -> Race:
        made.append(_race(running_box, targets, parent_owner))
        return made[-1]

    yield make
    for race in made:
        shutil.rmtree(race.parent, ignore_errors=True)


def _sandbox_count(box: RunningBox) -> int:
    with closing(sqlite3.connect(f"file:{box.state_dir}/controller.db?mode=ro", uri=True)) as db:
        return int(db.execute("SELECT count(*) FROM sandboxes").fetchone()[0])


@contextmanager
def _swapper_sandbox(box: RunningBox, race: Race, script: str, *args: str) -> Iterator[Any]:
    """A second sandbox of the owner that writes the race's parent, running `script` (python),
    its stdin and stdout piped to the test."""
    argv = as_user(
        box.owner.uid,
        box.owner.gid,
        str(LNK),
        "sandbox",
        "run",
        "--yes",
        "--command=python3",
        f"--write={race.parent}",
        "--",
        "/usr/bin/python3",
        "-c",
        script,
        *args,
    )
    proc = subprocess.Popen(
        argv,
        env=box.owner_env(),
        cwd=str(box.owner.home),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield proc
    finally:
        proc.kill()
        proc.communicate(timeout=30)


# A sandbox makes no link in its write grant (Landlock's MAKE_SYM: write_links.py), so the
# owner's other sandbox puts another folder where the judged one was: another object all the
# same, which the bind must refuse. It says whether the link was refused.
SWAP_ONCE = r"""
import errno, os, sys
out, target = sys.argv[1], sys.argv[2]
print("ready", flush=True)
sys.stdin.readline()
os.rename(out, out + ".judged")
try:
    os.symlink(target, out)
    print("swapped: a link", flush=True)
except OSError as exc:
    os.mkdir(out)
    print(f"swapped: a folder (the link: {errno.errorcode[exc.errno]})", flush=True)
sys.stdin.readline()
"""


def _read_until(fd: int, marker: bytes, timeout_s: float) -> bytes:
    """What the pty's master says until `marker` (or the end); fails on the deadline."""
    seen = b""
    deadline = time.monotonic() + timeout_s
    while marker not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"no {marker!r} within {timeout_s}s: {seen!r}"
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # the client closed the pty: it ended
            break
        if not chunk:
            break
        seen += chunk
    return seen


def _ask_and_swap(
    box: RunningBox,
    flags: list[str],
    script: str,
    swap: Callable[[], None],
    env: Any = None,
    before_lnk: tuple[str, ...] = (),
) -> tuple[int, str]:
    """Run the victim on a pty without --yes (through `before_lnk`, a program that execs its
    arguments), make `swap` while its question waits, answer yes; (exit status, everything
    it printed)."""
    master, slave = pty.openpty()
    owner = box.owner
    argv = as_user(owner.uid, owner.gid, *before_lnk, str(LNK), "sandbox", "run", *flags, "--")
    victim = subprocess.Popen(
        [*argv, "/bin/sh", "-c", script],
        env=_owner_env(box, env),
        cwd=str(box.owner.home),
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
    )
    os.close(slave)
    try:
        said = _read_until(master, QUESTION, QUESTION_WAIT_S)
        swap()
        os.write(master, b"y\n")
        said += _read_until(master, b"\x00never", QUESTION_WAIT_S)
        status = victim.wait(timeout=QUESTION_WAIT_S)
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait()
        os.close(master)
    return status, said.decode(errors="replace")


@contextmanager
def _swap_by_sandbox(box: RunningBox, race: Race, target: Path) -> Iterator[Callable[[], None]]:
    with _swapper_sandbox(box, race, SWAP_ONCE, str(race.out), str(target)) as swapper:
        assert swapper.stdout is not None and swapper.stdin is not None
        assert swapper.stdout.readline().strip() == "ready", swapper.stderr

        def swap() -> None:
            assert swapper.stdin is not None and swapper.stdout is not None
            swapper.stdin.write("go\n")
            swapper.stdin.flush()
            said = swapper.stdout.readline().strip()
            assert said == "swapped: a folder (the link: EACCES)", said

        yield swap


def _swap_by_user(race: Race, target: Path, user: tuple[str, int, int]) -> Callable[[], None]:
    def swap() -> None:
        code = "import os,sys; os.rename(sys.argv[1], sys.argv[1] + '.judged'); " + (
            "os.symlink(sys.argv[2], sys.argv[1])"
        )
        argv = as_user(user[1], user[2], "/usr/bin/python3", "-c", code, str(race.out), str(target))
        subprocess.run(argv, check=True, capture_output=True, timeout=30)

    return swap


# What the victim reads in its grant: each bait file a swap could bring there (sh builtins only).
READ_BAIT = "; ".join(
    f'while read l; do echo "$l"; done < {{out}}/{name} 2>/dev/null'
    for name in ("id_ed25519", "bait.txt", "secret.txt")
)
GRANT_SCRIPTS = {
    # what the victim does with its grant: plant a file, read what is there
    "--write": "echo planted > {out}/planted-{nonce} || exit 9; " + READ_BAIT + "; echo ran",
    "--read": READ_BAIT + "; echo ran",
}


def _check_outcome(status: int, said: str, race: Race, before: Any, box: RunningBox) -> bool:
    """Refused, or ran on the folder judged; nothing outside changed either way. True: ran."""
    assert box.owner.secret not in said, said
    assert race.bait() == before, said
    ran = status == 0 and "ran" in said
    if not ran:
        assert status != 0
    return ran


@pytest.mark.parametrize("target", ["home", "~/.lnk", "~/.ssh"])
@pytest.mark.parametrize("grant", ["--write", "--read"])
@pytest.mark.parametrize("swapper", ["a second sandbox of the owner", "another user"])
def test_a_swap_during_the_question_is_refused_and_touches_nothing_outside(
    running_box: RunningBox,
    targets: dict[str, Path],
    races: Callable[[tuple[int, int]], Race],
    other_user: tuple[str, int, int],
    target: str,
    grant: str,
    swapper: str,
) -> None:
    box = running_box
    by_user = swapper == "another user"
    race = races(other_user[1:] if by_user else (box.owner.uid, box.owner.gid))
    nonce = secrets.token_hex(4)
    script = GRANT_SCRIPTS[grant].format(out=race.out, nonce=nonce)
    before, records = race.bait(), _sandbox_count(box)
    if by_user:
        swap = _swap_by_user(race, targets[target], other_user)
        status, said = _ask_and_swap(box, [f"{grant}={race.out}"], script, swap)
    else:
        with _swap_by_sandbox(box, race, targets[target]) as swap:
            records += 1  # the swapper's own sandbox
            status, said = _ask_and_swap(box, [f"{grant}={race.out}"], script, swap)
    assert status != 0, said
    assert CHANGED in said, said
    assert not _check_outcome(status, said, race, before, box)
    assert not (targets[target] / f"planted-{nonce}").exists()
    assert _sandbox_count(box) == records  # nothing of the refused sandbox was recorded


def test_the_granted_folder_still_works_after_the_question(
    running_box: RunningBox, targets: dict[str, Path], races: Callable[[tuple[int, int]], Race]
) -> None:
    box = running_box
    race = races((box.owner.uid, box.owner.gid))
    script = f"echo planted > {race.out}/planted; echo ran"
    status, said = _ask_and_swap(box, [f"--write={race.out}"], script, lambda: None)
    assert status == 0, said
    assert (race.out / "planted").read_text() == "planted\n"


@pytest.mark.parametrize("folder", ["not granted", "granted for reading"])
def test_a_program_swapped_during_the_question_is_refused(
    running_box: RunningBox,
    targets: dict[str, Path],
    races: Callable[[tuple[int, int]], Race],
    folder: str,
) -> None:
    """The exec grant is the judged inode: `[commands]`' tool replaced by another program,
    whether its folder is bound too or not."""
    box = running_box
    owner = box.owner
    race = races((owner.uid, owner.gid))
    tool, evil = race.out / "tool", race.parent / "evil-tool"
    tool.write_text("#!/bin/sh\necho innocent\n")
    evil.write_text("#!/bin/sh\necho EVIL\n")
    for path in (tool, evil):
        path.chmod(0o755)
        _chown(path, owner.uid, owner.gid)

    def swap() -> None:
        os.rename(tool, race.out / "tool.judged")
        os.rename(evil, tool)

    flags = [f"--command={tool}", "--command=/bin/sh"]
    if folder == "granted for reading":
        flags.append(f"--read={race.out}")
    status, said = _ask_and_swap(box, flags, f"{tool}", swap)
    assert "EVIL" not in said, said
    assert status != 0 and CHANGED in said, said
    status, said = _ask_and_swap(box, flags, f"{tool}", lambda: None)
    assert status == 0 and "EVIL" in said, said  # the program judged now, run


def test_a_with_fd_folder_swapped_during_the_question_binds_the_descriptor_or_refuses(
    running_box: RunningBox, targets: dict[str, Path], races: Callable[[tuple[int, int]], Race]
) -> None:
    box = running_box
    owner = box.owner
    race = races((owner.uid, owner.gid))
    nonce = secrets.token_hex(4)
    before = race.bait()
    script = f"echo planted > {race.out}/planted-{nonce} && echo ran"
    # the descriptor is opened by the owner's shell, before lnk runs
    opens_fd = ("/bin/sh", "-c", f'exec 7<"{race.out}"; exec "$@"', "sh")
    swap = _swap_by_user(race, targets["~/.ssh"], ("", owner.uid, owner.gid))
    status, said = _ask_and_swap(box, ["--with-fd=7:write"], script, swap, None, opens_fd)
    ran = _check_outcome(status, said, race, before, box)
    assert not (targets["~/.ssh"] / f"planted-{nonce}").exists()
    if ran:  # the descriptor's folder, now named out.judged
        assert (race.parent / "out.judged" / f"planted-{nonce}").exists()


def test_with_the_identity_check_skipped_the_same_swap_leaks(
    running_box: RunningBox,
    targets: dict[str, Path],
    races: Callable[[tuple[int, int]], Race],
    private_box: Any,
) -> None:
    """`unsafe_skip_identity_check` reopens the race: the sandbox writes into ~/.ssh."""
    box = running_box
    race = races((box.owner.uid, box.owner.gid))
    nonce = secrets.token_hex(4)
    planted = targets["~/.ssh"] / f"planted-{nonce}"
    try:
        with private_box("unsafe_skip_identity_check = true") as unsafe:
            swap = _swap_by_user(race, targets["~/.ssh"], ("", box.owner.uid, box.owner.gid))
            script = GRANT_SCRIPTS["--write"].format(out=race.out, nonce=nonce)
            status, said = _ask_and_swap(box, [f"--write={race.out}"], script, swap, unsafe.env)
        assert planted.exists(), said  # the leak
        assert box.owner.secret in said  # and ~/.ssh read from inside
        assert status == 0, said
    finally:
        planted.unlink(missing_ok=True)


def _loop_launch(box: RunningBox, grant: str, out: Path, n: int) -> tuple[int, str]:
    """One `--yes` launch of the victim with `grant` of `out`: (exit status, what it said)."""
    plant = f"echo {n} > {out}/planted-{n} && echo ran"  # "ran": planted where it was bound
    if grant == "--read":
        result = box.run(
            f"--read={out}", cmd=["/bin/sh", "-c", READ_BAIT.format(out=out) + "; echo ran"]
        )
    elif grant == "--write":
        result = box.run(f"--write={out}", cmd=["/bin/sh", "-c", plant])
    else:  # --with-fd: the owner's shell opens the path (as it is then) and passes it
        opens_fd = ["/bin/sh", "-c", 'exec 7<"$1"; shift; exec "$@"', "sh", str(out)]
        argv = [*opens_fd, str(LNK), "sandbox", "run", "--yes", "--with-fd=7:write", "--"]
        result = subprocess.run(
            as_user(box.owner.uid, box.owner.gid, *argv, "/bin/sh", "-c", plant),
            env=box.owner_env(),
            cwd=str(box.owner.home),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    return result.returncode, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("grant", "swapper"),
    [
        ("--write", "a second sandbox of the owner"),
        ("--write", "another user"),
        ("--read", "a second sandbox of the owner"),
        ("--read", "another user"),
        ("--with-fd", "another user"),
    ],
)
def test_a_looping_exchange_under_yes_never_binds_elsewhere(
    running_box: RunningBox,
    targets: dict[str, Path],
    races: Callable[[tuple[int, int]], Race],
    other_user: tuple[str, int, int],
    grant: str,
    swapper: str,
) -> None:
    box = running_box
    by_user = swapper == "another user"
    parent_owner = other_user[1:] if by_user else (box.owner.uid, box.owner.gid)
    race = races(parent_owner)
    links = []
    for name, target in targets.items():
        link = race.parent / f"evil-{name.strip('~/.') or 'home'}"
        if by_user:
            link.symlink_to(target)
        else:  # a sandbox moves no link in its write grant (MAKE_SYM): other folders instead
            link.mkdir()
        _chown(link, *parent_owner)
        links.append(str(link))
    before = race.bait()
    judged_inode = race.out.stat().st_ino
    ran = refused = changed = 0
    loop: Any
    if by_user:
        argv = as_user(
            other_user[1], other_user[2], "/usr/bin/python3", "-c", EXCHANGER, str(race.out)
        )
        loop = subprocess.Popen(
            [*argv, *links], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        stop: Callable[[], None] = lambda: (loop.kill(), loop.communicate(timeout=30))  # noqa: E731
    else:
        context = _swapper_sandbox(box, race, EXCHANGER, str(race.out), *links)
        loop = context.__enter__()
        stop = lambda: context.__exit__(None, None, None)  # noqa: E731
    try:
        assert loop.stdout is not None
        assert loop.stdout.readline().strip() == "swapping", loop.stderr
        for n in range(LOOP_LAUNCHES):
            status, said = _loop_launch(box, grant, race.out, n)
            if _check_outcome(status, said, race, before, box):
                ran += 1
            else:
                refused += 1
                changed += CHANGED in said
            for target in targets.values():
                assert not (target / f"planted-{n}").exists(), (n, said)
    finally:
        stop()
    folders = [p for p in (race.out, *map(Path, links)) if p.is_dir() and not p.is_symlink()]
    real = next(p for p in folders if p.stat().st_ino == judged_inode)
    planted = {f: [n for n in os.listdir(f) if n.startswith("planted-")] for f in folders}
    assert sum(map(len, planted.values())) == (0 if grant == "--read" else ran)
    if by_user:
        # A link judged is judged where it points (the owner's settings: refused), so every file
        # planted is in the folder judged, whatever its name is now.
        assert all(not names for f, names in planted.items() if f != real), planted
    # (The owner's other sandbox swaps in the owner's other folders of the same parent: a launch
    # judged while one of them stood at the path binds that one, as judged. What must never
    # happen, a bind elsewhere than judged or a write outside, is asserted at each launch.)
    assert ran + refused == LOOP_LAUNCHES
    print(f"{grant}, {swapper}: {ran} ran, {refused} refused, {changed} of them at the bind")
    # The swapper lost the race too: the granted folder still works under it.
    assert ran > 0, (ran, refused, changed)
    if grant != "--with-fd":  # a descriptor is bound itself: no path to swap at the bind
        # The swapper won the window between judging and binding, which the bind refused
        # (else the loop proved nothing about the bind).
        assert changed > 0, (ran, refused, changed)


def test_check_reports_the_bound_folder_is_the_one_judged(
    running_box: RunningBox, targets: dict[str, Path], races: Callable[[tuple[int, int]], Race]
) -> None:
    box = running_box
    race = races((box.owner.uid, box.owner.gid))
    result = box.as_owner(
        "sandbox", "check", "--json", f"--write={race.out}", f"--read={box.owner.home}/project"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    findings = json.loads(result.stdout)["probes"]
    identity = {f["tried"]: f["verdict"] for f in findings if f["id"].startswith("identity-")}
    assert len(identity) == 2, findings
    assert set(identity.values()) == {"refused"}, identity
    assert any(str(race.out) in tried for tried in identity)
