"""Cleaning a sandbox away: its cgroup and every process of its host uid, every mount made for
it, its staging folder, its user, group and home. Idempotent, and safe to run after a crash
(reconcile): it works from the record alone, never from memory.

If a step fails the others still run, the record is marked `stopping` and a StateError says what
is left, so the next reconcile tries again; a sandbox is marked `ended` only when nothing is left.
A clean-up that is cut short (the controller killed) leaves the record live as it was, which the
next start's reconcile finds the same way: one write per clean-up, not two.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

from lnk_controller import (
    bridge_link,
    cgroups,
    host_users,
    idmap_mounts,
    leftover_modes,
    proxy_link,
    sandbox_limits,
)
from lnk_controller.config import ControllerConfig
from lnk_controller.models import SandboxRow
from lnk_controller.placeholders import PLACEHOLDER, remove_placeholders, settle
from lnk_controller.sandbox_store import SandboxStore
from lnk_shared.errors import StateError

__all__ = ["BRIDGE_RECORD", "PROXY_RECORD", "clean_sandbox", "reconcile"]

PROXY_RECORD = "proxy:"  # a record of the sandbox's proxy listener, closed at cleanup
BRIDGE_RECORD = "bridge:"  # a record of an agent's store bridge socket, closed at cleanup

log = logging.getLogger(__name__)


# Users removed beside the rest of their sandboxes' clean-ups: as many at once as launches make
# them (launch.py's user makers); each clean-up waits for its own before it reports.
USER_REMOVERS = 4
_user_removers = ThreadPoolExecutor(max_workers=USER_REMOVERS, thread_name_prefix="user-remove")

_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


def _lock_for(sandbox_id: str) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault(sandbox_id, threading.Lock())


def clean_sandbox(
    sandbox_id: str, store: SandboxStore, cfg: ControllerConfig, *, exit_status: int | None = None
) -> None:
    """Clean one sandbox away; callers racing on one sandbox (a stop and its own end) take
    turns, and the second finds it ended."""
    with _lock_for(sandbox_id):
        _clean(sandbox_id, store, cfg, exit_status)
    with _locks_guard:
        _locks.pop(sandbox_id, None)


def _clean(
    sandbox_id: str, store: SandboxStore, cfg: ControllerConfig, exit_status: int | None
) -> None:
    settle(sandbox_id)  # a held start's placeholders still being made: all in the record first
    row = store.get(sandbox_id)
    if row is None or row.state == "ended":
        return
    problems: list[str] = []
    # The chain's first process (root, the parent of the sandbox's pid namespace, outside the
    # cgroup): killed, it takes the namespace with it and its launch reports the kill (137).
    host_users.kill_recorded_process(row.pid, row.pid_start)
    try:  # the whole group at once: a process forked meanwhile cannot outlive it
        killed = cgroups.remove(sandbox_id)
    except StateError as exc:
        problems.append(str(exc))
        killed = False
    # Every process of the sandbox's uid was born in its group and none can leave it (see
    # cgroups), so a group emptied here is the proof that none is left. When there was no
    # group to empty (a clean-up run again) or it could not be emptied, we look for them by
    # uid, through pidfds: a scan of all of /proc, a quarter of a clean-up's time.
    if not killed:
        try:
            host_users.kill_uid_processes(row.host_uid)
            killed = True
        except StateError as exc:
            problems.append(str(exc))
    if killed:  # its limits' v1 groups, empty now (every process was in the v2 group too)
        try:
            sandbox_limits.remove_leftovers(sandbox_id)
        except StateError as exc:
            problems.append(str(exc))
    user = host_users.sandbox_user(row.host_uid, homes_dir=cfg.homes_dir)
    # No process of its uid is left (`killed`), so nothing below needs the user any more: its
    # home and /etc lines are removed (fsynced rewrites, a third of a plain clean-up) while the
    # placeholders and mounts go. Otherwise after them, killing what is left first, as before.
    removing = None
    if killed:
        removing = _user_removers.submit(host_users.remove_user, user, processes_killed=True)
    problems += _remove_staged(row, cfg, killed=killed)
    try:
        if removing is not None:
            removing.result()
        else:
            host_users.remove_user(user, processes_killed=False)
    except StateError as exc:
        problems.append(str(exc))
    proxy_link.clear_flags(cfg, sandbox_id)
    if problems:
        store.mark_stopping(sandbox_id)
        raise StateError(f"sandbox {sandbox_id} is not fully cleaned: " + "; ".join(problems))
    store.mark_ended(sandbox_id, exit_status)
    log.info("sandbox %s cleaned (uid %d)", sandbox_id, row.host_uid)


def _remove_staged(row: SandboxRow, cfg: ControllerConfig, *, killed: bool) -> list[str]:
    """Remove the sandbox's placeholders, close its listeners, strip what it left in its write
    grants (when no process is left to race that), and unmount and remove everything staged
    for it; what could not be done."""
    problems: list[str] = []
    targets = list(reversed(json.loads(row.mounts_json)))
    placeholders = [t for t in targets if t.startswith(PLACEHOLDER)]
    problems += _remove_placeholders(placeholders, owner_uid=row.owner_uid)
    mounts = []
    for target in targets:
        try:
            if target.startswith(PLACEHOLDER):
                continue  # removed above
            if target.startswith(PROXY_RECORD):
                proxy_link.close_listener(cfg, target[len(PROXY_RECORD) :])
            elif target.startswith(BRIDGE_RECORD):  # an agent's store bridge socket
                bridge_link.close_agent(cfg.run_dir, target[len(BRIDGE_RECORD) :])
            else:
                mounts.append(target)
                sweep = killed and not cfg.unsafe_skip_mode_sweep  # no process left to race it
                if sweep and _is_write_grant(target):
                    _sweep(target, row.created_at)
        except StateError as exc:
            problems.append(str(exc))
    staging = Path(row.staging_dir)
    try:  # the staging dir's own mount, and with it every mount staged in it, at once
        idmap_mounts.detach(staging)
    except StateError as exc:
        problems.append(str(exc))
    for target in mounts:  # their mount points (and any mount staged elsewhere)
        try:
            idmap_mounts.unmount(Path(target))
        except StateError as exc:
            problems.append(str(exc))
    try:
        staging.rmdir()
    except FileNotFoundError:
        pass
    except OSError as exc:
        problems.append(f"cannot remove {staging}: {exc.strerror}")
    return problems


def _remove_placeholders(records: list[str], *, owner_uid: int) -> list[str]:
    """Put the owner's placeholders back in the owner's pool, remove the rest (in one batch:
    placeholders.remove_placeholders); what could not be removed. Each name is gone when this
    returns; the wait for the freed blocks' discard (2-4 ms each on a filesystem mounted with
    `discard`) is left to `late_close`, off the launch's reply."""
    return remove_placeholders(records, owner_uid=owner_uid)


