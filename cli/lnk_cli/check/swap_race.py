"""The check's swap race: a grant judged on one folder must never be bound on another.

The attack, as another sandbox of the owner (or a user who owns a parent folder) would make it:
one "check" launch with a write grant and a read grant of two folders the check makes in the
caller's home, and, in the window between the controller's judging and its binding (its "open"
frame: the approval question's place, which a check skips), the write folder is replaced by a
link to a bait folder beside it, and the read folder trades places with another bait folder
(`renameat2(RENAME_EXCHANGE)`, atomic). The sandbox's probes then write a file into the write
grant and read a file of the read grant. After the run, the outside looks at the bait: a file
in the write bait, or the read bait's secret in what the sandbox printed, is `leaked`; a
refusal ("... changed after it was judged") or a sandbox that ran on the folders judged is
`refused`. Everything is made as the caller, 0700, named `lnk-check-*`, and removed after.

Why in the caller's home: a grant must be a folder the caller owns and may write, outside the
folders no sandbox may write (dot folders, PATH folders, /tmp is the sandbox's own); the home is
where the caller's own projects are. A home the caller cannot write is one finding saying the
race was not tried, never a pass.

What this does NOT try: a swap of a folder above the grant, of a `[commands]` program, or of a
`--with-fd` path (the e2e tests race those: tests/e2e/test_wall_judged_identity.py), nor a
looping swapper under `--yes` (its window is the same one, hit by chance).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import secrets
import shutil
from dataclasses import dataclass

from lnk_cli.check.bait import PREFIX
from lnk_cli.check.launch import CheckRun, Interrupts, RemoteError, run_probes
from lnk_cli.check.plan import LEAKED, REFUSED
from lnk_cli.check.verdicts import Finding, clean_text
from lnk_shared.errors import EXIT_REFUSED, StateError
from lnk_shared.spec_flags import namespace_from_document

__all__ = ["CHANGED", "SwapSeen", "Swaps", "swap_findings", "swap_verdicts"]

RENAME_EXCHANGE = 2  # linux/fs.h: both names exist and trade places atomically
CHANGED = "changed after it was judged"  # the controller's refusal (lnk_controller.bound)
SECRET_NAME = f"{PREFIX}secret"  # the read folders' file: the judged one's is not secret
PLANTED_NAME = f"{PREFIX}planted"  # what the sandbox writes into its write grant
WRITE_ID, READ_ID = "swap:write", "swap:read"
WRITE_TRIED = "bind a write grant swapped for a link to a folder outside, after it was judged"
READ_TRIED = "bind a read grant exchanged (RENAME_EXCHANGE) with a folder outside, after judging"


@dataclass(frozen=True)
class Swaps:
    """The folders of one race, all in `root`."""

    root: str
    secret: str  # the read bait's secret

    @property
    def write(self) -> str:
        return os.path.join(self.root, "write")

    @property
    def write_bait(self) -> str:
        return os.path.join(self.root, "write-bait")

    @property
    def read(self) -> str:
        return os.path.join(self.root, "read")

    @property
    def read_bait(self) -> str:
        return os.path.join(self.root, "read-bait")

    def make(self) -> None:
        for folder in (self.write, self.write_bait, self.read, self.read_bait):
            os.mkdir(folder, 0o700)
        _write(os.path.join(self.read, SECRET_NAME), "the folder judged\n")
        _write(os.path.join(self.read_bait, SECRET_NAME), f"{self.secret}\n")

    def swap(self) -> None:
        """The write folder becomes a link to its bait; the read folder trades places with its
        bait. Called between judging and binding."""
        os.rename(self.write, os.path.join(self.root, "write-judged"))
        os.symlink(self.write_bait, self.write)
        _exchange(self.read, self.read_bait)

    def plan(self) -> str:
        """The probe program's steps (`lnk_inside/probes.py`): write into the write grant, read the
        read grant's file."""
        return json.dumps(
            [
                {
                    "id": WRITE_ID,
                    "kind": "create",
                    "path": os.path.join(self.write, PLANTED_NAME),
                    "content": "planted by lnk sandbox check\n",
                },
                {"id": READ_ID, "kind": "read", "path": os.path.join(self.read, SECRET_NAME)},
            ]
        )


@dataclass(frozen=True)
class SwapSeen:
    """What the outside saw of one race."""

    refusal: str | None  # the controller's refusal, when it refused
    planted: bool  # a file the sandbox wrote is in the write bait
    secret_read: bool  # the read bait's secret is in what the sandbox printed


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _exchange(a: str, b: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    at_fdcwd = -100
    ctypes.set_errno(0)
    if libc.renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), RENAME_EXCHANGE) != 0:
        err = ctypes.get_errno()
        raise StateError(f"cannot exchange {a} and {b}: {os.strerror(err)}")


def swap_verdicts(seen: SwapSeen) -> list[Finding]:
    """The two findings of a race. Pure: the outside's evidence decides; a refusal is only
    `refused` when nothing got through either."""
    write_through = "a file the sandbox wrote is in the folder outside" if seen.planted else None
    read_through = "the folder outside's secret was read inside" if seen.secret_read else None
    how = clean_text(seen.refusal, 200) if seen.refusal else "the sandbox ran on the folder judged"
    if seen.refusal and CHANGED not in seen.refusal:  # refused for another rule: never raced
        how = f"not tried: the controller refused the race's grants ({how})"
    return [
        Finding(
            WRITE_ID,
            WRITE_TRIED,
            REFUSED,
            write_through or how,
            LEAKED if write_through else REFUSED,
        ),
        Finding(
            READ_ID, READ_TRIED, REFUSED, read_through or how, LEAKED if read_through else REFUSED
        ),
    ]


def _not_tried(why: str) -> list[Finding]:
    return [
        Finding(WRITE_ID, WRITE_TRIED, REFUSED, f"not tried: {why}", REFUSED),
        Finding(READ_ID, READ_TRIED, REFUSED, f"not tried: {why}", REFUSED),
    ]


def _request_args() -> argparse.Namespace:
    """A flags-only spec that grants nothing (the race's grants are added to it)."""
    args = namespace_from_document({})
    args.with_fd = []
    return args


def swap_findings(home: str, interrupts: Interrupts) -> list[Finding]:
    """Run the race once (see the module's docstring) and judge what the outside saw."""
    root = os.path.join(home, f"{PREFIX}swap-{secrets.token_hex(6)}")
    try:
        os.mkdir(root, 0o700)
    except OSError as exc:
        return _not_tried(f"cannot make a folder in your home ({exc.strerror})")
    swaps = Swaps(root, secrets.token_hex(32))
    try:
        swaps.make()
        args = _request_args()
        args.write, args.read = [swaps.write], [swaps.read]
        refusal = None
        run = CheckRun()
        try:
            run = run_probes(args, swaps.plan(), interrupts, judged=swaps.swap)
        except RemoteError as exc:
            if exc.exit_code != EXIT_REFUSED:
                raise
            refusal = str(exc)
        said = (run.stdout + run.stderr).decode("latin-1")
        return swap_verdicts(
            SwapSeen(
                refusal=refusal,
                planted=os.path.lexists(os.path.join(swaps.write_bait, PLANTED_NAME)),
                secret_read=swaps.secret in said,
            )
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
