"""Every refusal rule: a refused case and an allowed neighbour that must pass.

Cases that need the machine (links, sockets, descriptors, PATH) run through discovery on real
files under tmp_path; cases about fixed system folders judge resolved paths directly, since the
rules are pure functions. The owner's home is tmp_path/home, never the real /root.
"""

from __future__ import annotations

import dataclasses
import os
import re
import socket
import stat
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from lnk_shared.discovery import (
    JudgeContext,
    context_for,
    resolve_path,
    resolve_spec,
    writes_anything,
)
from lnk_shared.errors import (
    EXIT_REFUSED,
    CommandRefused,
    LinkRefused,
    OutsideCodeRefused,
    RefusedError,
    SandboxHomeRefused,
    SelfWideningRefused,
    SettingsGrantRefused,
    SocketGrantRefused,
    StateError,
)
from lnk_shared.grants import Grants, Identity, ResolvedFd, ResolvedPath, ResolvedSpec
from lnk_shared.paths import PROJECT_RUN_DOT_ENTRIES, BoxPaths
from lnk_shared.refusals import check_self_widening, find_refusals, inside, judge
from lnk_shared.spec import FdGrant, Origin, PathEntry, Spec, SpecBuilder

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


@pytest.fixture
def box(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Box]:
    for d in DIRS:
        (tmp_path / d).mkdir(parents=True, exist_ok=True)
    for f in FILES:
        (tmp_path / f).write_text("x")
    (tmp_path / SPEC_FILE).write_text("")
    tool = tmp_path / "tmpbin/tool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    monkeypatch.chdir(tmp_path / "home")
    with socket.socket(socket.AF_UNIX) as server:
        server.bind("agent.sock")  # relative: keeps the bound path under the 108-byte limit
        yield Box(tmp_path)


def check_refusal(error: RefusedError, kind: type[RefusedError], why: str, entry: str) -> None:
    assert type(error) is kind
    assert error.exit_code == EXIT_REFUSED
    assert f"[{kind.rule}]" in str(error)
    assert entry in error.entry
    assert why in error.why
    assert str(error).startswith(f"refused [{kind.rule}]: ")


