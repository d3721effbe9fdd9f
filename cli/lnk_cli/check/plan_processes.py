"""The plan's probes of processes and the kernel: a program outside's environment, privilege,
the kernel calls the filter refuses, the limits (threads, open files, the OOM score), running
programs the spec does not grant (directly, through the ELF loader, copied to a writable place,
from a memfd), and last, while the sandbox is held open, what another local user reaches of it."""

from __future__ import annotations

import os

from lnk_cli.check.probe import REFUSED, Evidence, PlanContext, Probe, expect, write_folders
from lnk_shared.oom_scores import SANDBOX_OOM_SCORE_ADJ

__all__ = [
    "LOADERS",
    "UNGRANTED_CANDIDATES",
    "exec_probes",
    "limit_probes",
    "other_user_probes",
    "process_probes",
]

# Programs whose output shows they ran (they print their argument); the first not granted is
# the "exec of an ungranted program" probe. The box's Python is granted for the check itself.
UNGRANTED_CANDIDATES = ("/usr/bin/basename", "/usr/bin/echo", "/usr/bin/printf")
LOADERS = ("/lib64/ld-linux-x86-64.so.2", "/lib/ld-linux-aarch64.so.1")
# The limits probes' counts: a sandbox that starts this many threads (pids count threads) or
# holds this many files open has no limit (`lnk_controller.limits` allows 512 and 1024 by default).
PROBE_THREADS = 2048
PROBE_FILES = 4096
SANDBOX_TMP = "/tmp"  # noqa: S108 - the sandbox's own private, noexec /tmp


def process_probes(c: PlanContext) -> None:
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
    # Another process's descriptors (the relay's hand-offs, for one): a child of its own, which
    # the kernel allows a parent of its uid, so only the filter refuses them.
    for call, what in (
        ("pidfd_getfd", "take a descriptor of a process of its own (pidfd_getfd)"),
        ("kcmp", "compare descriptors with a process of its own (kcmp)"),
    ):
        c.add(
            Probe(
                f"kernel:{call}",
                what,
                REFUSED,
                {"kind": "descriptor", "call": call},
                (Evidence("inside"),),
            )
        )


def limit_probes(c: PlanContext) -> None:
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


def exec_probes(c: PlanContext) -> None:
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
            expect(anything),
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
                expect(anything),
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
                expect(anything),
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
            expect(anything),
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


def other_user_probes(c: PlanContext) -> None:
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
