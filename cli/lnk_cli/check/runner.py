"""`lnk sandbox check`, the run: judge, bait, probe in one sandbox, weigh, clean, report.

Order: judge the spec as the caller sees it (a spec that cannot be read or is refused ends
here, exit 2 or 3, before anything is set up); set up the bait; build the plan; run the probes
in ONE sandbox made by the controller exactly as a run with these flags would make it; read
what the outside saw; ask the controller about the login PATH's folders and race it with a swap
between judging and binding (`login_path.py`, `swap_race.py`: a launch each); remove the bait;
report. Exit 0 when nothing leaked, 1 when anything did
(or the check could not be completed: a sandbox that cannot be built is an error, not a pass).

Design choices (issue 5):
- How the probes get in: the controller runs its own probe program (`lnk_inside.probes`)
  with the box's Python, started like the confiner (`-I -S`, root-owned, readable by every
  sandbox). That Python is granted as a command for this launch only, which adds nothing a
  user could not grant themselves; every other program stays ungranted, so "exec of an
  ungranted program" still means something (it is reported `allowed` only under `[commands]
  allow = ["*"]`). The caller chooses the probe's arguments (the plan), never the program.
- Approval: a check neither asks nor remembers (a "check" launch request: the controller
  skips the question and the remembering). It runs only the box's probes, so checking a spec
  someone sent you never approves it for `lnk sandbox run`; that still asks. This opens
  nothing new: only the owner's own processes reach the launch socket as the owner, and they
  could send a run with `yes` anyway; a sandbox never reaches it.
- Bait and signals: SIGINT, SIGTERM and SIGHUP end the run as an interrupt, in order: the
  sandbox (once it runs) gets SIGTERM and the check waits until the controller says it ended,
  then every bait and everything a probe may have made is removed, with those signals blocked
  so another Ctrl-C cannot cut the removal short. A second Ctrl-C stops waiting (bounded).
- Off this machine only what the spec names is reached: 1.1.1.1 is dialed only where the
  sandbox has no route to it (a UDP connect looks the route up without sending) and asked of
  the proxy by address, which `[internet]` never opens; a listed host gets one CONNECT.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import json
import os
import secrets
import signal
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from lnk_cli.check.bait import Bait, home_of
from lnk_cli.check.caller_env import CallerEnvBait, caller_env_probes, in_environment
from lnk_cli.check.caller_side import AppendBait, caller_probes, gather
from lnk_cli.check.env_refusals import env_refusal_findings
from lnk_cli.check.launch import MAX_OUTPUT, CheckRun, Interrupts, run_probes
from lnk_cli.check.login_path import login_path_findings
from lnk_cli.check.outside_look import look
from lnk_cli.check.path_links import path_link_findings
from lnk_cli.check.plan import LEAKED, Probe, build_plan, folder_state, write_folders
from lnk_cli.check.plan_bodies import body_probes
from lnk_cli.check.plan_caps import cap_probes
from lnk_cli.check.plan_fast_form import fast_form_probes
from lnk_cli.check.plan_hosted import hosted_probes
from lnk_cli.check.plan_hosted_tunnels import hosted_tunnel_probes, look_up_providers
from lnk_cli.check.plan_left import wall_probes
from lnk_cli.check.plan_models import model_probes
from lnk_cli.check.plan_services import service_probes
from lnk_cli.check.plan_ssh import ssh_probes
from lnk_cli.check.report import print_human, print_json
from lnk_cli.check.swap_race import swap_findings
from lnk_cli.check.verdicts import Outside, ProbesFailed, clean_text, judge_all
from lnk_cli.spec_show import grants_from_arguments
from lnk_inside.probes import MARKER_TIME
from lnk_shared.errors import EXIT_OK, StateError
from lnk_shared.paths import BoxPaths

__all__ = ["check"]

EXIT_LEAKED = 1
ENDING_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
WIRE_PAGES = 64  # pages of the wire's log read at most (256 KiB each): far above a check's


@contextlib.contextmanager
def _interrupts(interrupts: Interrupts) -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP go to `interrupts` (see there) for the whole check."""
    old = {n: signal.signal(n, interrupts.signal) for n in ENDING_SIGNALS}
    try:
        yield
    finally:
        for number, handler in old.items():
            signal.signal(number, handler)


