"""Starting a sandbox's chain held (spawn.py), and releasing its program once the
placeholders left to make (`Staged.held`) are made and sealed: the confiner waits on a pipe
only this thread writes, and anything but the release refuses.

What this does NOT do: stage, plan or record the sandbox (launch.py does, before and after).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from lnk_controller import sandbox_limits
from lnk_controller.as_caller import credentials_of
from lnk_controller.config import ControllerConfig
from lnk_controller.denials import DenialReader
from lnk_controller.host_users import HostUser
from lnk_controller.judged import Judged
from lnk_controller.launch_request import TerminalSize
from lnk_controller.limits import Limits
from lnk_controller.models import SandboxRow
from lnk_controller.placeholders import make_held
from lnk_controller.sandbox_plan import SandboxPlan
from lnk_controller.sandbox_store import SandboxStore
from lnk_controller.spawn import RELEASE, spawn_sandbox
from lnk_controller.staging import Staged
from lnk_controller.stdio_guard import GuardedStdio

__all__ = ["HeldStart"]


class HeldStart:
    """The launcher's start of the chain (`launch.Launcher` is one), with its limits applied
    to the sandbox's cgroup on the way."""

    cfg: ControllerConfig
    store: SandboxStore
    denials: DenialReader | None
    _limits: dict[str, sandbox_limits.Applied]  # sandbox id -> its limits

    def _spawn(
        self,
        row: SandboxRow,
        user: HostUser,
        plan: SandboxPlan,
        streams: tuple[tuple[int, int, int], GuardedStdio | None],
        *,
        terminal: TerminalSize | None,
        limits: Limits | None,
        staged: Staged,
        judged: Judged,
    ) -> tuple[subprocess.Popen[bytes], int | None, int]:
        """Start the sandbox's chain; for a held start, make its placeholders meanwhile and
        release its program. Whatever fails, nothing of the program has run."""
        cfg = self.cfg
        stdio, guarded = streams
        # A held start (placeholders left to make, `Staged.held`): the confiner waits on this
        # pipe, which only this thread writes, until every one is made and sealed.
        release_r, release_w = os.pipe2(os.O_CLOEXEC) if staged.held else (-1, -1)
        try:
            if self.denials is not None:  # before its first process: its first denial is mapped
                self.denials.started(row.id, row.host_uid)
            process, master, status_r = spawn_sandbox(
                cfg=cfg,
                row=row,
                user=user,
                layout=plan.layout,
                policy=plan.policy,
                stdio=stdio,
                terminal=terminal,
                limiter=lambda group: self._apply_limits(row.id, group, limits),
                release_fd=release_r,
            )
        except BaseException:
            if guarded is not None:
                guarded.close()
            if release_w >= 0:
                os.close(release_w)
            raise
        finally:
            if release_r >= 0:
                os.close(release_r)
        if release_w >= 0:
            try:
                self._release_held(row, staged, judged, release_w)
            except BaseException:
                process.kill()  # never released: the confiner refuses at the pipe's end
                process.wait()
                os.close(status_r)
                if master is not None:
                    os.close(master)
                if guarded is not None:
                    guarded.close()
                raise
        return process, master, status_r

    def _release_held(
        self, row: SandboxRow, staged: Staged, judged: Judged, release_w: int
    ) -> None:
        """Make and seal the placeholders of a held start while bwrap and the confiner start,
        then release the program (`spawn.RELEASE`); the pipe is closed either way, and a
        confiner that reads its end without the release refuses to run anything."""
        try:
            make_held(
                staged.held,
                sandbox_id=row.id,
                store=self.store,
                caller=judged.caller or credentials_of(row.owner_uid),
            )
            os.write(release_w, RELEASE)
        finally:
            os.close(release_w)

    def _apply_limits(self, sandbox_id: str, group: Path, limits: Limits | None) -> list[str]:
        applied = sandbox_limits.apply(self.cfg.limits, sandbox_id, group, limits)
        self._limits[sandbox_id] = applied
        return applied.launcher_args()
