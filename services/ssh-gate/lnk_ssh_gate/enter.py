"""`lnk sandbox enter --spec S --folder F [--run-dir R] [--account A] [--check]`: a key's forced
command.

It runs as the box user sshd logged in, with what the key's holder chose limited to
`SSH_ORIGINAL_COMMAND`, the terminal and a few locale names. At each session: the spec is read
and judged afresh (a changed spec takes effect at the next session, with no question asked:
the box's root chose it when writing the key's line), the sandbox writes only `F`, and the
session runs in it through the controller's launch socket. Everything that fails stops the
session before anything runs, with a message on stderr and a non-zero exit.

`--account` (which `lnk box authorize` writes) names the account the key was let in for: the
session runs only for the same uid and the same home folder (device, inode, generation;
`lnk_shared.accounts`). A user deleted and made again with the same name, even with the same
uid, is another account, and the old key's holder does not get in as it. A line without
`--account` (written before lines were bound) is refused at every session, naming what root
does about it: `lnk box authorize --list` marks such lines, `--bind --user U` binds them to U's
account as it is now.

The spec must be root's, with every folder above it (so the key's holder cannot rewrite
what it opens). Which box: `--run-dir` on the key's line, else `/run/lnk`. The environment
is never read for it (LNK_RUN_DIR could come from the client through a lax AcceptEnv), and
the folder must be root's all the way up, so the launch socket found there is the
controller's.

What this does NOT do: enforce anything by itself. The wall (bwrap, Landlock, seccomp, the
fresh user) is the controller's; the checks here make a session fail early and clearly.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from lnk_shared.accounts import AccountProof, judge_account, parse_home_token, prove_account
from lnk_shared.discovery import JudgeContext, context_for, resolve_spec
from lnk_shared.errors import CommandRefused, RefusedError
from lnk_shared.grants import Grants, ResolvedSpec
from lnk_shared.opens import describe
from lnk_shared.paths import DEFAULT_RUN_DIR, BoxPaths
from lnk_shared.refusals import judge
from lnk_shared.spec_flags import FLAG_NAMES, spec_from_arguments
from lnk_ssh_gate.gate_paths import check_line_path, check_root_owned_path
from lnk_ssh_gate.session import BASH, SessionCommand, session_command, session_env

__all__ = [
    "EnterPlan",
    "KeyAccountRefused",
    "SessionWriteRefused",
    "check_account",
    "check_text",
    "plan_session",
]

SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"  # how the spec's program names are found


class SessionWriteRefused(RefusedError):
    rule = "session-writes"


class KeyAccountRefused(RefusedError):
    rule = "key-account"


def check_account(token: str, uid: int) -> None:
    """Refuse unless `token` (the key line's `--account`) is the account of `uid` as it is now."""
    try:
        token_uid, dev, ino, generation = parse_home_token(token)
    except ValueError as exc:
        raise KeyAccountRefused("--account", str(exc)) from None
    now = prove_account(uid)
    same = (
        now is not None
        and token_uid == uid
        and judge_account(AccountProof(now.name, now.home, dev, ino, generation), now) == "same"
    )
    if not same:
        raise KeyAccountRefused(
            "this key",
            "it was let in for another account of this name (another uid or another home "
            "folder): the account was deleted and made again since; ask root to authorize "
            "the key again (lnk box authorize) if it is this account's",
        )


@dataclass(frozen=True)
class EnterPlan:
    """What a session will run, where, with what: everything `lnk_cli` needs to launch it."""

    args: argparse.Namespace  # the spec's arguments as `lnk sandbox run` takes them
    command: SessionCommand
    run_dir: Path
    folder: str
    env: dict[str, str]  # the whole environment the launch client runs with
    grants: Grants


def _arguments(spec: str, folder: str) -> argparse.Namespace:
    values: dict[str, object] = {name: [] for name in FLAG_NAMES}
    values.update(spec=spec, network_mode=None, write=[folder], yes=True)
    return argparse.Namespace(**values)


def _judge(args: argparse.Namespace, folder: str, run_dir: Path) -> tuple[ResolvedSpec, Grants]:
    spec = spec_from_arguments(args, cwd=folder)
    box = BoxPaths.from_env({"LNK_RUN_DIR": str(run_dir)})
    ctx: JudgeContext = context_for(
        os.getuid(), env={"PATH": SANDBOX_PATH}, box=box, spec_file=spec.source, cloud=None
    )
    resolved = resolve_spec(spec, ctx, path_env=SANDBOX_PATH)
    return resolved, judge(resolved, ctx)


def _check_gate_rules(resolved: ResolvedSpec, folder: str) -> None:
    """The gate's own rules on top of every spec's: F is the one place a session writes, and
    every session runs in /bin/bash, so the spec must let it run."""
    real_folder = os.path.realpath(folder)
    for path in resolved.write:
        if path.real != real_folder:
            raise SessionWriteRefused(
                f"write {path.written}",
                f"through the gate a session writes only its folder {folder}; "
                "take the write out of the spec",
            )
    if resolved.with_fds:
        raise SessionWriteRefused("with-fd", "a session over SSH is passed no folder")
    bash = os.path.realpath(BASH)
    if not resolved.commands_any and bash not in {c.real for c in resolved.commands}:
        raise CommandRefused(
            BASH,
            "every SSH session runs in /bin/bash, and the spec's [commands] does not let it "
            'run: add "/bin/bash" to [commands] allow',
        )


def plan_session(
    *,
    spec: str,
    folder: str,
    run_dir: str | None,
    untrusted_environ: Mapping[str, str],
    account: str | None = None,
) -> EnterPlan:
    """Check the key line's arguments, map the session's request, judge the spec as this user;
    raise before anything runs when any of it is refused."""
    check_line_path(spec, "the spec")
    check_line_path(folder, "the folder")
    if account is None:
        raise KeyAccountRefused(
            "this key",
            "its line was written before keys were bound to their account (no --account), so "
            "a user given this uid or name later would get in with it; ask root to bind it "
            "(lnk box authorize --bind --user NAME) or to authorize the key again",
        )
    check_account(account, os.getuid())
    box_run = Path(check_line_path(run_dir, "the box's run dir") if run_dir else DEFAULT_RUN_DIR)
    check_root_owned_path(box_run, "the box's run dir")
    # Root names the spec on the key's line; whoever could rewrite the file would choose
    # what every session opens, so it must be root's, and so every folder above it.
    check_root_owned_path(Path(spec), "the spec")
    command = session_command(untrusted_environ.get("SSH_ORIGINAL_COMMAND"))
    args = _arguments(spec, folder)
    resolved, grants = _judge(args, folder, box_run)
    _check_gate_rules(resolved, folder)
    env = {
        **session_env(untrusted_environ),
        "PATH": SANDBOX_PATH,
        "LNK_RUN_DIR": str(box_run),
    }
    return EnterPlan(args, command, box_run, folder, env, grants)


def check_text(plan: EnterPlan) -> list[str]:
    """What `--check` prints: the sandbox's grants and what each kind of session runs."""
    return [
        f"spec: {plan.args.spec}",
        f"box: {plan.run_dir}",
        f"a session writes only: {plan.folder}",
        "a session runs: /bin/bash -l (no command), /bin/bash -c COMMAND, "
        "/usr/lib/openssh/sftp-server (sftp)",
        "opens:",
        *describe(plan.grants),
        f"hash: {plan.grants.digest()}",
    ]