# Each rule: what is refused, its allowed neighbour, the refusal, a phrase of its reason, and the
# entry its message must name.
RULES = [
    # --- the box's settings and agents' folders ------------------------------------------
    pytest.param(
        {"read": ["~/.lnk"]}, {"read": ["~/.lnkfoo"]},
        SettingsGrantRefused, "the box's settings", "folders.read", id="read-settings",
    ),
    pytest.param(
        {"read": ["~/.lnk/keys"]}, {"read": ["~/.config/x"]},
        SettingsGrantRefused, "the box's settings", "~/.lnk/keys", id="read-inside-settings",
    ),
    pytest.param(
        {"read": ["~/Link/Agents/x"]}, {"read": ["~/Link/Agentsx"]},
        SettingsGrantRefused, "agents' folders", "Link/Agents/x", id="read-agents",
    ),
    pytest.param(
        {"write": ["~/Link/History"]}, {"write": ["~/Link/Historyx"]},
        SettingsGrantRefused, "agents' folders", "Link/History", id="write-history",
    ),
    pytest.param(
        {"write": ["~/Link"]}, {"read": ["~/Link"]},
        SettingsGrantRefused, "which no sandbox may write", "~/Link", id="write-holds-agents",
    ),
    pytest.param(
        {"write": ["~"]}, {"read": ["~"]},
        SettingsGrantRefused, "which no sandbox may write", "folders.write", id="write-home",
    ),
    pytest.param(
        {"read": ["{root}/box/config"]}, {"read": ["{root}/box/configx"]},
        SettingsGrantRefused, "the box's own folder", "box/config", id="read-box-config",
    ),
    pytest.param(
        {"read": ["{root}/box/state"]}, {"read": ["{root}/box"]},
        SettingsGrantRefused, "the box's own folder", "box/state", id="read-box-state",
    ),
    pytest.param(
        {"write": ["{root}/box"]}, {"read": ["{root}/box"]},
        SettingsGrantRefused, "which no sandbox may write", "box", id="write-holds-box",
    ),
    # --- writes that let code run outside ------------------------------------------------
    pytest.param(
        {"write": ["~/.config/x"]}, {"write": ["~/config"]},
        OutsideCodeRefused, "~/.config is a home dot folder", "~/.config/x",
        id="write-home-dot-folder",
    ),
    pytest.param(
        {"write": ["~/.bashrc"]}, {"write": ["~/bashrc"]},
        OutsideCodeRefused, "~/.bashrc is a home dot folder", "~/.bashrc", id="write-dot-file",
    ),
    pytest.param(
        {"write": ["~/.local/bin"]}, {"read": ["~/.local/bin"]},
        OutsideCodeRefused, "home dot folder", "~/.local/bin", id="write-dot-local-bin",
    ),
    pytest.param(
        {"write": ["~/bin"]}, {"write": ["~/binx"]},
        OutsideCodeRefused, "is on PATH", "~/bin", id="write-path-folder",
    ),
    pytest.param(
        {"write": ["~/tools"]}, {"write": ["~/toolsx"]},
        OutsideCodeRefused, "/tools/bin is on PATH", "~/tools", id="write-holds-path-folder",
    ),
    pytest.param(
        {"write": ["~/bin"]}, {"read": ["~/bin"]},
        OutsideCodeRefused, "is on PATH", "~/bin", id="read-path-folder-is-fine",
    ),
    pytest.param(
        {"write": ["~/proj/.git/hooks"]}, {"write": ["~/proj/.git/objects"]},
        OutsideCodeRefused, ".git/hooks is a project file", "hooks", id="write-git-hooks",
    ),
    pytest.param(
        {"write": ["~/proj/.git"]}, {"write": ["~/proj"]},
        OutsideCodeRefused, "it holds .git/config", "~/proj/.git", id="write-git-folder",
    ),
    pytest.param(
        {"write": ["~/proj/.envrc"]}, {"write": ["~/proj/envrc"]},
        OutsideCodeRefused, ".envrc is a project file", ".envrc", id="write-envrc",
    ),
    pytest.param(
        {"write": ["~/proj/.vscode"]}, {"write": ["~/proj/vscode"]},
        OutsideCodeRefused, ".vscode is a project file", ".vscode", id="write-vscode",
    ),
    pytest.param(
        {"write": ["~/proj/.idea"]}, {"read": ["~/proj/.idea"]},
        OutsideCodeRefused, ".idea is a project file", ".idea", id="write-idea",
    ),
    pytest.param(
        {"write": ["~/proj/.github"]}, {"read": ["~/proj/.github"]},
        OutsideCodeRefused, ".github is a project file", ".github", id="write-github",
    ),
    # --- writes that widen the spec's own next run ---------------------------------------
    pytest.param(
        {"write": [f"~/{SPEC_FILE[5:]}"]}, {"read": [f"~/{SPEC_FILE[5:]}"]},
        SelfWideningRefused, "could rewrite this spec", "spec.toml", id="write-spec-file",
    ),
    pytest.param(
        {"write": ["~/work/specs"]}, {"write": ["~/work/specsx"]},
        SelfWideningRefused, "could rewrite this spec", "~/work/specs", id="write-spec-folder",
    ),
    pytest.param(
        {"write": ["~/work"]}, {"write": ["~/work/out"]},
        SelfWideningRefused, "could rewrite this spec", "~/work", id="write-spec-parent",
    ),
    # --- other programs' sockets ---------------------------------------------------------
    pytest.param(
        {"read": ["/run"]}, {"read": ["/usr/share"]},
        SocketGrantRefused, "where other programs keep their sockets", "/run", id="read-run",
    ),
    pytest.param(
        {"read": ["/var/run"]}, {"read": ["/var/log"]},
        SocketGrantRefused, "other programs keep their sockets", "/var/run (really /run)",
        id="read-var-run-link",
    ),
    pytest.param(
        {"write": ["{root}/xdg"]}, {"write": ["{root}/xdgx"]},
        SocketGrantRefused, "other programs keep their sockets", "xdg", id="write-runtime-dir",
    ),
    pytest.param(
        {"read": ["{root}/xdg/bus"]}, {"read": ["{root}/xdgx"]},
        SocketGrantRefused, "other programs keep their sockets", "xdg/bus",
        id="read-inside-runtime-dir",
    ),
    pytest.param(
        {"read": ["~/agent.sock"]}, {"read": ["~/plain"]},
        SocketGrantRefused, "it is a socket", "agent.sock", id="read-socket-file",
    ),
    pytest.param(
        {"write": ["~/agent.sock"]}, {"write": ["~/plain"]},
        SocketGrantRefused, "it is a socket", "agent.sock", id="write-socket-file",
    ),
    # --- [commands] ----------------------------------------------------------------------
    pytest.param(
        {"commands": ["{root}/tmpbin/tool"]}, {"commands": ["/usr/bin/python3"]},
        CommandRefused, "/tmp is a shared scratch folder", "tmpbin/tool", id="command-in-tmp",
    ),
    pytest.param(
        {"commands": ["~/.lnk/keys"]}, {"commands": ["/usr/bin"]},
        SettingsGrantRefused, "the box's settings", "commands.allow", id="command-in-settings",
    ),
    pytest.param(
        {"commands": ["/usr/bin/true"], "write": ["~/proj"], "fds": [("/usr/bin", "write")]},
        {"commands": ["/usr/bin/true"], "write": ["~/proj"], "fds": [("/usr/bin", "read")]},
        OutsideCodeRefused, "is on PATH", "--with-fd", id="with-fd-write-of-path-folder",
    ),
    # --- --with-fd is judged as a spec's folders -----------------------------------------
    pytest.param(
        {"fds": [("~/.config", "write")]}, {"fds": [("~/.config", "read")]},
        OutsideCodeRefused, "home dot folder", "--with-fd", id="with-fd-write-dot-folder",
    ),
    pytest.param(
        {"fds": [("~/work/specs", "write")]}, {"fds": [("~/work/out", "write")]},
        SelfWideningRefused, "could rewrite this spec", "--with-fd", id="with-fd-write-spec",
    ),
    pytest.param(
        {"fds": [("~/.lnk", "read")]}, {"fds": [("~/.lnkfoo", "read")]},
        SettingsGrantRefused, "the box's settings", "--with-fd", id="with-fd-read-settings",
    ),
    pytest.param(
        {"fds": [("/run", "read")]}, {"fds": [("/usr/share", "read")]},
        SocketGrantRefused, "sockets", "--with-fd", id="with-fd-read-run",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("refused", "allowed", "kind", "why", "entry"), RULES)
def test_rule_refuses_its_case(
    box: Box,
    refused: dict[str, Any],
    allowed: dict[str, Any],
    kind: type[RefusedError],
    why: str,
    entry: str,
) -> None:
    with pytest.raises(RefusedError) as caught:
        box.judge(**refused)
    check_refusal(caught.value, kind, why, entry)


@pytest.mark.parametrize(("refused", "allowed", "kind", "why", "entry"), RULES)
def test_rule_allows_its_neighbour(
    box: Box,
    refused: dict[str, Any],
    allowed: dict[str, Any],
    kind: type[RefusedError],
    why: str,
    entry: str,
) -> None:
    spec, ctx = box.resolve(**allowed)
    assert find_refusals(spec, ctx) == []
    assert judge(spec, ctx).spec == spec


def test_read_of_home_hides_settings_and_agents(box: Box) -> None:
    grants = box.judge(read=["~"])
    home = str(box.home)
    assert set(grants.hidden) == {f"{home}/.lnk", f"{home}/Link/Agents", f"{home}/Link/History"}
    assert grants.canonical()["hidden"] == sorted(grants.hidden)


def test_read_of_box_parent_hides_the_box_dirs(box: Box) -> None:
    grants = box.judge(read=["{root}/box"])
    assert set(grants.hidden) == {str(box.root / f"box/{d}") for d in ("config", "state", "run")}


def test_write_of_a_project_keeps_its_run_dot_entries_read_only(box: Box) -> None:
    grants = box.judge(write=["~/proj"])
    proj = str(box.home / "proj")
    assert f"{proj}/.git/hooks" in grants.read_only_inside
    assert f"{proj}/.envrc" in grants.read_only_inside
    assert set(grants.read_only_inside) == {f"{proj}/{e}" for e in PROJECT_RUN_DOT_ENTRIES}
    assert grants.hidden == ()


def test_write_fd_of_a_project_keeps_its_run_dot_entries_read_only(box: Box) -> None:
    grants = box.judge(fds=[("~/proj", "write")])
    assert str(box.home / "proj/.git/hooks") in grants.read_only_inside


def test_read_of_a_project_marks_nothing_read_only(box: Box) -> None:
    assert box.judge(read=["~/proj"]).read_only_inside == ()


def test_write_of_a_file_marks_nothing_read_only(box: Box) -> None:
    assert box.judge(write=["~/plain"]).read_only_inside == ()


def test_empty_spec_opens_nothing(box: Box) -> None:
    grants = box.judge()
    doc = grants.canonical()
    assert doc["read"] == doc["write"] == doc["commands"] == doc["hidden"] == []
    assert doc["internet"] == doc["lan"] == doc["browser"] == doc["localhost_ports"] == []
    assert doc["network"] is None


# --- another spelling of a protected place meets the same rule ---------------------------


@pytest.mark.parametrize(
    "written", ["~/.lnk", "{root}/home/.lnk", "~/proj/../.lnk", "~/innocent", "~/innocent/"]
)
def test_settings_under_another_spelling_is_refused(box: Box, written: str) -> None:
    (box.home / "innocent").symlink_to(".lnk")
    with pytest.raises(SettingsGrantRefused):
        box.judge(read=[written])


def test_write_of_a_link_to_a_dot_folder_is_refused(box: Box) -> None:
    (box.home / "proj/editor").symlink_to(".vscode")
    with pytest.raises(OutsideCodeRefused, match=r"really .*/proj/\.vscode"):
        box.judge(write=["~/proj/editor"])


def test_write_of_the_folder_of_a_link_to_the_spec_is_refused(box: Box) -> None:
    # The spec is named through ~/work/out/spec.toml -> ../specs/spec.toml; a sandbox that may
    # write ~/work/out could point that name at a spec of its own for the next run.
    (box.home / "work/out/spec.toml").symlink_to("../specs/spec.toml")
    ctx = box.ctx(spec_file=str(box.home / "work/out/spec.toml"))
    with pytest.raises(SelfWideningRefused, match=r"could replace the link .*/work/out/spec"):
        judge(*box.resolve(write=["~/work/out"], ctx=ctx))
    with pytest.raises(SelfWideningRefused):
        judge(*box.resolve(write=["~/work/specs"], ctx=ctx))
    judge(*box.resolve(write=["~/work/specsx"], ctx=ctx))


def test_spec_given_by_flags_only_has_no_self_widening_rule(box: Box) -> None:
    ctx = box.ctx(spec_file="")
    assert ctx.spec_file is None
    judge(*box.resolve(write=["~/work"], ctx=ctx))


# --- links not owned by root -------------------------------------------------------------


@pytest.mark.parametrize("key", ["read", "write", "commands"])
@pytest.mark.parametrize(("owner", "refused"), [(OTHER_UID, True), (0, False)])
def test_link_not_owned_by_root_on_the_way_is_refused(
    box: Box, key: str, owner: int, refused: bool
) -> None:
    target = "/usr/bin/true" if key == "commands" else str(box.home / "config")
    link = box.home / "via"
    link.symlink_to(target)
    os.lchown(link, owner, owner)
    if not refused:
        grants = box.judge(**{key: ["~/via"]})
        paths = (*grants.read, *grants.write, *grants.commands)
        assert [hop.owner_uid for p in paths for hop in p.links] == [0]
        return
    with pytest.raises(LinkRefused) as caught:
        box.judge(**{key: ["~/via"]})
    check_refusal(caught.value, LinkRefused, f"owned by uid {OTHER_UID}, not root", "~/via")
    assert str(link) in caught.value.why


def test_link_not_owned_by_root_deep_in_a_path_is_refused(box: Box) -> None:
    link = box.home / "proj/mid"
    link.symlink_to(box.home / "config")
    os.lchown(link, OTHER_UID, OTHER_UID)
    (box.home / "config/sub").mkdir()
    with pytest.raises(LinkRefused, match="mid"):
        box.judge(read=["~/proj/mid/sub"])


# --- pure cases: fixed system folders and paths this machine need not have ---------------


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


PURE_RULES = [
    pytest.param({"write": ["/usr/local/x"]}, {"read": ["/usr/local/x"]},
                 OutsideCodeRefused, "/usr is a system folder", id="write-usr-local"),
    pytest.param({"write": ["/usr/share/x"]}, {"write": ["/srv/data/out"]},
                 OutsideCodeRefused, "/usr is a system folder", id="write-usr"),
    pytest.param({"write": ["/etc/x"]}, {"write": ["/etcx/x"]},
                 OutsideCodeRefused, "/etc is a system folder", id="write-etc"),
    pytest.param({"write": ["/opt/x"]}, {"write": ["/optx"]},
                 OutsideCodeRefused, "/opt is a system folder", id="write-opt"),
    pytest.param({"write": ["/var/lib/x"]}, {"write": ["/var/libx"]},
                 OutsideCodeRefused, "/var/lib is a system folder", id="write-var-lib"),
    pytest.param({"write": ["/var"]}, {"read": ["/var/lib"]},
                 OutsideCodeRefused, "/var/cache is a system folder", id="write-holds-system"),
    pytest.param({"write": ["/boot/x"]}, {"write": ["/srv/boot"]},
                 OutsideCodeRefused, "/boot is a system folder", id="write-boot"),
    pytest.param({"write": ["/lib64/x"]}, {"write": ["/srv/lib64"]},
                 OutsideCodeRefused, "/lib64 is a system folder", id="write-lib64"),
    pytest.param({"write": ["/sbin"]}, {"write": ["/srv/sbin"]},
                 OutsideCodeRefused, "/sbin", id="write-sbin"),
    pytest.param({"write": ["/srv/p/.gitmodules"]}, {"write": ["/srv/p/gitmodules"]},
                 OutsideCodeRefused, ".gitmodules is a project file", id="write-gitmodules"),
    pytest.param({"write": ["/srv/p/.git/config"]}, {"write": ["/srv/p/.git/objects"]},
                 OutsideCodeRefused, ".git/config is a project file", id="write-git-config"),
    pytest.param({"write": ["/srv/p/.husky/pre-commit"]}, {"write": ["/srv/p/husky"]},
                 OutsideCodeRefused, ".husky is a project file", id="write-husky-inside"),
    pytest.param({"read": ["/run/x"]}, {"read": ["/runx"]},
                 SocketGrantRefused, "/run", id="read-inside-run"),
    pytest.param({"read": ["/"]}, {"read": ["/srv"]},
                 SocketGrantRefused, "/run", id="read-root-holds-run"),
    pytest.param({"write": ["/tmp/.X11-unix"]}, {"write": ["/srv/.X11-unix"]},
                 SocketGrantRefused, "/tmp/.X11-unix", id="write-x11-sockets"),
    pytest.param({"commands": ["/var/tmp/x"]}, {"commands": ["/var/tmpx/x"]},
                 CommandRefused, "/var/tmp is a shared scratch folder", id="command-var-tmp"),
    pytest.param({"commands": ["/dev/shm/x"]}, {"commands": ["/dev/shmx/x"]},
                 CommandRefused, "/dev/shm is a shared scratch folder", id="command-dev-shm"),
    pytest.param({"commands": ["/var"]}, {"commands": ["/usr"]},
                 CommandRefused, "/var/tmp is a shared scratch folder", id="command-holds-tmp"),
    pytest.param({"commands": ["/srv/proj/bin/x"], "write": ["/srv/proj"]},
                 {"commands": ["/srv/projx/x"], "write": ["/srv/proj"]},
                 CommandRefused, "the sandbox may write /srv/proj", id="command-in-write"),
    pytest.param({"commands": ["/srv/tools"], "write": ["/srv/tools/out"]},
                 {"commands": ["/srv/tools"], "write": ["/srv/toolsx"]},
                 CommandRefused, "the sandbox may write /srv/tools/out", id="command-holds-write"),
    pytest.param({"commands": ["/srv/proj/x"], "fds": [("/srv/proj", True)]},
                 {"commands": ["/srv/proj/x"], "fds": [("/srv/proj", False)]},
                 CommandRefused, "the sandbox may write /srv/proj", id="command-in-write-fd"),
    pytest.param({"write": ["/srv/data/out"], "fds": [("/etc", True)]},
                 {"write": ["/srv/data/out"], "fds": [("/etc", False)]},
                 OutsideCodeRefused, "/etc is a system folder", id="with-fd-write-etc"),
    pytest.param({"read": ["/home"]}, {"read": ["/home/someone"]},
                 SandboxHomeRefused, "it holds /home, where the sandbox's own home",
                 id="read-holds-sandbox-homes"),
    pytest.param({"write": ["/home"]}, {"write": ["/homework"]},
                 SandboxHomeRefused, "grant folders below /home instead",
                 id="write-holds-sandbox-homes"),
    pytest.param({"read": ["/srv/x"], "fds": [("/home", False)]},
                 {"read": ["/srv/x"], "fds": [("/srv", False)]},
                 SandboxHomeRefused, "/home", id="with-fd-holds-sandbox-homes"),
]  # fmt: skip


@pytest.mark.parametrize(("refused", "allowed", "kind", "why"), PURE_RULES)
def test_pure_rule_refuses_its_case(
    box: Box, refused: dict[str, Any], allowed: dict[str, Any], kind: type[RefusedError], why: str
) -> None:
    with pytest.raises(RefusedError) as caught:
        judge(resolved(**refused), box.ctx())
    error = caught.value
    first = (refused.get(k) for k in ("commands", "fds", "write", "read"))
    written = next(entries for entries in first if entries)[0]
    entry = written[0] if isinstance(written, tuple) else written
    check_refusal(error, kind, why, entry)


@pytest.mark.parametrize(("refused", "allowed", "kind", "why"), PURE_RULES)
def test_pure_rule_allows_its_neighbour(
    box: Box, refused: dict[str, Any], allowed: dict[str, Any], kind: type[RefusedError], why: str
) -> None:
    assert find_refusals(resolved(**allowed), box.ctx()) == []


def test_find_refusals_lists_every_rule_broken_settings_first(box: Box) -> None:
    spec = resolved(read=["/run"], write=["/etc/x", str(box.home / ".lnk")], commands=["/tmp/x"])
    kinds = [type(r) for r in find_refusals(spec, box.ctx())]
    assert kinds[0] is SocketGrantRefused  # reads are judged first, in the order given
    assert set(kinds) == {
        SocketGrantRefused, OutsideCodeRefused, SettingsGrantRefused, CommandRefused
    }  # fmt: skip
    with pytest.raises(SocketGrantRefused):
        judge(spec, box.ctx())


@pytest.mark.parametrize(
    ("path", "folder", "expected"),
    [
        ("/a/b", "/a", True),
        ("/a", "/a", True),
        ("/ab", "/a", False),
        ("/a", "/a/b", False),
        ("/anything", "/", True),
        ("/a/b", "/a/", True),
    ],
)
def test_inside_is_on_component_boundaries(path: str, folder: str, expected: bool) -> None:
    assert inside(path, folder) is expected


# --- self-widening by identity: what a path cannot show -----------------------------------

SPEC_ID = Identity(7, 100, stat.S_IFREG)
SPEC_FOLDER_ID = Identity(7, 50, stat.S_IFDIR)
ABOVE_ID = Identity(7, 2, stat.S_IFDIR)


@pytest.mark.parametrize(
    ("identity", "nlink", "is_dir", "why"),
    [
        (SPEC_FOLDER_ID, 1, True, "a folder holding this spec"),  # its folder, bind-mounted
        (ABOVE_ID, 1, True, "a folder holding this spec"),  # one above it
        (SPEC_ID, 1, False, "this spec .* under another name"),  # the file, hard-linked
        (Identity(7, 999, stat.S_IFDIR), 2, True, "has 2 hard links"),  # may hold another
        (Identity(7, 999, stat.S_IFDIR), 1, True, None),  # one link only: nothing to hold
        (Identity(8, 50, stat.S_IFDIR), 2, True, None),  # another filesystem holds no link
        (Identity(7, 999, stat.S_IFREG), 2, False, None),  # a file is not a folder holding one
    ],
)
def test_write_grant_judged_against_the_spec_by_identity(
    box: Box, identity: Identity, nlink: int, is_dir: bool, why: str | None
) -> None:
    ctx = dataclasses.replace(
        box.ctx(),
        spec_identity=SPEC_ID,
        spec_nlink=nlink,
        spec_folders=(ABOVE_ID, SPEC_FOLDER_ID),
    )
    grant = ResolvedPath("/mnt/elsewhere", "/mnt/elsewhere", is_dir=is_dir, identity=identity)
    spec, _ = box.resolve()
    spec = dataclasses.replace(spec, write=(grant,))
    refusals = [r for r in find_refusals(spec, ctx) if isinstance(r, SelfWideningRefused)]
    if why is None:
        assert refusals == []
    else:
        assert len(refusals) == 1
        assert re.search(why, refusals[0].why), refusals[0].why


def test_spec_hard_linked_into_its_write_folder_is_refused(box: Box) -> None:
    os.link(box.root / SPEC_FILE, box.home / "work/out/innocent.txt")
    with pytest.raises(SelfWideningRefused, match="has 2 hard links"):
        box.judge(write=["~/work/out"])


def test_spec_with_one_link_lets_a_sibling_folder_be_written(box: Box) -> None:
    box.judge(write=["~/work/out"])


def test_agent_home_holding_the_spec_is_refused_by_identity(box: Box) -> None:
    ctx = box.ctx()
    home = resolve_path(str(box.home / "work"), base="/", home=str(box.home))
    with pytest.raises(SelfWideningRefused, match="the agent's home"):
        check_self_widening(home, "the agent's home", ctx)
    elsewhere = resolve_path(str(box.home / "elsewhere"), base="/", home=str(box.home))
    check_self_widening(elsewhere, "the agent's home", ctx)


def test_write_of_a_folder_the_login_profile_puts_on_path_is_refused(box: Box) -> None:
    """The caller's PATH lacks ~/mytools, but the owner's ~/.profile puts it first at the next
    login: a sandbox writing it plants programs the owner's next shell runs."""
    (box.home / "mytools" / "sub").mkdir(parents=True)
    (box.home / ".profile").write_text(
        'if [ -d "$HOME/mytools" ]; then PATH="$HOME/mytools:$PATH"; fi\n'
    )
    ctx = box.ctx()
    assert str(box.home / "mytools") not in ctx.path_dirs
    for written in ("~/mytools", "~/mytools/sub"):
        with pytest.raises(OutsideCodeRefused, match="login PATH"):
            box.judge(write=[written], ctx=ctx)
    box.judge(read=["~/mytools"], ctx=ctx)


@pytest.mark.parametrize("folder", ["go/bin", "perl5/bin"])
def test_write_of_a_per_user_bin_folder_is_refused_when_not_on_path(box: Box, folder: str) -> None:
    (box.home / folder).mkdir(parents=True)
    top = folder.split("/", maxsplit=1)[0]
    for written in (f"~/{folder}", f"~/{top}"):
        with pytest.raises(OutsideCodeRefused, match="login PATH"):
            box.judge(write=[written])


def _unjudged_ctx(box: Box) -> JudgeContext:
    """The context a launch that writes nothing judges with: no login PATH folders read."""
    box_paths = BoxPaths(box.root / "box/config", box.root / "box/state", box.root / "box/run")
    env = {"PATH": "/usr/bin:/bin", "XDG_RUNTIME_DIR": str(box.root / "xdg")}
    return context_for(os.getuid(), env=env, box=box_paths, home=str(box.home), login_path=False)


def test_a_context_without_the_login_path_reads_none_of_it(box: Box) -> None:
    (box.home / "mytools").mkdir()
    (box.home / ".profile").write_text('PATH="$HOME/mytools:$PATH"\n')
    ctx = _unjudged_ctx(box)
    assert ctx.login_path_dirs == ()
    assert not ctx.login_path_judged
    assert str(box.home / "mytools") in box.ctx().login_path_dirs  # the neighbour reads it


@pytest.mark.parametrize(
    ("write", "fds"),
    [(["~/mytools"], []), (["~/elsewhere"], []), ([], [("~/elsewhere", "write")])],
)
def test_a_write_judged_without_the_login_path_is_a_state_error_not_a_grant(
    box: Box, write: list[str], fds: list[tuple[str, str]]
) -> None:
    """A context made for a spec that writes nothing cannot pass a write: were the launcher ever
    to judge a write with it, ~/mytools (on the login PATH) would be granted unrefused."""
    (box.home / "mytools").mkdir()
    (box.home / ".profile").write_text('PATH="$HOME/mytools:$PATH"\n')
    with pytest.raises(StateError, match="login PATH"):
        box.judge(write=write, fds=fds, ctx=_unjudged_ctx(box))


def test_a_read_judged_without_the_login_path_passes_and_is_refused_alike(box: Box) -> None:
    (box.home / "mytools").mkdir()
    (box.home / ".profile").write_text('PATH="$HOME/mytools:$PATH"\n')
    ctx = _unjudged_ctx(box)
    box.judge(read=["~/mytools", "~/elsewhere"], fds=[("~/elsewhere", "read")], ctx=ctx)
    with pytest.raises(SettingsGrantRefused):
        box.judge(read=["~/.lnk/keys"], ctx=ctx)


@pytest.mark.parametrize(
    ("write", "fds", "expected"),
    [
        ((), (), False),
        ((), ((3, False),), False),
        (("out",), (), True),
        ((), ((3, False), (4, True)), True),
    ],
)
def test_writes_anything(
    write: tuple[str, ...], fds: tuple[tuple[int, bool], ...], expected: bool
) -> None:
    spec = Spec(
        write=tuple(PathEntry(w, "/") for w in write),
        with_fds=tuple(FdGrant(fd, w) for fd, w in fds),
    )
    assert writes_anything(spec) is expected


def test_a_grant_holding_the_sandbox_homes_names_the_owners_home_when_it_is_below(
    box: Box,
) -> None:
    """The refusal says what to grant instead: the owner's own home when it is under /home,
    nothing more when it is elsewhere (root's /root)."""
    spec = resolved(read=["/home"])
    for home, hint in (("/home/alice", ", such as your home /home/alice"), ("/root", "")):
        ctx = dataclasses.replace(box.ctx(), home=home)
        with pytest.raises(SandboxHomeRefused) as caught:
            judge(spec, ctx)
        assert caught.value.why.endswith(f"grant folders below /home instead{hint}")
