"""`lnk spec show`: what a spec opens on this machine, as the calling user sees it."""

from __future__ import annotations

import argparse
import json
import os
import sys

from lnk_shared.discovery import DETECT, JudgeContext, context_for, resolve_spec
from lnk_shared.display import shown, shown_lines
from lnk_shared.errors import EXIT_OK
from lnk_shared.grants import Grants, ResolvedSpec
from lnk_shared.opens import box_grant_lines, describe, grants_document
from lnk_shared.paths import BoxPaths
from lnk_shared.refusals import find_refusals, judge
from lnk_shared.spec_flags import spec_from_arguments

__all__ = ["grants_from_arguments", "show"]


def _resolve(args: argparse.Namespace) -> tuple[ResolvedSpec, JudgeContext]:
    spec = spec_from_arguments(args, environ=os.environ)  # `--env NAME`: the caller's value
    ctx = context_for(
        os.getuid(), env=os.environ, box=BoxPaths.from_env(), spec_file=spec.source, cloud=DETECT
    )
    return resolve_spec(spec, ctx, path_env=os.environ.get("PATH", "")), ctx


def grants_from_arguments(args: argparse.Namespace) -> Grants:
    """Read, resolve and judge the spec the arguments give, as the calling user."""
    return judge(*_resolve(args))


def _box_programs() -> list[str]:
    """What the box grants an agent's sandbox besides its spec: this install's `lnk` client
    (lnk_controller/box_client.py), by its real path."""
    return [os.path.realpath(os.path.join(sys.prefix, "bin", "lnk"))]


def show(args: argparse.Namespace) -> int:
    resolved, ctx = _resolve(args)
    refusals = find_refusals(resolved, ctx)
    if refusals:
        for refusal in refusals[1:]:
            print(f"lnk: also {shown_lines(str(refusal))}", file=sys.stderr)
        raise refusals[0]
    grants = judge(resolved, ctx)
    if args.json:
        document = {**grants_document(grants), "granted_by_the_box": {"agents": _box_programs()}}
        json.dump(document, sys.stdout, indent=2, sort_keys=True)
        print()
        return EXIT_OK
    print(f"spec: {shown(resolved.source or '(flags only)')}")
    print("opens:")
    for line in describe(grants):
        print(line)
    for line in box_grant_lines(_box_programs(), agents_only=True):
        print(line)
    print(f"hash: {grants.digest()}")
    return EXIT_OK
