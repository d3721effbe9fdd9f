"""What `lnk sandbox check` tries, and what each try should come to under the spec's grants.

`build_plan` turns the judged grants (as the caller sees them, `lnk spec show`'s view) and the
bait set up outside into a list of `Probe`s. Each probe has the step the sandbox runs
(`lnk_inside/probes.py`; paths, ports and nonces only, never a secret), what a person reads as
"tried", the expected verdict and the outside evidence `verdicts.py` weighs with the sandbox's
answer.

Expected: `allowed` when a grant opens it, `known gap` for what the wall documents it does not
stop (a `[localhost]` port's server, dot entries below the top of a written folder),
`refused` for everything else (the ELF loader running an ungranted program included).

Off this machine, only hosts the spec names are reached: each listed `[internet]` or `[lan]`
host gets one CONNECT through the proxy, closed at once. 1.1.1.1 directly is a route lookup
(a UDP connect, no packet), dialed only when there is no route, so it fails before a packet;
through the proxy it is asked for by address, which `[internet]` never opens. A probe a grant
would let leave the machine without naming a host (`*`, a wildcard, a `[lan]` range) is not
tried: it is reported `allowed` with "not tried".
"""

from __future__ import annotations

import ipaddress
import os
import secrets
from dataclasses import dataclass, field
from typing import Any

from lnk_cli.check.bait import PREFIX, Bait
from lnk_shared.grants import Grants
from lnk_shared.oom_scores import SANDBOX_OOM_SCORE_ADJ
from lnk_shared.paths import PROJECT_RUN_DOT_ENTRIES
from lnk_shared.refusals import inside

__all__ = [
    "ALLOWED",
    "INTERNET_PROBE",
    "KNOWN_GAP",
    "LEAKED",
    "LOADERS",
    "REFUSED",
    "UNGRANTED_CANDIDATES",
    "Evidence",
    "Probe",
    "build_plan",
    "folder_state",
    "read_folders",
    "write_folders",
]

REFUSED, ALLOWED, KNOWN_GAP, LEAKED = "refused", "allowed", "known gap", "leaked"
INTERNET_PROBE = "1.1.1.1"  # the seed's "http://1.1.1.1": never dialed off this machine
HTTP_PORT = 80
HTTPS_PORT = 443
MAX_NETWORKS = 4  # of this machine's networks, how many get a neighbour asked for
# Programs whose output shows they ran (they print their argument); the first not granted is
# the "exec of an ungranted program" probe. The box's Python is granted for the check itself.
UNGRANTED_CANDIDATES = ("/usr/bin/basename", "/usr/bin/echo", "/usr/bin/printf")
LOADERS = ("/lib64/ld-linux-x86-64.so.2", "/lib/ld-linux-aarch64.so.1")
HOME_RC_FILES = (".bashrc", ".profile", ".bash_profile", ".zshrc", ".bash_login")
# Dot entries that are folders when they exist (as the wall makes their stand-ins): a missing
# one is made as a folder holding a new file, like a hook would be.
DOT_FOLDERS = frozenset(
    {"hooks", ".direnv", ".github", ".husky", ".idea", ".devcontainer", ".vscode"}
)
# The limits probes' counts: a sandbox that starts this many threads (pids count threads) or
# holds this many files open has no limit (`lnk_controller.limits` allows 512 and 1024 by default).
PROBE_THREADS = 2048
PROBE_FILES = 4096
SANDBOX_TMP = "/tmp"  # noqa: S108 - the sandbox's own private, noexec /tmp


