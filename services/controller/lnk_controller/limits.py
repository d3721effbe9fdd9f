"""What a sandbox may use, and what an owner may run at once: pure decisions, no I/O.

The box's defaults (controller.toml, `ControllerConfig.limits`) are also its ceilings: a launch
may ask for less (`--memory 256M`, `--processes 64`, `--cpu 50`, `--open-files 256`), never for
more; more is refused naming the limit, before anything of the sandbox exists. An owner may run
`owner_sandboxes` sandboxes at once, whose memory limits together stay within `owner_memory_mb`.

How the limits are enforced is elsewhere: cgroup_limits.py (the kernel's cgroup controllers, v2
or v1) and the launcher's rlimits (native/lnk_spawn.c). Does NOT stop: disk use outside the
sandbox's tmpfs folders (a granted writable folder is the owner's disk), I/O bandwidth, or
kernel memory a hybrid host's v1 memory controller does not count.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from lnk_shared.errors import LaunchRefused
from lnk_shared.limit_requests import MIB, parse_size

__all__ = [
    "MIB",
    "BoxLimits",
    "Limits",
    "admit",
    "describe",
    "mib",
    "outcome_message",
    "parse_size",
    "requested",
    "requested_by_spec",
    "tmpfs_size",
]

# The smallest memory a sandbox may ask for: bwrap, the confiner and a shell start in ~8 MiB;
# below this a sandbox would die before its program runs, which reads as a bug, not a limit.
MIN_MEMORY_MB = 16
# The fewest processes: bwrap's two, the confiner, the program and a child of it.
MIN_PROCESSES = 8
# The fewest open files: the three streams, bwrap's status and the program's own few.
MIN_OPEN_FILES = 32
MAX_CPU_PERCENT = 100 * 1024  # one hundred percent per core, cores up to 1024


class BoxLimits(BaseModel):
    """The box's limits, `[limits]` in controller.toml. The defaults suit a small box (2 cores,
    4 GiB): one sandbox cannot take more than a quarter of its memory, a core, or the pids of
    more than a few hundred processes; an owner cannot hold more than the box's memory."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    # pids (processes and threads) per sandbox: a build runs a few dozen; a fork bomb stops here.
    processes: int = Field(default=512, ge=MIN_PROCESSES, le=4_194_304)
    # Memory per sandbox, its /tmp, /dev/shm and home tmpfs folders included (the kernel charges
    # their pages to it): a quarter of a 4 GiB box.
    memory_mb: int = Field(default=1024, ge=MIN_MEMORY_MB, le=16 * 1024 * 1024)
    # CPU per sandbox in percent of one core (cfs quota / cpu.max): one core of two, so the
    # controller, the proxy and other sandboxes keep the other.
    cpu_percent: int = Field(default=100, ge=1, le=MAX_CPU_PERCENT)
    # Open files per process (RLIMIT_NOFILE): the usual soft limit; the kernel's own ceiling per
    # process is far higher, and its file table is shared by every sandbox.
    open_files: int = Field(default=1024, ge=MIN_OPEN_FILES, le=1_048_576)
    # Sandboxes one owner runs at once: a handful of agents and shells.
    owner_sandboxes: int = Field(default=8, ge=1, le=10_000)
    # The sum of one owner's sandboxes' memory limits: a 4 GiB box's memory, so one owner never
    # holds more than the box has (4 sandboxes at the default, 8 asking for 512M each).
    owner_memory_mb: int = Field(default=4096, ge=MIN_MEMORY_MB, le=64 * 1024 * 1024)
    # Memory all sandboxes together leave to the host (the controller, the proxy, the bridges,
    # sshd and the system): their common cgroup is limited to the host's memory less this.
    reserve_memory_mb: int = Field(default=512, ge=64, le=16 * 1024 * 1024)
    # On a hybrid host (v1 groups joined at each launch): remount the host's cgroup2 mount with
    # favordynmods at the controller's start, so a join stops waiting on the kernel's global
    # lock (~14 ms each on a loaded 2-core host, ~0.5 ms with it; cgroup_favor.py). The whole
    # host's, and from 6.18 kept until a reboot: false leaves the host's mount alone.
    favordynmods: bool = True
    # A host where the kernel can apply no limit (no cgroup controller to use) refuses to start
    # sandboxes; this lets them start with rlimits only (a warning at each launch).
    unsafe_allow_unlimited: bool = False
    # Test only: no cgroup limit, no rlimit and no OOM score above the services' at all, so
    # `lnk sandbox check` can show it leaks.
    unsafe_no_limits: bool = False


