"""The controller's config: one strict model. An unknown key, a wrong type or an impossible
value is fatal (`field: message`, exit 2); nothing falls back to a default silently.

Read from `<config dir>/controller.toml` when it exists; LNK_CONFIG_DIR, LNK_STATE_DIR and
LNK_RUN_DIR override the three folders, so a test runs an isolated box in a temp dir.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from pathlib import Path

from pydantic import Field, model_validator

from lnk_controller.limits import BoxLimits
from lnk_controller.seccomp import ALLOW_PREFIX, BLANKET_NAMES
from lnk_shared.admin_socket import admin_socket_in
from lnk_shared.launch_protocol import LAUNCH_SOCKET
from lnk_shared.paths import BoxPaths
from lnk_shared.service_config import ServiceFolders, load_service_config
from lnk_shared.service_identity import MIN_SANDBOX_UID

__all__ = ["CONFIG_FILE", "ControllerConfig", "load_config"]

log = logging.getLogger(__name__)

CONFIG_FILE = "controller.toml"
MAX_SANDBOX_UID = 2**31 - 1  # bwrap 0.8 writes its uid_map with "%d": larger uids fail there
DAY = 86_400


# Test switches, each reopening one class the wall closes so `lnk sandbox check` can be seen to
# report it (tests/e2e/test_check_wall_classes.py, test_check_caller_side.py). Never on a real
# box: every launch logs a warning naming each one that is on. Each: what it reopens, and the
# seccomp rule group it turns off (seccomp.UNSAFE_RELAXATIONS), if any.
UNSAFE_SWITCHES: dict[str, tuple[str, str | None]] = {
    "unsafe_allow_set_id_modes": ("set-uid/set-gid modes in write grants", "set_id_modes"),
    "unsafe_allow_shared_modes": (
        "group/other write modes and ACLs in write grants",
        "shared_modes",
    ),
    "unsafe_allow_host_listen": ("listening and datagram sockets in host mode", "host_listen"),
    "unsafe_writable_dev": ("a writable /dev", None),
    "unsafe_host_identity": ("sandboxes see the host's /etc/hosts and boot id", None),
    "unsafe_host_clock": ("sandboxes see when the host booted (/proc/uptime, btime)", None),
    "unsafe_caller_terminal": (
        "a caller's terminal on stdin, stdout or stderr is passed in as is",
        None,
    ),
    "unsafe_append_stdout": (
        "an append-only stdout or stderr is passed in as is (truncatable)",
        None,
    ),
    "unsafe_write_symlinks": ("sandboxes may make symbolic links in write grants", None),
    "unsafe_skip_mode_sweep": ("no strip of leftover modes at a sandbox's end", None),
    "unsafe_staging_open_to_all": ("staging 0711: other users reach granted folders", None),
    "unsafe_command_line_visible": ("bwrap's options and argv on its command line", None),
    "unsafe_placeholders_visible": ("placeholders as empty files, which git lists", None),
    "unsafe_protected_names_unguarded": ("no placeholder, no read-only protected name", None),
    "unsafe_login_path_unjudged": ("writes to login-PATH folders not refused", None),
    "unsafe_path_links_unjudged": (
        "a [commands] name found on PATH through links anyone may change is not refused",
        None,
    ),
    "unsafe_skip_identity_check": (
        "grants are bound by path, following links, without comparing them with what was judged",
        None,
    ),
    "unsafe_caller_env_unfiltered": (
        "every variable a client sends reaches the sandbox, not only TERM, LANG and LC_*",
        None,
    ),
    "unsafe_env_names_unjudged": (
        "[env] and --env may name what changes what a granted program runs (LD_*, BASH_ENV)",
        None,
    ),
    "unsafe_loader_maps_anything": (
        "the ELF loader may map any program under /usr or in a read grant holding a granted one",
        None,
    ),
}


class ControllerConfig(ServiceFolders):
    prefix: Path = Field(default_factory=lambda: Path(sys.prefix).parent, strict=False)
    python: Path = Field(default_factory=lambda: Path(sys.prefix) / "bin" / "python", strict=False)
    bwrap: Path = Field(default=Path("/usr/bin/bwrap"), strict=False)
    confiner: Path = Field(  # lnk-sandbox, built in at install (lnk_shared/native_build.py)
        default_factory=lambda: Path(__file__).resolve().parent / "native" / "lnk-sandbox",
        strict=False,
    )
    spawner: Path = Field(  # lnk-spawn, the launcher run as root (lnk_shared/native_build.py)
        default_factory=lambda: Path(__file__).resolve().parent / "native" / "lnk-spawn",
        strict=False,
    )
    uid_first: int = Field(default=2_000_000_000, ge=MIN_SANDBOX_UID, le=MAX_SANDBOX_UID)
    uid_last: int = Field(default=2_000_099_999, ge=MIN_SANDBOX_UID, le=MAX_SANDBOX_UID)
    # A sandbox's lease: a working day, so a forgotten sandbox is gone by the next one; its owner
    # extends it (lnk sandbox lease) up to max_lease_seconds, a week, so none runs unwatched longer.
    lease_seconds: int = Field(default=12 * 3600, ge=1, le=30 * DAY)
    max_lease_seconds: int = Field(default=7 * DAY, ge=1, le=30 * DAY)
    # Each of a sandbox's /tmp, /dev/shm and home tmpfs folders (MiB), never above its memory
    # limit (limits.tmpfs_size), whose pages they are: a quarter of the default 1 GiB each, so
    # a build's temporary files fit and the program keeps room of its own.
    tmp_size_mb: int = Field(default=256, ge=1, le=64 * 1024)
    # Retention (lnk_controller.retention): an ended sandbox's record and wire log are kept this
    # many days, and only the newest this many; `lnk box prune` prunes now.
    ended_keep_days: int = Field(default=30, ge=0, le=10 * 365)
    ended_keep_count: int = Field(default=10_000, ge=0, le=10_000_000)
    # The wire folder as a whole: past it the oldest ended sandboxes' logs go first. Below the
    # proxy's wire_box_max_bytes (8 GiB), which refuses running sandboxes' exchanges at it.
    wire_keep_bytes: int = Field(default=6 << 30, ge=0, le=16 << 40)
    # The services' logs under `lnk box up` (`<state>/logs/<service>.log`, lnk_admin.log_keeper):
    # each rotated before it passes log_max_bytes, its log_keep_count older files kept (16 MiB
    # holds ~50,000 launches of the controller's lines; 5 files a service at most). Under
    # systemd the journal holds the services' output and these are not used.
    log_max_bytes: int = Field(default=16 << 20, ge=64 << 10, le=1 << 40)
    log_keep_count: int = Field(default=4, ge=1, le=1000)
    unsafe_pretend_landlock_abi: int | None = Field(default=None, ge=1, le=64)
    # Test boxes only, each reopening one class (UNSAFE_SWITCHES says which).
    unsafe_allow_set_id_modes: bool = False
    unsafe_allow_shared_modes: bool = False
    unsafe_allow_host_listen: bool = False
    # Test boxes only: rows of the seccomp deny-list (seccomp.BLANKET_NAMES: keyctl, bpf, ptrace,
    # pidfd_getfd...) left out, so check's probe of each can be seen to report it leaked.
    unsafe_allow_syscalls: list[str] = Field(default_factory=list, max_length=64)
    unsafe_writable_dev: bool = False
    unsafe_host_identity: bool = False
    unsafe_host_clock: bool = False
    unsafe_caller_terminal: bool = False
    unsafe_append_stdout: bool = False
    unsafe_write_symlinks: bool = False
    unsafe_skip_mode_sweep: bool = False
    unsafe_skip_identity_check: bool = False
    unsafe_staging_open_to_all: bool = False
    unsafe_command_line_visible: bool = False
    unsafe_placeholders_visible: bool = False
    unsafe_protected_names_unguarded: bool = False
    unsafe_login_path_unjudged: bool = False
    unsafe_path_links_unjudged: bool = False  # test boxes only: check must report it leaked
    # A test switch: the lease reaper's thread dies by an injected exception on every Nth pass.
    unsafe_test_reaper_crash_every: int | None = Field(default=None, ge=1, le=1_000_000)
    # Each sandbox's limits and each owner's (`[limits]`, lnk_controller.limits.BoxLimits).
    limits: BoxLimits = Field(default_factory=BoxLimits)
    unsafe_loader_maps_anything: bool = False
    unsafe_caller_env_unfiltered: bool = False
    unsafe_env_names_unjudged: bool = False
    # Landlock logs denials only while audit is on: where the host left it off, the controller
    # turns it on (and only that: no rule, no daemon) so each run can say what it was denied
    # (lnk_controller.denials). False keeps the host's setting: runs then say nothing.
    denials_enable_audit: bool = True

    @model_validator(mode="after")
    def _check(self) -> ControllerConfig:
        unknown = sorted(set(self.unsafe_allow_syscalls) - BLANKET_NAMES)
        if unknown:
            raise ValueError(
                f"unsafe_allow_syscalls: {', '.join(unknown)} is not a row of the deny-list; "
                f"name calls among {', '.join(sorted(BLANKET_NAMES))}"
            )
        if self.uid_last < self.uid_first:
            raise ValueError("uid_last must not be below uid_first")
        if self.lease_seconds > self.max_lease_seconds:
            raise ValueError("lease_seconds must not exceed max_lease_seconds")
        for name in ("prefix", "python", "bwrap", "confiner", "spawner"):  # the folders: base
            if not getattr(self, name).is_absolute():
                raise ValueError(f"{name} must be an absolute path")
        if self.unsafe_pretend_landlock_abi is not None:
            log.warning(
                "unsafe_pretend_landlock_abi=%d: sandboxes are built as if the kernel had only "
                "that Landlock ABI (a test setting; never on a real box)",
                self.unsafe_pretend_landlock_abi,
            )
        if self.limits.unsafe_no_limits:
            log.warning(
                "limits.unsafe_no_limits: sandboxes run with NO process, memory, CPU or "
                "open-file limit, and the host's OOM killer does not take them before the "
                "box's services (a test setting; never on a real box)"
            )
        if self.limits.unsafe_allow_unlimited:
            log.warning(
                "limits.unsafe_allow_unlimited: sandboxes start even where no cgroup limit "
                "can be applied"
            )
        if self.unsafe_switches or self.unsafe_allow_syscalls:
            self.warn_unsafe()
        if self.unsafe_test_reaper_crash_every is not None:
            log.warning(
                "unsafe_test_reaper_crash_every=%d: the lease reaper's thread is killed by an "
                "injected exception on every %d. pass (a test setting; never on a real box)",
                self.unsafe_test_reaper_crash_every,
                self.unsafe_test_reaper_crash_every,
            )
        return self

    def unsafe_wall_switches(self) -> list[str]:
        """The `unsafe_…` switches that are on, each with what it reopens, as logged."""
        said = [f"{name} is on: {UNSAFE_SWITCHES[name][0]}" for name in self.unsafe_switches]
        if self.unsafe_allow_syscalls:
            said.append(
                "unsafe_allow_syscalls is on: the seccomp deny-list leaves out "
                + ", ".join(self.unsafe_allow_syscalls)
            )
        return said

    @property
    def unsafe_switches(self) -> tuple[str, ...]:
        """The names of the `unsafe_…` class switches that are on."""
        return tuple(name for name in UNSAFE_SWITCHES if getattr(self, name) is True)

    @property
    def unsafe_seccomp(self) -> frozenset[str]:
        """The seccomp rule groups the switches turn off (`seccomp.UNSAFE_RELAXATIONS`)."""
        groups = (UNSAFE_SWITCHES[name][1] for name in self.unsafe_switches)
        rows = (f"{ALLOW_PREFIX}{name}" for name in self.unsafe_allow_syscalls)
        return frozenset(group for group in groups if group is not None) | frozenset(rows)

    def warn_unsafe(self) -> None:
        """Logged when the config loads while a class switch is on (each launch logs its own)."""
        for switch in self.unsafe_wall_switches():
            log.warning("%s (a test setting; never on a real box)", switch)

    @property
    def paths(self) -> BoxPaths:
        return BoxPaths(self.config_dir, self.state_dir, self.run_dir)

    @property
    def api_socket(self) -> Path:
        return self.run_dir / "controller.sock"

    @property
    def launch_socket(self) -> Path:
        return self.run_dir / LAUNCH_SOCKET

    @property
    def homes_dir(self) -> Path:
        return self.state_dir / "homes"

    @property
    def proxy_dir(self) -> Path:
        """The proxy's folder: its admin socket and each sandbox's listener."""
        return self.run_dir / "proxy"

    @property
    def proxy_admin_socket(self) -> Path:
        return admin_socket_in(self.run_dir, "proxy")

    @property
    def flags_dir(self) -> Path:
        """Stop and pause marker files the controller writes and the proxy reads."""
        return self.run_dir / "flags"

    @property
    def staging_root(self) -> Path:
        return self.run_dir / "sandboxes"

    @property
    def wire_dir(self) -> Path:
        """The proxy's wire logs, one `<sandbox id>.log` each."""
        return self.state_dir / "wire"

    @property
    def database(self) -> Path:
        return self.state_dir / "controller.db"


def load_config(env: Mapping[str, str] | None = None) -> ControllerConfig:
    """Load and validate the controller's config; raise ConfigError naming each bad field."""
    return load_service_config(ControllerConfig, CONFIG_FILE, env)