@dataclass(frozen=True)
class Evidence:
    """What the outside checks for one probe. `kind` says which fact:

    secret     the bait's secret appears in what the sandbox sent back (`value`)
    names      the sandbox's listing holds a name the real folder holds (`names`)
    created    `path` exists after the run (it did not before)
    marked     `path`'s mtime is the probe's mark (`value` = the mtime before, to restore)
    server     the bait server accepted a connection carrying the probe's id (or none)
    wire       the proxy's wire log holds an allowed decision for `value` (a target)
    wire-refusals  the wire log holds more refusal lines for `value` than `names[0]`
    wire-said  no refusal in the wire log for `value[0]` (a target) says `value[1]`: the
               request was not judged as it must be (a hosted model's body, `plan_hosted`)
    cost       the times the sandbox measured (`data`: a deep body's and a flat one's) differ by
               more than the ratio `value` (`plan_bodies`' nesting probe)
    abstract   the abstract socket accepted a connection
    confiner   the confiner's folder changed (`value` = its state before)
    privilege  the status the probe read shows privilege, or the owner's uid (`value`)
    identity   the object the sandbox finds at `path` is not the one judged (`value`: device,
               inode and type as discovery recorded them)
    staging    the check, as a user other than the sandbox's, reached its staging folder
    cmdline    a command line of the sandbox's chain (lnk-spawn, bwrap, the confiner) showed
               a staging path or a granted folder to every local user
    clock      the boot time the sandbox read is this machine's (`value`, within CLOCK_SLACK)
    listing    the model listing the sandbox got at `path` names a model the rule (`value`)
               does not allow (`plan_models.not_allowed`)
    inside     nothing outside can see it: the sandbox's answer only
    """

    kind: str
    value: Any = None
    path: str = ""
    names: tuple[str, ...] = ()


@dataclass(frozen=True)
class Probe:
    id: str
    tried: str
    expected: str
    step: dict[str, Any] | None  # None: not tried (see `not_tried`)
    evidence: tuple[Evidence, ...] = ()
    not_tried: str = ""  # why it was not tried
    leftovers: tuple[str, ...] = ()  # paths the step may make, removed after the run


@dataclass
class _Context:
    grants: Grants
    bait: Bait
    nonce: str
    readable: list[str] = field(default_factory=list)
    hidden: list[str] = field(default_factory=list)
    probes: list[Probe] = field(default_factory=list)

    def add(self, probe: Probe) -> None:
        step = probe.step
        if step is not None:
            step = {"id": probe.id, **step}
        self.probes.append(
            Probe(
                probe.id,
                probe.tried,
                probe.expected,
                step,
                probe.evidence,
                probe.not_tried,
                probe.leftovers,
            )
        )

    def visible(self, path: str) -> bool:
        real = os.path.realpath(path)
        return any(inside(real, r) for r in self.readable) and not any(
            inside(real, h) for h in self.hidden
        )

    def name(self) -> str:
        return f"{PREFIX}{self.nonce}-{secrets.token_hex(3)}"


def write_folders(grants: Grants) -> list[str]:
    """Every folder the sandbox may write: the spec's, and those passed with `--with-fd`
    (bound where they really are)."""
    spec = grants.spec
    folders = {w.real for w in spec.write if w.is_dir}
    folders |= {f.path.real for f in spec.with_fds if f.write and f.path.is_dir}
    return sorted(folders)


def read_folders(grants: Grants) -> list[str]:
    """Every folder granted for reading only (the spec's, and `--with-fd N:read`)."""
    spec = grants.spec
    folders = {r.real for r in spec.read if r.is_dir}
    folders |= {f.path.real for f in spec.with_fds if not f.write and f.path.is_dir}
    return sorted(folders)


def _expect(granted: bool) -> str:
    return ALLOWED if granted else REFUSED


# -- files ------------------------------------------------------------------------------------


def _files(c: _Context) -> None:
    home = c.bait.home
    for bait in c.bait.files:
        shown = bait.path.replace(home, "~", 1) if bait.path.startswith(home + "/") else bait.path
        c.add(
            Probe(
                bait.id,
                f"read {shown}",
                _expect(c.visible(bait.path)),
                {"kind": "read", "path": bait.path},
                (Evidence("secret", bait.secret),),
            )
        )
    c.add(
        Probe(
            "list.ssh",
            "list ~/.ssh",
            _expect(c.visible(c.bait.ssh_dir)),
            {"kind": "list", "path": c.bait.ssh_dir},
            (Evidence("names", names=tuple(c.bait.ssh_names)),),
        )
    )