@contextlib.contextmanager
def _signals_blocked() -> Iterator[None]:
    old = signal.pthread_sigmask(signal.SIG_BLOCK, ENDING_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _confiner_dir() -> str | None:
    found = importlib.util.find_spec("lnk_controller")
    if found is None or not found.origin:
        return None
    return os.path.join(os.path.dirname(os.path.realpath(found.origin)), "native")


def _wire_seen(sandbox_id: str) -> tuple[frozenset[str], dict[str, int], frozenset[str]]:
    """The targets the proxy allowed for this sandbox, its refusal lines per target, and
    `TARGET RULE: REASON` of each refusal, from its wire log (outside)."""
    from lnk_shared.controller_api import call

    allowed: set[str] = set()
    refusals: dict[str, int] = {}
    refused: set[str] = set()
    offset = 0
    for _ in range(WIRE_PAGES):
        url = f"/v1/sandboxes/{sandbox_id}/wire?offset={offset}"
        doc = call("GET", url)
        if not isinstance(doc, dict):
            raise StateError(f"cannot read the proxy's log of {sandbox_id} (not a document)")
        for raw in doc.get("lines", []):
            with contextlib.suppress(ValueError, TypeError, AttributeError):
                line = json.loads(raw)
                target = str(line.get("target", ""))
                if line.get("decision") == "allowed":
                    allowed |= {_target_key(target), target}  # a service probe's: the URL
                elif line.get("decision") == "refused":
                    refusals[target] = refusals.get(target, 0) + 1
                    refused.add(f"{target} {line.get('rule', '')}: {line.get('reason', '')}")
        if not doc.get("lines"):
            break
        offset = int(doc.get("offset", offset))
    return frozenset(allowed), refusals, frozenset(refused)


def _target_key(target: str) -> str:
    """`host:port` for a CONNECT target or an http:// URL, as the plan names targets."""
    authority = target.removeprefix("http://").split("/", 1)[0]
    if ":" not in authority.rpartition("]")[2]:
        authority += ":80"
    return authority


def _mode_of(path: str) -> dict[str, int]:
    try:
        return {path: os.lstat(path).st_mode}
    except OSError:
        return {}


def _has_acl(path: str) -> bool:
    try:
        names = os.listxattr(path, follow_symlinks=False)
    except OSError:
        return False
    return any(n in ("system.posix_acl_access", "system.posix_acl_default") for n in names)


def _outside(
    probes: Sequence[Probe], bait: Bait, run: CheckRun, proxy: bool, *, appended_kept: bool
) -> Outside:

    exists: dict[str, bool] = {}
    mtimes: dict[str, int] = {}
    confiner: dict[str, Any] = {}
    modes: dict[str, int] = {}
    acls: set[str] = set()
    for probe in probes:
        for e in probe.evidence:
            if e.kind == "created":
                exists[e.path] = os.path.lexists(e.path)
            elif e.kind == "marked":
                with contextlib.suppress(OSError):
                    mtimes[e.path] = os.lstat(e.path).st_mtime_ns
                    if mtimes[e.path] == MARKER_TIME * 1_000_000_000:  # put the time back
                        os.utime(e.path, ns=e.value, follow_symlinks=False)
            elif e.kind == "confiner":
                confiner[e.path] = folder_state(e.path, os.path.join(e.path, "lnk-sandbox"))
            elif e.kind in ("mode", "mode-swept"):
                for path in e.names:
                    modes.update(_mode_of(path))
                    if _has_acl(path):
                        acls.add(path)
    if bait.server is None:
        raise StateError("the bait server is not running: the check is not complete")
    log = bait.server.finish()
    output = (run.stdout + b"\n" + run.stderr).decode("latin-1")
    nothing: frozenset[str] = frozenset()
    wire = _wire_seen(run.sandbox_id) if proxy and run.sandbox_id else (nothing, {}, nothing)
    return Outside(
        exists=exists,
        mtimes=mtimes,
        accepted=tuple(a.line for a in log if a.label != "abstract"),
        abstract_accepts=sum(1 for a in log if a.label == "abstract"),
        wire_allowed=wire[0],
        wire_refusals=wire[1],
        wire_refused=wire[2],
        confiner_after=confiner,
        output=output,
        appended_kept=appended_kept,
        modes=modes,
        acls=frozenset(acls),
    )


def _results(run: CheckRun) -> object:

    lines = bytes(run.stdout).strip().splitlines()
    try:
        doc = json.loads(lines[-1]) if lines else None
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), dict):
        said = bytes(run.stderr).decode("latin-1").strip().splitlines()
        raise ProbesFailed(
            f"the probes did not run to the end in the sandbox (exit {run.status})"
            + (f": {clean_text(said[-1], 300)}" if said else "")
        )
    return doc["results"]