_GRANT_NAME = re.compile(r"g[0-9]+")  # staging.stage_sandbox's names for granted folders


def _is_write_grant(target: str) -> bool:
    if not _GRANT_NAME.fullmatch(os.path.basename(target)):
        return False
    try:  # not mounted any more (a clean-up run again): an empty mount point, nothing to strip
        return not os.statvfs(target).f_flag & os.ST_RDONLY
    except OSError:
        return False


def _sweep(target: str, started: datetime) -> None:
    """Strip set-id and shared write from what the sandbox left (leftover_modes); a failure
    is logged and the clean-up goes on: the mount must still go."""
    since = int(started.replace(tzinfo=started.tzinfo or UTC).timestamp()) * 1_000_000_000
    try:
        changed = leftover_modes.sweep(Path(target), since)
    except StateError as exc:
        log.error("%s", exc)
        return
    if changed:
        log.warning("stripped set-id or shared write from %d entries a sandbox left", changed)


def reconcile(store: SandboxStore, cfg: ControllerConfig) -> int:
    """On start: clean every recorded sandbox that is not over (none of them can be running:
    their bwrap died with the controller that started it). Returns how many were cleaned."""
    cleaned = 0
    for row in store.find(live_only=True):
        try:
            clean_sandbox(row.id, store, cfg)
            cleaned += 1
        except StateError as exc:
            log.error("reconcile: %s", exc)
    known = {row.host_uid for row in store.find(live_only=True)}
    homes = str(cfg.homes_dir)
    for user in host_users.list_lnk_users():
        if user.uid in known or not cfg.uid_first <= user.uid <= cfg.uid_last:
            continue
        if user.home and os.path.dirname(user.home) != homes:
            continue  # another box's user on this machine: not ours to remove
        try:  # a user with no record: made by a controller that crashed before writing it
            host_users.remove_user(user)
            cleaned += 1
        except StateError as exc:
            log.error("reconcile: %s", exc)
    return cleaned