def _write_or_create(c: _Context, ident: str, tried: str, path: str, expected: str) -> None:
    """Open an existing file for writing (its mtime marked), or create what is missing (with
    each missing folder on the way): both are seen outside."""
    if os.path.lexists(path) and not os.path.isdir(path):
        info = os.lstat(path)
        c.add(
            Probe(
                ident,
                tried,
                expected,
                {"kind": "open_write", "path": path},
                (Evidence("marked", (info.st_atime_ns, info.st_mtime_ns), path=path),),
            )
        )
        return
    folder = os.path.isdir(path) or (
        not os.path.lexists(path) and os.path.basename(path) in DOT_FOLDERS
    )
    target = os.path.join(path, c.name()) if folder else path
    missing: list[str] = []
    walk = os.path.dirname(target)
    while not os.path.lexists(walk):
        missing.append(walk)
        walk = os.path.dirname(walk)
    outermost = missing[-1] if missing else target
    c.add(
        Probe(
            ident,
            tried,
            expected,
            {"kind": "create", "path": target, "dirs": list(reversed(missing)), "content": c.nonce},
            (Evidence("created", path=outermost),),
            leftovers=(outermost,),
        )
    )


def _placeholders(c: _Context) -> None:
    """Before anything is written: the names the box reserves at the top of each write folder
    must not show to git (a file or a link is listed and committed; an empty folder is not)."""
    top = sorted({entry.split("/")[0] for entry in PROJECT_RUN_DOT_ENTRIES})
    for folder in write_folders(c.grants):
        missing = [n for n in top if not os.path.lexists(os.path.join(folder, n))]
        c.add(
            Probe(
                f"placeholder.git:{folder}",
                f"see the box's placeholders in {folder} as git does (git status, git add -A)",
                REFUSED,
                {"kind": "git_visible", "path": folder, "names": missing},
                (Evidence("inside"),),
            )
        )


def _other_users(c: _Context) -> None:
    """Last, while the sandbox is held open: what another local user reaches of it."""
    c.add(
        Probe(
            "staging.other-users",
            "reach the sandbox's staging folder (its granted folders) as another user",
            REFUSED,
            {"kind": "hold"},
            (Evidence("staging"),),
        )
    )
    c.add(
        Probe(
            "cmdline.other-users",
            "read staging paths or granted folders in the sandbox's command lines as another user",
            REFUSED,
            {"kind": "hold"},
            (Evidence("cmdline"),),
        )
    )


def _writes(c: _Context) -> None:
    home = c.bait.home
    _write_or_create(
        c, "write.home", "write a new file in ~", os.path.join(home, c.name()), REFUSED
    )
    for rc in HOME_RC_FILES:
        _write_or_create(c, f"write.home:~/{rc}", f"write ~/{rc}", os.path.join(home, rc), REFUSED)
    for folder in write_folders(c.grants):
        _write_or_create(
            c, f"write.folder:{folder}", f"write a new file in {folder}", folder, ALLOWED
        )
        for entry in PROJECT_RUN_DOT_ENTRIES:
            path = os.path.join(folder, entry)
            _write_or_create(c, f"write.dot:{path}", f"write {path}", path, REFUSED)
        deep = os.path.join(folder, c.name(), ".envrc")
        tried = f"write a .envrc below the top of {folder}"
        _write_or_create(c, f"write.deep-dot:{folder}", tried, deep, KNOWN_GAP)
    writable = write_folders(c.grants)
    for folder in read_folders(c.grants):  # granted for reading only: a write must fail
        if folder == home or any(inside(folder, w) for w in writable):
            continue  # the home is probed above; inside a write grant, writing is granted
        ident, tried = f"write.read-folder:{folder}", f"write a new file in {folder} (read only)"
        _write_or_create(c, ident, tried, folder, REFUSED)


def _confiner(c: _Context, confiner_dir: str) -> None:
    file = os.path.join(confiner_dir, "lnk-sandbox")
    c.add(
        Probe(
            "confiner",
            f"write into {confiner_dir} or beside it",
            REFUSED,
            {"kind": "confiner", "dir": confiner_dir, "file": file, "name": c.name()},
            (Evidence("confiner", folder_state(confiner_dir, file), path=confiner_dir),),
        )
    )


