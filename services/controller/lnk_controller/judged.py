"""A launch request judged (`launch_judge.py`): what the sandbox is granted and runs, as values
the launch's later steps read (`sandbox_plan.py` composes the sandbox from it).

What this does NOT do: judge anything (`lnk_shared.refusals` does), or hold a file open.
"""

from __future__ import annotations

import dataclasses
import stat
from collections.abc import Mapping
from dataclasses import dataclass

from lnk_controller.agent_launch import AgentLaunch
from lnk_controller.as_caller import CallerCredentials
from lnk_controller.limits import Limits
from lnk_shared.grants import Grants, Identity

__all__ = ["Judged", "bound_grants", "program_files"]


@dataclass(frozen=True)
class Judged:
    """A launch request judged: grants, the program to run, and whether it must be approved."""

    grants: Grants
    digest: str
    spec_key: str
    program: str
    execute: tuple[str, ...]
    approval_lines: tuple[str, ...] | None  # None: already approved
    agent: AgentLaunch | None = None  # `lnk agent start`: the agent this sandbox runs as
    # real path -> the object judged there (bound.py binds that object or refuses)
    identities: Mapping[str, Identity] = dataclasses.field(default_factory=dict)
    caller: CallerCredentials | None = None  # whose credentials it was judged with
    limits: Limits | None = None  # the box's, or less where the spec asked ([limits], flags)
    # [env] and --env (lnk_shared.env_names judged each): never in a repr, a log or the database
    env: Mapping[str, str] = dataclasses.field(default_factory=dict, repr=False, compare=False)


def program_files(judged: Judged) -> frozenset[str]:
    """The programs judged as files: each is bound as the very file judged (staging)."""
    ids = judged.identities
    return frozenset(p for p in judged.execute if p in ids and ids[p].kind == stat.S_IFREG)


def bound_grants(
    judged: Judged,
) -> tuple[list[str], list[str], list[tuple[str, bool]], tuple[str, ...]]:
    """What staging binds: (read grants, write grants with an agent's home, --with-fd grants,
    the programs it may execute)."""
    g = judged.grants
    return (
        [p.real for p in g.read],
        [p.real for p in g.write] + ([judged.agent.home] if judged.agent else []),
        [(f.path.real, f.write) for f in g.spec.with_fds],
        judged.execute,
    )