def check(args: argparse.Namespace) -> int:
    grants = grants_from_arguments(args)  # unreadable or refused: exit 2 or 3, nothing set up
    spec = grants.spec
    confiner_dir = _confiner_dir()
    interrupts = Interrupts()
    with _interrupts(interrupts):
        bait = Bait(home=home_of(os.getuid()))
        log = AppendBait()  # the sandbox's stderr, append-only as `2>> log` would be
        try:
            bait.make(avoid_ports=frozenset(spec.ports))
            interrupts.check()
            for folder in bait.skipped:
                print(f"lnk: no bait in {folder}: you cannot write there", file=sys.stderr)
            probes = build_plan(grants, bait, confiner_dir or "")
            caller = gather()
            nonce = secrets.token_hex(4)
            probes += caller_probes(caller, write_folders(grants), bait.home, nonce)
            probes += wall_probes(grants, nonce + secrets.token_hex(2))
            probes += service_probes(grants)
            probes += model_probes(grants)
            probes += caller_env_probes(env_bait := CallerEnvBait.make())
            probes += cap_probes(grants, tried=bool(getattr(args, "caps", False)))
            probes += hosted_probes(grants)
            probes += body_probes(grants)
            probes += fast_form_probes(grants)
            probes += hosted_tunnel_probes(grants, look_up_providers(grants))
            probes += ssh_probes(grants)
            if confiner_dir is None:
                probes = [p for p in probes if p.id != "confiner"]
            for probe in probes:
                bait.leftovers.extend(probe.leftovers)
            plan = json.dumps([p.step for p in probes if p.step is not None])
            looked: dict[str, str | None] = {}
            granted = [p.real for p in (*spec.read, *spec.write)]
            granted += [f.path.real for f in spec.with_fds]
            run_dir = str(BoxPaths.from_env().run_dir)
            with in_environment(env_bait):
                run = run_probes(
                    args,
                    plan,
                    interrupts,
                    lambda sid: looked.update(look(run_dir, sid, granted)),
                    stdin=caller.terminal_fd,
                    stderr=log.fd,
                    env=env_bait.request_env(),
                )
            run.stderr = bytearray(log.written(MAX_OUTPUT))
            interrupts.check()  # the sandbox has ended: now the check ends too
            untrusted_results = _results(run)
            outside = dataclasses.replace(
                _outside(probes, bait, run, spec.has_proxy, appended_kept=log.kept()),
                during=looked,
            )
            findings = judge_all(probes, untrusted_results, outside)
            findings += login_path_findings(args, bait.home, interrupts)
            findings += env_refusal_findings(args, interrupts)
            findings += swap_findings(bait.home, interrupts)
            findings += path_link_findings(bait.home, interrupts)
        finally:
            with _signals_blocked():
                problems = bait.remove()
                log.remove()
            for problem in problems:
                print(f"lnk: could not remove what the check made: {problem}", file=sys.stderr)
    if args.json:
        print_json(
            findings,
            sys.stdout,
            sandbox=run.sandbox_id,
            spec=spec.source,
            limits=run.limits,
            limit_met=run.limit_met,
        )
    else:
        print_human(
            findings,
            sys.stdout,
            spec=spec.source,
            limits=run.limits,
            limit_met=run.limit_met,
            verbose=bool(getattr(args, "verbose", False)),
        )
    sys.stdout.flush()
    if any(f.verdict == LEAKED for f in findings) or problems:
        return EXIT_LEAKED  # a bait left behind fails the check too: the message said where
    return EXIT_OK