def folder_state(folder: str, file: str) -> list[object]:
    """What replacing the folder or writing the confiner would change outside: the folder's
    and its parent's identity, the confiner's identity, time and size. (Not the folders'
    times: installing anything into the box changes those.)"""
    state: list[object] = []
    for path, whole in ((folder, False), (file, True), (os.path.dirname(folder), False)):
        try:
            info = os.lstat(path)
        except OSError as exc:
            state.append(exc.strerror)
            continue
        ident = [info.st_dev, info.st_ino]
        state.append([*ident, info.st_mtime_ns, info.st_size] if whole else ident)
    return state


# -- network ----------------------------------------------------------------------------------


def _server(c: _Context) -> None:
    server = c.bait.server
    assert server is not None
    port = server.port
    tries = [("127.0.0.1", "127.0.0.1")]
    if any(lis.host == "::1" for lis in server.listeners):
        tries.append(("::1", "::1"))
    tries.append(("::ffff:127.0.0.1", "::ffff:127.0.0.1"))
    for lis in server.listeners:
        if lis.host not in ("127.0.0.1", "::1"):
            tries.append(("machine", lis.host))
    for label, host in tries:
        c.add(
            Probe(
                f"server:{label}",
                f"connect to the bait server at {host} port {port}",
                REFUSED,
                {"kind": "tcp", "host": host, "port": port},
                (Evidence("server"),),
            )
        )
    c.add(
        Probe(
            "abstract-socket",
            "connect to an abstract unix socket outside",
            REFUSED,
            {"kind": "abstract", "name": server.abstract_name},
            (Evidence("abstract"),),
        )
    )


def _machine_forms(address: str | None, port: int) -> list[str]:
    """This machine as a proxy target: loopback in every spelling, IPv4 in IPv6's forms."""
    forms = [
        "127.0.0.1",
        "localhost",
        "[::1]",
        "0.0.0.0",  # noqa: S104 - a target name, nothing binds it
        "[::ffff:127.0.0.1]",
        "[::ffff:7f00:1]",
        "[::127.0.0.1]",
        "[64:ff9b::7f00:1]",
        "[2002:7f00:1::]",
        "2130706433",
        "0x7f000001",
        "127.1",
        "0177.0.0.1",
    ]
    if address:
        forms += [address, f"[::ffff:{address}]"]
    return [f"{f}:{port}" for f in forms]


def _lan_covers(grants: Grants, address: ipaddress.IPv4Address) -> bool:
    spec = grants.spec
    return spec.lan_any or any(
        e.network is not None and e.network.version == 4 and address in e.network for e in spec.lan
    )


def _neighbours(c: _Context) -> list[str]:
    found = []
    for iface in c.bait.machine:
        net = iface.network
        if net.num_addresses < 4 or iface.ip.is_loopback:
            continue
        other = net.network_address + 1
        if other == iface.ip:
            other += 1
        found.append(str(other))
    return found[:MAX_NETWORKS]


def _network(c: _Context) -> None:
    spec = c.grants.spec
    c.add(
        Probe(
            "internet:direct",
            f"reach http://{INTERNET_PROBE} directly (a route to it)",
            _expect(spec.network_host),
            {"kind": "route", "host": INTERNET_PROBE, "port": HTTP_PORT},
            (Evidence("inside"),),
        )
    )
    server = c.bait.server
    assert server is not None
    if spec.has_proxy:
        _proxy(c, server.port)
    for port in spec.ports:
        c.add(
            Probe(
                f"port:{port}",
                f"reach this machine's port {port} ([localhost] ports)",
                KNOWN_GAP,
                {"kind": "tcp", "host": "127.0.0.1", "port": port},
                (Evidence("inside"),),
            )
        )


def _ask(c: _Context, ident: str, target: str, why: str, *, expected: str = REFUSED) -> None:
    """Ask the proxy for `target` (CONNECT host:port, or GET when `ident` says get)."""
    method = "GET" if ":get-" in ident else "CONNECT"
    shown = f"GET http://{target}/" if method == "GET" else f"CONNECT {target}"
    evidence = (Evidence("wire", target), Evidence("server"))
    step = {"kind": "proxy", "method": method, "target": target}
    c.add(Probe(ident, f"{shown} through the proxy ({why})", expected, step, evidence))


def _not_tried(c: _Context, ident: str, tried: str, why: str) -> None:
    c.add(Probe(ident, tried, ALLOWED, None, not_tried=why))


