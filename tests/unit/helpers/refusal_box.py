"""An isolated owner for the refusal tests (tests/unit/lnk_shared/test_refusals*.py): a home, the
box's folders, a runtime folder and a spec file, all under tmp_path (the `box` fixture,
tests/unit/lnk_shared/conftest.py, makes them), with the spec flags it judges; a resolved spec
written by hand for the rules that are pure functions; and what every refusal must say."""

from __future__ import annotations

import os
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lnk_shared.discovery import (
    JudgeContext,
    context_for,
    resolve_spec,
)
from lnk_shared.errors import (
    EXIT_REFUSED,
    RefusedError,
)
from lnk_shared.grants import Grants, ResolvedFd, ResolvedPath, ResolvedSpec
from lnk_shared.paths import BoxPaths
from lnk_shared.refusals import judge
from lnk_shared.spec import Origin, SpecBuilder

OTHER_UID = 12345
ORIGIN = Origin("spec.toml", "k")

DIRS = [
    "home/.lnk/keys", "home/.lnkfoo", "home/Link/Agents/x", "home/Link/Agentsx",
    "home/Link/History", "home/Link/Historyx", "home/.config/x", "home/config",
    "home/.local/bin", "home/bin", "home/binx", "home/tools/bin", "home/toolsx",
    "home/proj/.git/hooks", "home/proj/.git/objects", "home/proj/.vscode", "home/proj/vscode",
    "home/proj/.idea", "home/proj/.github", "home/work/specs", "home/work/specsx",
    "home/work/out", "home/elsewhere", "box/config", "box/configx", "box/state", "box/run",
    "xdg/bus", "xdgx", "tmpbin",
]  # fmt: skip
FILES = ["home/.bashrc", "home/bashrc", "home/proj/.envrc", "home/proj/envrc", "home/plain"]
SPEC_FILE = "home/work/specs/spec.toml"


@dataclass
class Box:
    """An isolated owner: home, box dirs, runtime dir and a spec file, all under tmp_path."""

    root: Path

    @property
    def home(self) -> Path:
        return self.root / "home"

    def path(self, written: str) -> str:
        """The written form, `~` kept for discovery to expand; {root} is tmp_path."""
        return written.replace("{root}", str(self.root))

    def real(self, written: str) -> str:
        text = self.path(written)
        return str(self.home / text[2:]) if text.startswith("~/") else text

    def ctx(self, spec_file: str | None = None) -> JudgeContext:
        box = BoxPaths(self.root / "box/config", self.root / "box/state", self.root / "box/run")
        env = {
            "PATH": f"{self.home}/bin:{self.home}/tools/bin:/usr/bin:/bin",
            "XDG_RUNTIME_DIR": str(self.root / "xdg"),
        }
        spec = spec_file if spec_file is not None else str(self.root / SPEC_FILE)
        return context_for(os.getuid(), env=env, box=box, spec_file=spec, home=str(self.home))

    def resolve(
        self,
        *,
        read: Sequence[str] = (),
        write: Sequence[str] = (),
        commands: Sequence[str] = (),
        fds: Sequence[tuple[str, str]] = (),
        ctx: JudgeContext | None = None,
    ) -> tuple[ResolvedSpec, JudgeContext]:
        ctx = ctx or self.ctx()
        builder = SpecBuilder(source=str(self.root / SPEC_FILE))
        for text in read:
            builder.add_read(self.path(text), str(self.home), ORIGIN)
        for text in write:
            builder.add_write(self.path(text), str(self.home), ORIGIN)
        for text in commands:
            builder.add_command(self.path(text), str(self.home), ORIGIN)
        with ExitStack() as stack:
            for text, mode in fds:
                fd = os.open(self.real(text), os.O_RDONLY | os.O_DIRECTORY)
                stack.callback(os.close, fd)
                builder.add_fd(f"{fd}:{mode}", ORIGIN)
            return resolve_spec(builder.build(), ctx, path_env="/usr/bin:/bin"), ctx

    def judge(self, **kwargs: Any) -> Grants:
        return judge(*self.resolve(**kwargs))


def check_refusal(error: RefusedError, kind: type[RefusedError], why: str, entry: str) -> None:
    assert type(error) is kind
    assert error.exit_code == EXIT_REFUSED
    assert f"[{kind.rule}]" in str(error)
    assert entry in error.entry
    assert why in error.why
    assert str(error).startswith(f"refused [{kind.rule}]: ")


def resolved(
    *,
    read: Sequence[str] = (),
    write: Sequence[str] = (),
    commands: Sequence[str] = (),
    fds: Sequence[tuple[str, bool]] = (),
) -> ResolvedSpec:
    def paths(texts: Sequence[str]) -> tuple[ResolvedPath, ...]:
        return tuple(ResolvedPath(real=t, written=t, is_dir=not t.endswith("x")) for t in texts)

    return ResolvedSpec(
        source=None,
        read=paths(read),
        write=paths(write),
        commands=paths(commands),
        commands_any=False,
        internet_any=False,
        internet=(),
        network_host=False,
        lan_any=False,
        lan=(),
        browser=(),
        ports=(),
        with_fds=tuple(ResolvedFd(3 + i, w, ResolvedPath(p, p)) for i, (p, w) in enumerate(fds)),
    )
