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
from lnk_shared.opens import (
    box_grant_lines,
    connector_grant_lines,
    describe,
    env_lines,
    grants_document,
)
from lnk_shared.paths import BoxPaths
from lnk_shared.refusals import find_refusals, judge
from lnk_shared.spec import Spec
from lnk_shared.spec_flags import spec_from_arguments

__all__ = ["grants_from_arguments", "show"]


def _resolve(args: argparse.Namespace) -> tuple[Spec, ResolvedSpec, JudgeContext]:
    spec = spec_from_arguments(args, environ=os.environ)  # `--env NAME`: the caller's value
    ctx = context_for(
        os.getuid(), env=os.environ, box=BoxPaths.from_env(), spec_file=spec.source, cloud=DETECT
    )
    return spec, resolve_spec(spec, ctx, path_env=os.environ.get("PATH", "")), ctx


def grants_from_arguments(args: argparse.Namespace) -> Grants:
    """Read, resolve and judge the spec the arguments give, as the calling user."""
    _, resolved, ctx = _resolve(args)
    return judge(resolved, ctx)


def _box_programs() -> list[str]:
    """What the box grants an agent's sandbox besides its spec: this install's `lnk` client
    (lnk_controller/box_client.py), by its real path."""
    return [os.path.realpath(os.path.join(sys.prefix, "bin", "lnk"))]


def _connector(grants: Grants) -> list[str]:
    """What the box grants a sandbox with a proxy besides its spec: this install's ssh
    connector, `lnk-connect` (git over ssh: lnk_controller/client_proxy_env.py)."""
    path = os.path.realpath(os.path.join(sys.prefix, "bin", "lnk-connect"))
    return [path] if grants.spec.has_proxy else []


def show(args: argparse.Namespace) -> int:
    spec, resolved, ctx = _resolve(args)
    env_names = [name for name, _ in spec.env]  # the values may be keys: never shown
    refusals = find_refusals(resolved, ctx)
    if refusals:
        for refusal in refusals[1:]:
            print(f"lnk: also {shown_lines(str(refusal))}", file=sys.stderr)
        raise refusals[0]
    grants = judge(resolved, ctx)
    if args.json:
        by_box = {"agents": _box_programs(), "with_a_proxy": _connector(grants)}
        document = {
            **grants_document(grants),
            "granted_by_the_box": by_box,
            "env_names": env_names,
        }
        json.dump(document, sys.stdout, indent=2, sort_keys=True)
        print()
        return EXIT_OK
    print(f"spec: {shown(resolved.source or '(flags only)')}")
    print("opens:")
    for line in describe(grants) + env_lines(env_names):
        print(line)
    for line in [
        *connector_grant_lines(_connector(grants)),
        *box_grant_lines(_box_programs(), agents_only=True),
    ]:
        print(line)
    print(f"hash: {grants.digest()}")
    return EXIT_OK
