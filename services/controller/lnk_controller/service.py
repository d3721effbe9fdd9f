"""The controller service: prepare the box's folders, open the database, clean what a previous
run left (reconcile), then serve the launch socket, the API socket and the lease reaper until
SIGTERM or SIGINT.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
import time
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import uvicorn

from lnk_controller import (
    cgroup_favor,
    cgroup_limits,
    cgroups,
    idmap_mounts,
    landlock,
    placeholder_pool,
    proxy_link,
    seccomp,
)
from lnk_controller.accounts import Accounts
from lnk_controller.agent_launch import reconcile_agents
from lnk_controller.agents import AgentRegistry
from lnk_controller.api import PeerCredProtocol, make_app
from lnk_controller.api_server import RestingServer
from lnk_controller.bridge_reconcile import reconcile_every
from lnk_controller.cleanup import clean_sandbox, reconcile
from lnk_controller.config import ControllerConfig
from lnk_controller.db import open_database
from lnk_controller.denials import DenialReader, write_status
from lnk_controller.forget_account import forget_account
from lnk_controller.launch import Launcher
from lnk_controller.launch_socket import LaunchServer
from lnk_controller.reap_wait import ReapWait
from lnk_controller.reaper import Reaper
from lnk_controller.remembered import RememberedSpecs
from lnk_controller.retention import PruneDue, prune_every
from lnk_controller.sandbox_store import SandboxStore
from lnk_controller.secret_store import SecretStore, load_box_key
from lnk_controller.supervisor import supervise
from lnk_shared.box_folders import folder_named, folders_for, path_of
from lnk_shared.errors import LaunchRefused, StateError
from lnk_shared.kernel_features import missing_features
from lnk_shared.unix import bind_socket
from lnk_shared.waking_event import WakingEvent

__all__ = ["run_controller"]

log = logging.getLogger("lnk_controller")
# At stop, how long launches whose sandboxes were just cleaned get to tell their clients.
DRAIN_TIMEOUT_S = 5.0

RUN_DIR_MODE = folder_named("run", "").mode  # clients must reach the sockets in it
SOCKET_MODE = 0o666  # any local user may ask; SO_PEERCRED says who, and each sees only its own
# How long a thread holding the GIL runs before one waiting for it is let in (Python's default:
# 5 ms). A write grant's start runs the launch's thread beside the placeholders' worker, each
# giving the GIL up at every syscall and waiting for the other's interval to take it back: at
# 5 ms the write row's `started` was 30-33 ms, at 0.5 ms 18-22 (0.1 no better); the plain and
# read rows and the controller's idle CPU did not move (bench/README, session 12, h14c).
GIL_SWITCH_INTERVAL_S = 0.0005
_MS_BIND = 4096
_MS_REC = 16384
_MS_PRIVATE = 1 << 18


def _private_mount(path: Path) -> None:
    """Make `path` a mount of its own with private propagation, so staged mounts made under it
    do not appear in (or vanish from) every peer of a shared `/`."""
    libc = ctypes.CDLL(None, use_errno=True)
    target = os.fsencode(path)
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        mounted = any(line.split()[4] == str(path) for line in f)
    if not mounted and libc.mount(target, target, None, _MS_BIND | _MS_REC, None) != 0:
        raise StateError(f"cannot bind {path} onto itself: {os.strerror(ctypes.get_errno())}")
    if libc.mount(None, target, None, _MS_PRIVATE | _MS_REC, None) != 0:
        raise StateError(f"cannot make {path} private: {os.strerror(ctypes.get_errno())}")


def _prepare_dirs(cfg: ControllerConfig) -> None:
    """The controller's own folders (lnk_shared.box_folders), each with its mode set; the
    staging folder then a mount of its own."""
    for folder in folders_for("controller"):
        path = path_of(folder, state_dir=cfg.state_dir, run_dir=cfg.run_dir)
        path.mkdir(parents=True, exist_ok=True)
        os.chmod(path, folder.mode)
    _private_mount(cfg.staging_root)


def _check_kernel(cfg: ControllerConfig) -> None:
    """Log (not refuse) what is missing: each launch refuses on its own, naming it."""
    try:
        log.info("Landlock ABI %d", landlock.probe_abi())
    except LaunchRefused as exc:
        log.error("%s: every launch will be refused", exc)
    if not cfg.bwrap.exists():
        log.error("%s is missing: every launch will be refused", cfg.bwrap)
    try:  # compiled once per process: here, so the first launch does not pay for it
        seccomp.programs()
    except LaunchRefused as exc:
        log.error("%s: every launch will be refused", exc)
    try:
        idmap_mounts.check_support("/")
    except (LaunchRefused, StateError) as exc:
        log.error("%s", exc)
    for line in missing_features():
        log.warning("%s", line)


def _reaper(
    store: SandboxStore, cfg: ControllerConfig, launcher: Launcher, wait: ReapWait
) -> Reaper:
    return Reaper(
        live_rows=lambda: store.find(live_only=True),
        active=launcher.active,
        clean=lambda sandbox_id: clean_sandbox(sandbox_id, store, cfg),
        now=lambda: datetime.now(UTC),
        clock=time.monotonic,
        crash_every=cfg.unsafe_test_reaper_crash_every,
        wait=wait,
    )


def _place_cgroups() -> None:
    """Under systemd's Delegate= the sandboxes' groups go in the controller's own subtree (it
    moves itself into a leaf of it first); elsewhere they stay at the root's lnk.sandboxes,
    found here once: looking for the cgroup2 mount at each group's making and removal read
    /proc/self/mountinfo twice a launch (0.1-0.2 ms each)."""
    try:
        cgroup_root = cgroups.root()
        parent = cgroup_limits.delegated_parent(cgroup_root, cgroup_limits.own_v2_group())
    except (LaunchRefused, StateError, OSError) as exc:
        log.error("cannot use the controller's own cgroup subtree: %s", exc)
        return
    if parent is not None:
        cgroups.use_parent(parent)
        log.info("sandboxes' cgroups go in %s (delegated to the controller)", parent)
    else:
        cgroups.use_parent(cgroup_root / cgroups.PARENT)


def run_controller(cfg: ControllerConfig) -> None:
    if os.geteuid() != 0:
        raise StateError("the controller runs as root (it makes users and mounts)")
    os.umask(0o022)
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    _prepare_dirs(cfg)
    engine = open_database(cfg.database)
    reap_wait = ReapWait()  # the reaper sleeps until a lease ends, or the store or a launch rings
    prune_due = PruneDue(cfg.ended_keep_count)  # a prune as soon as the ended records may pass it
    store = SandboxStore(
        engine, lease_written=reap_wait.ring_by, ended=prune_due.ended, stopping=reap_wait.ring
    )
    remembered = RememberedSpecs(engine)
    _check_kernel(cfg)
    _place_cgroups()
    cgroup_favor.apply(enabled=cfg.limits.favordynmods, limits_on=not cfg.limits.unsafe_no_limits)
    placeholder_pool.configure(cfg.state_dir / "placeholder-pool")  # emptied: never trusted
    cleaned = reconcile(store, cfg)
    if cleaned:
        log.info("reconcile: cleaned %d sandbox(es) a previous run left", cleaned)

    agents = AgentRegistry(engine, cfg.state_dir / "agent-keys")
    if reconcile_agents(cfg, store, agents):
        log.info("reconcile: agents without a sandbox marked stopped")
    secrets = SecretStore(engine, load_box_key(cfg.state_dir / "secrets.key"))
    denials = DenialReader(enable_audit=cfg.denials_enable_audit)
    denials.start()
    write_status(cfg.run_dir, denials.status)
    launcher = Launcher(
        cfg,
        store,
        remembered,
        agents,
        secrets=secrets,
        denials=denials,
        left_to_reaper=reap_wait.ring,
    )
    forget = partial(
        forget_account, cfg=cfg, store=store, remembered=remembered, agents=agents, secrets=secrets
    )
    accounts = Accounts(
        engine,
        forget=forget,
        exempt=lambda uid: cfg.uid_first <= uid <= cfg.uid_last,  # sandboxes keep no records
    )
    launch_sock = bind_socket(cfg.launch_socket, mode=SOCKET_MODE, dir_mode=RUN_DIR_MODE)
    api_sock = bind_socket(cfg.api_socket, mode=SOCKET_MODE, dir_mode=RUN_DIR_MODE)
    server = LaunchServer(launch_sock, launcher, accounts)
    threading.Thread(target=server.serve_forever, name="launch", daemon=True).start()
    stop = WakingEvent()  # the threads that sleep on a descriptor wake at once when it is set
    reaper = _reaper(store, cfg, launcher, reap_wait)
    supervise("reaper", reaper.run, stop)
    keep = {"keep_days": cfg.ended_keep_days, "keep_count": cfg.ended_keep_count}
    keep["wire_keep_bytes"] = cfg.wire_keep_bytes
    supervise("retention", prune_every(engine, cfg.wire_dir, **keep, due=prune_due), stop)
    supervise("bridge-reconcile", reconcile_every(cfg, store), stop)
    keeper = threading.Thread(  # a restarted proxy gets every running sandbox's listener
        target=proxy_link.keep_listeners, args=(cfg, stop), name="proxy-listeners", daemon=True
    )
    keeper.start()

    app = make_app(
        cfg,
        store,
        remembered,
        agents,
        accounts,
        retrying=reaper.retrying,
        engine=engine,
        secrets=secrets,
    )
    config = uvicorn.Config(app, http=PeerCredProtocol, lifespan="off", log_level="warning")
    api = RestingServer(config)  # no 0.1 s tick: it wakes for requests and its stop
    # uvicorn shuts down on SIGTERM, then raises the signal again for whoever handled it
    # before: under the default disposition that would end the process here, before the
    # sandboxes below are cleaned. Handled, it is just the end of api.run.
    signal.signal(signal.SIGTERM, lambda *_: log.info("stopping: cleaning every sandbox"))
    log.info("controller ready: %s, %s", cfg.launch_socket, cfg.api_socket)
    try:
        api.run(sockets=[api_sock])
    finally:
        stop.set()
        prune_due.wake()
        reaper.shutdown()
        server.shutdown()
        left = 0
        for row in store.find(live_only=True):
            try:
                clean_sandbox(row.id, store, cfg)
            except StateError as exc:
                left += 1
                log.error("%s", exc)
        server.drain(DRAIN_TIMEOUT_S)
        for path in (cfg.launch_socket, cfg.api_socket):
            path.unlink(missing_ok=True)
        if not left:  # a clean stop leaves no mount; what is left waits for the next reconcile
            try:
                idmap_mounts.unmount(cfg.staging_root)
            except StateError as exc:
                log.error("%s", exc)
