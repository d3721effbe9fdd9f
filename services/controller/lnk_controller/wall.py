"""The wall: the bubblewrap command line that makes a sandbox, as a pure function of its layout.

The sandbox starts from an empty root (bwrap's own tmpfs, remounted read-only at the end) and gets
only: read-only system folders (`/usr` and the merged-usr links; under a finite `[commands]` list
`/usr` is a noexec clone with its libraries and the granted programs mounted exec-capable in it, one
bind: `exec_mounts.py`), the short list of `/etc` entries in `ETC_FILES`, the box's own prefix, a
generated `/etc/passwd` and `/etc/group` naming only root, nobody and the sandbox's user, a fresh
`/proc` and a minimal, read-only `/dev` (see below), private noexec `/tmp` and `/dev/shm`, its
private home, an `/etc/hosts` and a boot id of its own (nothing names or identifies the host:
`unsafe_host_identity` puts the host's back), and the granted folders (staged by the controller as
idmapped mounts, read-only or noexec as granted). Protected folders inside a granted folder are
covered by an empty read-only tmpfs; dot entries that tools run outside are bound read-only over
themselves. Every namespace is new (the network shared only for `[network] mode = "host"`), further
user namespaces are disabled, the environment is exactly the one given, and without a terminal the
sandbox gets a new session so it cannot push input into one (TIOCSTI).

`/etc` is mostly copies, not binds: each bind costs bwrap a mount and a full parse of
/proc/self/mountinfo (it remounts submounts with the bind's flags), which grows with the host's
mounts (each live sandbox adds staged ones); 25 binds for /etc cost bwrap about a quarter of its
start. The regular files of `ETC_FILES`, the generated passwd and group, and the confiner's
policy are instead copied by bwrap (`--file FD DEST`, from descriptors the controller opened)
into its root tmpfs, which the final `--remount-ro /` makes read-only. A copy is a snapshot at
launch, as a file bind already pins the file it found: a file the host replaces later is not
seen by a running sandbox either way. Directories (and files too large to copy) stay read-only
binds.

`/dev` is bwrap's own tmpfs (its device nodes, `pts`, the stdio links), remounted read-only
once `/dev/shm` is bound in: nothing can be written there, so no file in it was written by the
sandbox and none can be run, mapped or `LD_PRELOAD`ed (writing to a device node still works: a
read-only mount does not stop it). bwrap cannot make that tmpfs noexec; read-only makes it
moot, as nothing but bwrap's nodes and links is ever in it. `/dev/shm` (noexec, writable) and
`/dev/pts` (devpts, no files to make) are mounts of their own that the remount leaves alone.

Its clocks: lnk-spawn starts it in a time namespace of its own (`--own-clock`), so /proc/uptime
and /proc/stat's btime tell how long the sandbox has run, not when the host booted (a value every
sandbox of one boot shares, as good an id of the host as its boot id; `unsafe_host_clock` puts
the host's back). What that does NOT hide: the CPU counters in /proc/stat and /proc/uptime's idle
time still grow with the host's uptime (not namespaced), and the wall clock is the host's.

What this does NOT do: apply Landlock or seccomp (the confiner does, inside, before the target
runs), create users or mounts (the controller does), or decide what is granted (`refusals`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = [
    "ETC_FILES",
    "MERGED_USR_LINKS",
    "SANDBOX_HOSTNAME",
    "Bind",
    "SandboxLayout",
    "bwrap_argv",
    "sandbox_hosts",
    "sandbox_passwd",
]

SANDBOX_HOSTNAME = "lnk-sandbox"
POLICY_PATH = "/run/lnk-confiner/policy"  # where the confiner finds its policy inside
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"  # the kernel's id of this boot, one per host
ARGV_PATH = "/run/lnk-confiner/argv"  # and the program's argv (lnk_inside/native/lnk_sandbox.c)
# Top-level folders that merged-usr systems make links into /usr; bound as links when they are.
MERGED_USR_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# The /etc files programs need to start, resolve users, find libraries and check TLS; nothing
# with a secret (shadow, ssh keys), nothing of the box's (/etc/lnk), and nothing that names or
# identifies the host (hosts, hostname, machine-id: the sandbox gets its own /etc/hosts).
ETC_FILES = (
    "/etc/alternatives",
    "/etc/bash.bashrc",
    "/etc/ca-certificates",
    "/etc/debian_version",
    "/etc/host.conf",
    "/etc/inputrc",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/locale.alias",
    "/etc/localtime",
    "/etc/mime.types",
    "/etc/nsswitch.conf",
    "/etc/os-release",
    "/etc/profile",
    "/etc/profile.d",
    "/etc/protocols",
    "/etc/python3",
    "/etc/python3.11",
    "/etc/services",
    "/etc/shells",
    "/etc/ssl",
    "/etc/terminfo",
    "/etc/timezone",
)
TMPFS_SIZE = (
    256 * 1024 * 1024
)  # a private /tmp large enough for builds, small enough to not exhaust RAM


@dataclass(frozen=True)
class Bind:
    """A host path (usually a staged mount) shown at `dest` inside the sandbox."""

    source: str
    dest: str
    write: bool = False


@dataclass(frozen=True)
class SandboxLayout:
    """Everything the wall needs, decided and staged before bwrap runs."""

    uid: int
    gid: int
    user_name: str
    home: Bind
    prefix: str
    command: tuple[str, ...]
    cwd: str
    env: Mapping[str, str]
    terminal: bool
    network_host: bool = False
    tmp: Bind | None = None
    shm: Bind | None = None
    binds: tuple[Bind, ...] = ()
    hidden: tuple[str, ...] = ()
    read_only_inside: tuple[Bind, ...] = ()
    system_links: Mapping[str, str] = field(default_factory=dict)
    # Links the box adds to the read-only root (inside path -> target): an agent's `lnk` on
    # its PATH (box_client.py).
    box_links: Mapping[str, str] = field(default_factory=dict)
    system_dirs: tuple[str, ...] = ()
    # A system folder bound from a staged view instead of itself: under a finite list, /usr's
    # noexec clone with the libraries and granted programs exec-capable in it (exec_mounts.py).
    system_sources: Mapping[str, str] = field(default_factory=dict)
    # /etc entries bound read-only (directories, large files), and (descriptor, path) of the
    # ones bwrap copies into its read-only root: opened by the controller, passed to bwrap.
    etc_binds: tuple[str, ...] = ()
    etc_copies: tuple[tuple[int, str], ...] = ()
    passwd_fd: int = -1
    group_fd: int = -1
    policy_fd: int = -1
    status_fd: int = -1
    # The sandbox's own /etc/hosts and boot id (sandbox_hosts, a random UUID), or -1: none.
    hosts_fd: int = -1
    boot_id_fd: int = -1
    unsafe_writable_dev: bool = False  # a test switch: /dev stays writable (check must see it)
    # The program's argv for the confiner (NUL-terminated), copied to ARGV_PATH: off every
    # command line of the chain (spawn.py says why).
    argv_fd: int = -1


def sandbox_passwd(user_name: str, uid: int, gid: int, home: str) -> tuple[str, str]:
    """The sandbox's own /etc/passwd and /etc/group: it sees no host user but itself."""
    passwd = (
        "root:x:0:0:root:/root:/usr/sbin/nologin\n"
        f"{user_name}:x:{uid}:{gid}:lnk sandbox:{home}:/bin/bash\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    )
    group = f"root:x:0:\n{user_name}:x:{gid}:\nnogroup:x:65534:\n"
    return passwd, group


def sandbox_hosts(hostname: str = SANDBOX_HOSTNAME) -> str:
    """The sandbox's own /etc/hosts: loopback and its own name, nothing naming the host."""
    return (
        f"127.0.0.1\tlocalhost\n127.0.1.1\t{hostname}\n::1\tlocalhost ip6-localhost ip6-loopback\n"
    )


def bwrap_argv(layout: SandboxLayout, *, bwrap: str = "/usr/bin/bwrap") -> list[str]:
    """The whole bwrap command line for `layout` (file descriptors must be passed to bwrap)."""
    a: list[str] = [bwrap, "--unshare-all", "--unshare-user"]
    if layout.network_host:
        a.append("--share-net")
    a += ["--die-with-parent", "--disable-userns", "--hostname", SANDBOX_HOSTNAME]
    if not layout.terminal:
        a.append("--new-session")
    a.append("--clearenv")
    for key, value in sorted(layout.env.items()):
        a += ["--setenv", key, value]
    a += ["--uid", str(layout.uid), "--gid", str(layout.gid)]

    for dest, target in sorted(layout.system_links.items()):
        a += ["--symlink", target, dest]
    for dest, target in sorted(layout.box_links.items()):
        a += ["--dir", dest.rsplit("/", 1)[0], "--symlink", target, dest]
    for path in layout.system_dirs:
        a += ["--ro-bind", layout.system_sources.get(path, path), path]
    for path in layout.etc_binds:
        a += ["--ro-bind", path, path]
    # Copies, not mounts (see the module docstring); read-only once `/` is remounted below.
    for fd, path in layout.etc_copies:
        a += ["--perms", "0644", "--file", str(fd), path]
    a += ["--perms", "0644", "--file", str(layout.passwd_fd), "/etc/passwd"]
    a += ["--perms", "0644", "--file", str(layout.group_fd), "/etc/group"]
    if layout.hosts_fd >= 0:
        a += ["--perms", "0644", "--file", str(layout.hosts_fd), "/etc/hosts"]
    a += ["--ro-bind", layout.prefix, layout.prefix]
    a += ["--proc", "/proc", "--dev", "/dev"]
    if layout.boot_id_fd >= 0:  # over the fresh /proc's file: the host's boot id stays unseen
        a += ["--ro-bind-data", str(layout.boot_id_fd), BOOT_ID_PATH]
    for bind, dest in ((layout.tmp, "/tmp"), (layout.shm, "/dev/shm")):
        if bind is not None:
            a += ["--bind", bind.source, dest]
        else:
            a += ["--perms", "1777", "--size", str(TMPFS_SIZE), "--tmpfs", dest]
    if not layout.unsafe_writable_dev:  # read-only /dev: see the module docstring
        a += ["--remount-ro", "/dev"]
    a += ["--bind", layout.home.source, layout.home.dest]

    # Outer folders first, so a grant inside another grant is mounted on top of it.
    for bind in sorted(layout.binds, key=lambda b: (b.dest.count("/"), b.dest)):
        a += ["--bind" if bind.write else "--ro-bind", bind.source, bind.dest]
    for bind in layout.read_only_inside:  # pins (rw over themselves) first, then read-only
        a += ["--bind" if bind.write else "--ro-bind", bind.source, bind.dest]
    for path in layout.hidden:
        a += ["--perms", "0000", "--tmpfs", path, "--remount-ro", path]

    a += ["--perms", "0444", "--file", str(layout.policy_fd), POLICY_PATH]
    if layout.argv_fd >= 0:
        a += ["--perms", "0444", "--file", str(layout.argv_fd), ARGV_PATH]
    if layout.status_fd >= 0:
        a += ["--json-status-fd", str(layout.status_fd)]
    a += ["--remount-ro", "/", "--chdir", layout.cwd]
    a += ["--", *layout.command]
    return a