def _proxy(c: _Context, bait_port: int) -> None:
    spec = c.grants.spec
    direct = f"{INTERNET_PROBE}:{HTTP_PORT}"
    _ask(c, "proxy:tunnel-1.1.1.1", direct, "the internet by address")
    _ask(c, "proxy:get-1.1.1.1", direct, "the internet by address")
    mapped = f"[::ffff:{INTERNET_PROBE}]:{HTTP_PORT}"
    _ask(c, "proxy:mapped-1.1.1.1", mapped, "IPv4 written as IPv6")
    machine = str(c.bait.machine[0].ip) if c.bait.machine else None
    for target in _machine_forms(machine, bait_port):
        _ask(c, f"proxy:machine:{target}", target, "this machine, the bait server's port")
    for address in c.bait.local_routed:  # refused even when [lan] lists it: it is here
        target = f"[{address}]:{bait_port}" if ":" in address else f"{address}:{bait_port}"
        _ask(c, f"proxy:local-route:{target}", target, "an address the kernel routes here")
    for neighbour in _neighbours(c):
        target = f"{neighbour}:{HTTP_PORT}"
        ident = f"proxy:network:{target}"
        if _lan_covers(c.grants, ipaddress.IPv4Address(neighbour)):
            _not_tried(c, ident, f"CONNECT {target}", "[lan] lists it")
        else:
            _ask(c, ident, target, "this machine's network")
    unlisted = f"{PREFIX}{c.nonce}.invalid:{HTTPS_PORT}"
    if spec.internet_any:
        _not_tried(c, "proxy:unlisted", f"CONNECT {unlisted}", "[internet] * lists every host")
    else:
        _ask(c, "proxy:unlisted", unlisted, "a host not listed")
    for host in spec.internet:
        ident = f"internet-host:{host}"
        if host.wildcard:
            _not_tried(c, ident, f"CONNECT {host}", "a wildcard names no one host")
            continue
        target = f"{host.name}:{host.port or HTTPS_PORT}"
        _ask(c, ident, target, "[internet] lists it", expected=ALLOWED)
    for entry in spec.lan:
        ident = f"lan-host:{entry}"
        if entry.network is not None and entry.network.num_addresses > 1:
            _not_tried(c, ident, f"reach {entry}", "a range names no one host")
            continue
        shown = str(entry)
        target = f"[{shown}]:{HTTP_PORT}" if ":" in shown else f"{shown}:{HTTP_PORT}"
        _ask(c, ident, target, "[lan] lists it", expected=ALLOWED)


# -- processes and the kernel -----------------------------------------------------------------


def _identities(c: _Context) -> None:
    """Each granted folder or file: what the sandbox finds bound there must be the very object
    judged (device, inode, type), not whatever a swap after judging put at its path."""
    spec = c.grants.spec
    granted = [(p, "read") for p in spec.read] + [(p, "write") for p in spec.write]
    granted += [(f.path, f"--with-fd {f.fd}") for f in spec.with_fds]
    seen: set[str] = set()
    for n, (path, how) in enumerate(granted):
        if path.identity is None or path.real in seen:
            continue
        seen.add(path.real)
        judged = [path.identity.dev, path.identity.ino, path.identity.kind]
        c.add(
            Probe(
                f"identity-{n}",
                f"find another object than the one judged bound at {path.real} ({how})",
                REFUSED,
                {"kind": "identity", "path": path.real},
                (Evidence("identity", judged, path.real),),
            )
        )


def _processes(c: _Context) -> None:
    outside = c.bait.outside
    assert outside is not None
    c.add(
        Probe(
            "environ",
            f"read the environment of a program outside (pid {outside.pid}; /proc, ps e)",
            REFUSED,
            {"kind": "environ", "pid": outside.pid},
            (Evidence("secret", c.bait.outside_secret),),
        )
    )
    c.add(
        Probe(
            "privilege",
            "hold a capability, lack no_new_privs or seccomp, or be the owner's uid",
            REFUSED,
            {"kind": "privilege"},
            (Evidence("privilege", os.getuid()),),
        )
    )
    for call, what in (
        ("unshare_user", "make a user namespace"),
        ("unshare_mount", "make a mount namespace"),
        ("mount", "mount a tmpfs on /tmp"),
        ("keyctl", "make a kernel keyring"),
        ("bpf", "load a BPF program"),
        ("perf_event_open", "open a perf event"),
        ("userfaultfd", "open a userfaultfd"),
        ("ptrace", "trace a process (its own child)"),
        ("io_uring_setup", "set up an io_uring"),
    ):
        c.add(
            Probe(
                f"kernel:{call}",
                what,
                REFUSED,
                {"kind": "kernel", "call": call},
                (Evidence("inside"),),
            )
        )