@dataclass(frozen=True)
class Limits:
    """One sandbox's limits, as enforced."""

    processes: int
    memory_bytes: int
    cpu_percent: int
    open_files: int

    def as_json(self) -> dict[str, int]:
        return {
            "processes": self.processes,
            "memory_bytes": self.memory_bytes,
            "cpu_percent": self.cpu_percent,
            "open_files": self.open_files,
        }


def mib(size: int) -> str:
    """`512 MiB`, `1.5 GiB`: a size as a person reads it."""
    if size >= 1024 * MIB and size % (1024 * MIB) == 0:
        return f"{size // (1024 * MIB)} GiB"
    if size >= 1024 * MIB:
        return f"{size / (1024 * MIB):.1f} GiB"
    return f"{size // MIB} MiB"


def _ask(name: str, *, flag: str, asked: int | None, box: int, shown: str, minimum: int) -> int:
    if asked is None:
        return box
    if asked > box:
        raise LaunchRefused(
            f"the {name} limit",
            f"{flag} asks for {asked if name != 'memory' else mib(asked)}, more than this box "
            f"allows a sandbox ({shown}): ask for less, or ask the box's admin",
        )
    if asked < minimum:
        raise LaunchRefused(
            f"the {name} limit",
            f"{flag} asks for {asked if name != 'memory' else mib(asked)}, below the least a "
            f"sandbox needs to start ({minimum if name != 'memory' else mib(minimum)})",
        )
    return asked


def requested(
    box: BoxLimits,
    *,
    processes: int | None = None,
    memory_bytes: int | None = None,
    cpu_percent: int | None = None,
    open_files: int | None = None,
) -> Limits:
    """The sandbox's limits: the box's, or less where the launch asked for less."""
    memory_box = box.memory_mb * MIB
    return Limits(
        processes=_ask(
            "process",
            flag="--processes",
            asked=processes,
            box=box.processes,
            shown=str(box.processes),
            minimum=MIN_PROCESSES,
        ),
        memory_bytes=_ask(
            "memory",
            flag="--memory",
            asked=memory_bytes,
            box=memory_box,
            shown=mib(memory_box),
            minimum=MIN_MEMORY_MB * MIB,
        ),
        cpu_percent=_ask(
            "CPU",
            flag="--cpu",
            asked=cpu_percent,
            box=box.cpu_percent,
            shown=f"{box.cpu_percent}%",
            minimum=1,
        ),
        open_files=_ask(
            "open-file",
            flag="--open-files",
            asked=open_files,
            box=box.open_files,
            shown=str(box.open_files),
            minimum=MIN_OPEN_FILES,
        ),
    )


def requested_by_spec(box: BoxLimits, asked: Mapping[str, int]) -> Limits:
    """`requested` for a spec's `[limits]` (and flags): key -> value, as lnk_shared.limit_requests
    reads them."""
    return requested(
        box,
        processes=asked.get("processes"),
        memory_bytes=asked.get("memory"),
        cpu_percent=asked.get("cpu"),
        open_files=asked.get("open_files"),
    )


def admit(box: BoxLimits, running: Iterable[int], wanted: Limits) -> None:
    """Refuse a launch that would put its owner over their count of sandboxes or their sum of
    memory; `running` is the memory limit of each sandbox the owner runs now."""
    memories = list(running)
    if len(memories) >= box.owner_sandboxes:
        raise LaunchRefused(
            "the owner's sandbox limit",
            f"you run {len(memories)} sandboxes, the most this box allows one owner "
            f"({box.owner_sandboxes}): stop one (lnk sandbox list, lnk sandbox stop ID)",
        )
    total = sum(memories) + wanted.memory_bytes
    ceiling = box.owner_memory_mb * MIB
    if total > ceiling:
        raise LaunchRefused(
            "the owner's memory limit",
            f"your sandboxes' memory would come to {mib(total)}, more than this box allows "
            f"one owner ({mib(ceiling)}): stop one, or ask for less with --memory",
        )


def tmpfs_size(configured: int, limits: Limits) -> int:
    """Each tmpfs folder's size: the box's setting, never above the sandbox's memory (its pages
    are charged to the sandbox, so a fuller folder would only meet the memory limit)."""
    return min(configured, limits.memory_bytes)


def describe(limits: Limits) -> str:
    return (
        f"{limits.processes} processes, {mib(limits.memory_bytes)} memory, "
        f"{limits.cpu_percent}% CPU, {limits.open_files} open files"
    )


def outcome_message(limits: Limits, *, oom_kills: int, fork_refusals: int) -> str | None:
    """What the client is told when the sandbox met a limit, or None when it met none."""
    if oom_kills > 0:
        return f"the sandbox reached its memory limit ({mib(limits.memory_bytes)}) and was stopped"
    if fork_refusals > 0:
        return (
            f"the sandbox reached its process limit ({limits.processes}): "
            f"{fork_refusals} new processes were refused"
        )
    return None
