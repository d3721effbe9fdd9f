"""The end of a sandbox: its exit status waited for, what it met said (its limits, what the
kernel denied it), and its clean-up, or its hand-over to the reaper when the clean-up fails.

What this does NOT do: clean anything itself (cleanup.py does), or stop a running sandbox.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable

from lnk_controller import sandbox_limits
from lnk_controller.agents import AgentRegistry
from lnk_controller.cleanup import clean_sandbox
from lnk_controller.config import ControllerConfig
from lnk_controller.denial_hints import rules_of
from lnk_controller.denials import DenialReader
from lnk_controller.limits import describe as describe_limits
from lnk_controller.sandbox_store import SandboxStore
from lnk_controller.spawn import Running
from lnk_shared.discovery import DEFAULT_PATH, context_for
from lnk_shared.errors import SpecError, StateError

__all__ = ["Ending"]

log = logging.getLogger(__name__)


class Ending:
    """The launcher's end of a sandbox (`launch.Launcher` is one)."""

    cfg: ControllerConfig
    store: SandboxStore
    agents: AgentRegistry | None
    denials: DenialReader | None
    ledger: sandbox_limits.Ledger
    _places: dict[str, int]
    _limits: dict[str, sandbox_limits.Applied]
    _active: set[str]
    _active_guard: threading.Lock
    _left_to_reaper: Callable[[], None]  # wakes the lease reaper for a row it now owns

    def limits_outcome(self, running: Running) -> str | None:
        """The limit the sandbox met, said to its client (read before its clean-up)."""
        applied = self._limits.get(running.row.id)
        met = sandbox_limits.outcome(applied) if applied is not None else None
        if met is not None:  # `lnk sandbox list` and `show` say it too
            self.store.set(running.row.id, limit_met=met)
        return met

    def denials_outcome(self, running: Running, status: int) -> str | None:
        """What the kernel denied the sandbox, kept for `show` and said to its client when its
        program failed (read before its clean-up, as its limits are)."""
        summary = self.denials.ended(running.row.id, running.row.host_uid) if self.denials else None
        if summary is None or not summary.count:
            return None
        try:  # the owner's rules, so a hint never names a grant the box refuses
            owner = running.row.owner_uid
            ctx = context_for(owner, env={"PATH": DEFAULT_PATH}, box=self.cfg.paths)
            lines = summary.lines(ctx.home, rules_of(ctx))
            self.store.set(
                running.row.id, denials=json.dumps({"count": summary.count, "examples": lines})
            )
        except (SpecError, StateError, OSError) as exc:  # the run's status matters more
            log.error("sandbox %s: its denials are not recorded: %s", running.row.id, exc)
            return None
        return summary.said(running.row.id, lines) if status != 0 else None

    def limits_said(self, running: Running) -> str:
        """The sandbox's limits as a person reads them (`lnk sandbox check` reports them)."""
        applied = self._limits.get(running.row.id)
        if applied is None or applied.limits is None:
            return "none (limits.unsafe_no_limits)"
        held = [f"v2 {c}" for c in applied.v2] + [f"v1 {c}" for c in applied.v1]
        where = ", ".join(held) or "none, rlimits only"
        return f"{describe_limits(applied.limits)} (cgroups: {where})"

    def _release(self, sandbox_id: str) -> None:
        """Give back the owner's place and remove the limits' groups (after the clean-up
        emptied the sandbox's cgroup)."""
        place = self._places.pop(sandbox_id, None)
        if place is not None:
            self.ledger.release(place)
        applied = self._limits.pop(sandbox_id, None)
        if applied is not None:
            sandbox_limits.release(applied)

    def waited(self, running: Running) -> int:
        """Wait for the sandbox's program; its exit status (128+N for a signal, as shells do)."""
        status = running.process.wait()
        if running.stdio is not None:  # its output reaches the caller before its status
            running.stdio.drain()
        return status if status >= 0 else 128 - status

    def clean(self, running: Running, status: int) -> None:
        """Clean the sandbox away once its program is over. A clean-up that fails (something
        left, or the database unwritable: a full disk) is logged and left to the reaper, which
        retries it until it lands: the program's status is known, and its client gets it."""
        if self.clean_or_leave(running.row.id, status) and self.agents is not None:
            try:
                self.agents.stopped(running.row.host_uid)
            except StateError as exc:  # the agent's stale uid is forgotten at its next start
                log.error("sandbox %s: %s", running.row.id, exc)

    def clean_or_leave(self, sandbox_id: str, status: int | None) -> bool:
        """Clean the sandbox, or leave it to the reaper: whether it is clean."""
        cleaned = False
        try:
            clean_sandbox(sandbox_id, self.store, self.cfg, exit_status=status)
            cleaned = True
        except StateError as exc:
            log.error("%s; the reaper retries it", exc)
        finally:
            self._release(sandbox_id)
            with self._active_guard:
                self._active.discard(sandbox_id)
            if not cleaned:  # a live row no launch has: the reaper's from now on
                self._left_to_reaper()
        return cleaned
