"""`lnk box authorize`: let a key into a box user's account through the SSH gate; list and
revoke such keys (glue to lnk_ssh_gate)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from lnk_shared.errors import EXIT_OK, UsageError

__all__ = ["register"]


def register(commands: Any) -> None:
    auth = commands.add_parser(
        "authorize",
        help="let an SSH key in, its sessions in a sandbox (root); --list, --revoke",
        usage=(
            "lnk box authorize --user U --spec S --folder F --key PUBKEYFILE [--run-dir R]\n"
            "       lnk box authorize --list [--user U] [--json]\n"
            "       lnk box authorize --bind --user U\n"
            "       lnk box authorize --revoke FINGERPRINT [--user U]"
        ),
    )
    auth.add_argument("--user", metavar="U", help="the box user the key logs in as")
    auth.add_argument("--spec", metavar="S", help="the spec every session is judged by")
    auth.add_argument("--folder", metavar="F", help="the one folder its sessions write")
    auth.add_argument("--key", metavar="PUBKEYFILE", help="the public key (one, bare)")
    auth.add_argument("--run-dir", metavar="R", help="the box's run dir (default /run/lnk)")
    auth.add_argument(
        "--keys-dir",
        metavar="DIR",
        default="/etc/ssh/authorized_keys",
        help="the root-owned folder of key files (sshd's AuthorizedKeysFile %%u)",
    )
    auth.add_argument("--list", action="store_true", help="the keys let in, one a line")
    auth.add_argument("--json", action="store_true", help="with --list: a JSON list, for scripts")
    auth.add_argument("--revoke", metavar="FINGERPRINT", help="take a key's lines out")
    auth.add_argument(
        "--bind",
        action="store_true",
        help="bind U's lines written without --account to U's account as it is now",
    )
    auth.set_defaults(handler=cmd_authorize)


def cmd_authorize(args: argparse.Namespace) -> int:
    from lnk_ssh_gate.key_store import KeyStore

    if os.geteuid() != 0:
        raise UsageError("lnk box authorize writes sshd's root-owned key files: run it as root")
    store = KeyStore(Path(args.keys_dir))
    if args.list and args.json:
        import json

        rows = [
            {
                "user": entry.user,
                "fingerprint": entry.line.fingerprint,
                "ours": entry.line.ours,
                "bound": entry.line.bound,
                "command": entry.line.command if entry.line.ours else None,
                "comment": entry.line.comment,
            }
            for entry in store.listing(args.user)
        ]
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    if args.list:
        for entry in store.listing(args.user):
            line = entry.line
            what = line.command if line.ours else "(not written by lnk: no gate)"
            if line.ours and not line.bound:
                what += (
                    f"  (UNBOUND: refused at login; lnk box authorize --bind --user {entry.user})"
                )
            print(f"{entry.user}  {line.fingerprint}  {what}  {line.comment}".rstrip())
        return EXIT_OK
    if args.bind:
        return _bind(store, args.user)
    if args.revoke:
        for user in store.revoke(args.revoke, args.user):
            print(f"revoked {args.revoke} for {user}")
        return EXIT_OK
    missing = [f"--{n}" for n in ("user", "spec", "folder", "key") if not getattr(args, n)]
    if missing:
        raise UsageError(
            f"lnk box authorize needs {', '.join(missing)} (or --list, --revoke, --bind)"
        )
    from lnk_ssh_gate.authorize import authorize

    done = authorize(
        user=args.user,
        spec=args.spec,
        folder=args.folder,
        key_file=args.key,
        run_dir=args.run_dir,
        store=store,
    )
    for change in done.changes:
        print(change)
    state = "authorized" if done.added else "already authorized (nothing changed):"
    print(f"{state} {done.fingerprint} for {args.user} in {done.path}")
    return EXIT_OK


def _bind(store: Any, user: str | None) -> int:
    """`--bind --user U`: U's unbound lines bound to U's account as it is now."""
    import pwd

    from lnk_shared.accounts import home_token, prove_account

    if not user:
        raise UsageError("lnk box authorize --bind needs --user: whose account the lines are")
    try:
        uid = pwd.getpwnam(user).pw_uid
    except KeyError:
        raise UsageError(f"there is no user {user!r} on this machine") from None
    proof = prove_account(uid)
    if proof is None or proof.name != user:
        raise UsageError(f"{user!r} is not the account of uid {uid} on this machine")
    bound = store.bind(user, home_token(uid, proof))
    for fingerprint in bound:
        print(f"bound {fingerprint} to {user}'s account")
    if not bound:
        print(f"{user} has no line without --account: nothing to bind")
    return EXIT_OK
