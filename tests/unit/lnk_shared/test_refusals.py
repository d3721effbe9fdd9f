"""Every refusal rule: a refused case and an allowed neighbour that must pass.

Cases that need the machine (links, sockets, descriptors, PATH) run through discovery on real
files under tmp_path (`box`: conftest.py, tests/unit/helpers/refusal_box.py); the owner's home is
tmp_path/home, never the real /root. Cases about fixed system folders judge resolved paths
directly, since the rules are pure functions: test_refusals_pure.py; what a path cannot show
(the spec's identity, the login PATH): test_refusals_widening.py.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from refusal_box import OTHER_UID, SPEC_FILE, Box, check_refusal

from lnk_shared.errors import (
    CommandRefused,
    LinkRefused,
    OutsideCodeRefused,
    RefusedError,
    SelfWideningRefused,
    SettingsGrantRefused,
    SocketGrantRefused,
)
from lnk_shared.paths import PROJECT_RUN_DOT_ENTRIES
from lnk_shared.refusals import find_refusals, judge

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


# --- another spelling of a protected place meets the same rule ----------------------------


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


# --- links not owned by root --------------------------------------------------------------


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