def _limits(c: _Context) -> None:
    """A fork bomb's and a descriptor hog's first steps: past these counts a sandbox has no
    limit a shared box can live with (the box's defaults are 512 and 1024); and a sandbox that
    makes itself look smaller than the box's services to the host's OOM killer."""
    for what, count, tried in (
        ("processes", PROBE_THREADS, f"start {PROBE_THREADS} threads (a fork bomb's first steps)"),
        ("open_files", PROBE_FILES, f"raise its open-file limit and open {PROBE_FILES} files"),
        (
            "oom_score",
            SANDBOX_OOM_SCORE_ADJ,
            "stand below the box's services for the host's OOM killer (OOM score adjustment "
            f"under {SANDBOX_OOM_SCORE_ADJ}, or lowered)",
        ),
    ):
        c.add(
            Probe(
                f"limits:{what}",
                tried,
                REFUSED,
                {"kind": "limits", "what": what, "count": count},
                (Evidence("inside"),),
            )
        )


def _exec(c: _Context) -> None:
    spec = c.grants.spec
    granted = {p.real for p in spec.commands}
    anything = spec.commands_any
    marker = f"ran-{c.nonce}"
    program = next(
        (
            p
            for p in UNGRANTED_CANDIDATES
            if os.path.realpath(p) not in granted and os.path.exists(p)
        ),
        None,
    )
    if program is None:
        return
    inside = (Evidence("inside"),)
    c.add(
        Probe(
            "exec:ungranted",
            f"run {program}, not granted",
            _expect(anything),
            {"kind": "exec", "argv": [program, marker], "marker": marker},
            inside,
        )
    )
    loader = next((p for p in LOADERS if os.path.exists(p)), None)
    if loader is not None:
        c.add(
            Probe(
                "exec:loader",
                f"run {program} through {loader}",
                _expect(anything),
                {"kind": "exec", "argv": [loader, program, marker], "marker": marker},
                inside,
            )
        )
    # A copy where the sandbox may write: its /tmp, and the spec's first write folder (both
    # noexec; the folder's copy lands outside, so it is removed after the run).
    places = [("exec:tmp-copy", SANDBOX_TMP)]
    places += [(f"exec:write-copy:{w}", w) for w in write_folders(c.grants)]
    for ident, folder in places[:2]:
        copy = os.path.join(folder, c.name())
        c.add(
            Probe(
                ident,
                f"run a copy of {program} written to {folder}",
                _expect(anything),
                {
                    "kind": "exec",
                    "argv": [copy, marker],
                    "marker": marker,
                    "copy_from": program,
                    "copy_to": copy,
                },
                inside,
                leftovers=() if folder == SANDBOX_TMP else (copy,),
            )
        )
    c.add(
        Probe(
            "exec:memfd",
            f"run a copy of {program} from a memfd",
            _expect(anything),
            {
                "kind": "exec",
                "argv": ["memfd", marker],
                "marker": marker,
                "copy_from": program,
                "memfd": True,
            },
            inside,
        )
    )


def build_plan(grants: Grants, bait: Bait, confiner_dir: str) -> list[Probe]:
    """Every probe for this spec and this bait, in the order they run and are reported."""
    spec = grants.spec
    c = _Context(grants, bait, secrets.token_hex(6))
    c.readable = [p.real for p in (*spec.read, *spec.write)]
    c.readable += [f.path.real for f in spec.with_fds]
    c.hidden = list(grants.hidden)
    _placeholders(c)
    _files(c)
    _writes(c)
    _identities(c)
    _confiner(c, confiner_dir)
    _server(c)
    _network(c)
    _processes(c)
    _limits(c)
    _exec(c)
    _other_users(c)
    return c.probes
