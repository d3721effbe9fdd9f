"""Asking before a new or changed spec runs, and remembering the answer.

A spec is remembered per owner by its real path (or `<flags>` for one made of flags only) with
the hash of its grants. The same grants run without a question; new or changed ones print what
they open (or what changed) and ask `[y/N]` on the terminal. `--yes` answers for the caller;
with no terminal and no `--yes` the run is refused, never approved by default.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Protocol, TextIO

from lnk_shared.errors import NotConfirmedError
from lnk_shared.grants import Grants
from lnk_shared.opens import describe, describe_changes

__all__ = ["FLAGS_ONLY_KEY", "RememberedStore", "confirm_grants", "spec_key"]

FLAGS_ONLY_KEY = "<flags>"


class _Remembered(Protocol):
    grants_hash: str
    grants_json: str


class RememberedStore(Protocol):
    def lookup(self, owner_uid: int, spec_key: str) -> _Remembered | None: ...
    def remember(
        self, owner_uid: int, spec_key: str, grants_hash: str, grants_json: str
    ) -> object: ...


def spec_key(grants: Grants) -> str:
    source = grants.spec.source
    return os.path.realpath(source) if source else FLAGS_ONLY_KEY


def confirm_grants(
    store: RememberedStore,
    owner_uid: int,
    grants: Grants,
    *,
    yes: bool,
    out: TextIO = sys.stderr,
    stdin: TextIO = sys.stdin,
    ask: Callable[[str], str] | None = None,
) -> bool:
    """Return True when the grants were already approved, or are approved now (and remembered).

    Raises NotConfirmedError when the caller declines or cannot be asked.
    """
    key = spec_key(grants)
    digest = grants.digest()
    known = store.lookup(owner_uid, key)
    if known is not None and known.grants_hash == digest:
        return True
    shown = grants.spec.source or "the spec given by flags"
    if known is None:
        print(f"{shown} has not run here before. It opens:", file=out)
        lines = describe(grants)
    else:
        print(f"{shown} opens something else since it was approved:", file=out)
        lines = describe_changes(known.grants_json, grants)
    for line in lines:
        print(line, file=out)
    if not yes:
        if ask is None:
            if not stdin.isatty():
                raise NotConfirmedError(
                    "not approved: there is no terminal to ask on; "
                    "read what it opens (lnk spec show) and pass --yes to approve it"
                )

            def ask(prompt: str) -> str:
                print(prompt, end="", file=out, flush=True)
                return stdin.readline()

        answer = ask("Run it with these grants? [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            raise NotConfirmedError("not approved: nothing was run")
    store.remember(owner_uid, key, digest, grants.canonical_json())
    return False
