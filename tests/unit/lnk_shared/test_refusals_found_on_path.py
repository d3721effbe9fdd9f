"""A `[commands]` name found on PATH through the owner's own links (a package manager's
`~/.local/bin/tool -> ~/.local/share/tool/1.2/tool`): granted by its real program, unless
someone besides root and the owner could choose what it runs. Pure cases on resolved paths
(the owner is OWNER, never this test's uid); the discovery that records them is in
test_discovery.py, the whole path (a real user, a real box) in tests/e2e/test_path_links.py.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path

import pytest

from lnk_shared.discovery import JudgeContext, context_for
from lnk_shared.errors import CommandRefused, LinkRefused, RefusedError
from lnk_shared.grants import Holder, LinkHop, ResolvedFd, ResolvedPath, ResolvedSpec
from lnk_shared.paths import BoxPaths
from lnk_shared.refusals import MAX_FOUND_LINKS, find_refusals, judge

OWNER = 4242
OTHER = 4343
HOME = "/home/u"
BIN = f"{HOME}/.local/bin"
REAL = f"{HOME}/.local/share/tool/1.2/tool"


def ctx(tmp_path: Path) -> JudgeContext:
    box = BoxPaths(tmp_path / "box/config", tmp_path / "box/state", tmp_path / "box/run")
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "XDG_RUNTIME_DIR": str(tmp_path / "xdg")}
    made = context_for(OWNER, env=env, box=box, home=HOME, login_path=False)
    return dataclasses.replace(made, login_path_judged=True)


def folders(path: str, *, uid: int = OWNER, mode: int = 0o755) -> tuple[Holder, ...]:
    """Holders of `path`'s folders and itself: root's down to /home/u, then `uid`'s."""
    parts = path.strip("/").split("/")
    out = [Holder("/", 0, 0o755)]
    for i in range(len(parts)):
        where = "/" + "/".join(parts[: i + 1])
        owned = where.startswith(HOME + "/") or where == HOME
        out.append(Holder(where, uid if owned else 0, mode if owned else 0o755))
    return tuple(out)


def hop(link: str, target: str, *, uid: int = OWNER, **holder: int) -> LinkHop:
    return LinkHop(link, target, uid, folders(os.path.dirname(link), **holder))


def found(
    *,
    links: Sequence[LinkHop] | None = None,
    real: str = REAL,
    holders: tuple[Holder, ...] | None = None,
    on_path: str | None = f"{BIN}/tool",
) -> ResolvedPath:
    return ResolvedPath(
        real=real,
        written="tool" if on_path else f"{BIN}/tool",
        links=tuple(links if links is not None else [hop(f"{BIN}/tool", REAL)]),
        is_dir=False,
        holders=holders
        if holders is not None
        else (*folders(os.path.dirname(real)), Holder(real, OWNER, 0o755)),
        found_on_path=on_path,
    )


def spec(
    command: ResolvedPath, *, write: Sequence[str] = (), fds: Sequence[str] = ()
) -> ResolvedSpec:
    def paths(texts: Sequence[str]) -> tuple[ResolvedPath, ...]:
        return tuple(ResolvedPath(real=t, written=t) for t in texts)

    return ResolvedSpec(
        source=None,
        read=(),
        write=paths(write),
        commands=(command,),
        commands_any=False,
        internet_any=False,
        internet=(),
        network_host=False,
        lan_any=False,
        lan=(),
        browser=(),
        ports=(),
        with_fds=tuple(ResolvedFd(3 + i, True, ResolvedPath(p, p)) for i, p in enumerate(fds)),
    )


def test_a_name_found_through_the_owners_own_link_is_granted_by_its_real_program(
    tmp_path: Path,
) -> None:
    grants = judge(spec(found()), ctx(tmp_path))
    assert grants.canonical()["commands"] == [REAL]  # the real program, never the link


def test_the_hash_follows_the_real_program_not_the_link(tmp_path: Path) -> None:
    relative = found(links=[hop(f"{BIN}/tool", "../share/tool/1.2/tool")])
    moved = found(
        links=[hop(f"{BIN}/tool", REAL.replace("1.2", "1.3"))], real=REAL.replace("1.2", "1.3")
    )
    first = judge(spec(found()), ctx(tmp_path)).digest()
    assert judge(spec(relative), ctx(tmp_path)).digest() == first  # same program: no question
    assert judge(spec(moved), ctx(tmp_path)).digest() != first  # another program: asks again


# /srv/other is another user's: whatever the owner's link there says, that user may replace it.
OTHERS_FOLDER = (
    Holder("/", 0, 0o755),
    Holder("/srv", 0, 0o755),
    Holder("/srv/other", OTHER, 0o755),
)
ATTACKS = [
    pytest.param([hop(f"{BIN}/tool", REAL, uid=OTHER)], None, LinkRefused,
                 f"owned by uid {OTHER}, neither root nor you", id="link-of-another-user"),
    pytest.param([hop(f"{BIN}/tool", REAL, uid=OTHER, mode=0o755)], None, LinkRefused,
                 f"owned by uid {OTHER}", id="link-in-another-users-folder"),
    pytest.param([hop(f"{BIN}/tool", REAL, mode=0o777)], None, LinkRefused,
                 "which every user may change", id="link-in-a-world-writable-folder"),
    pytest.param([hop(f"{BIN}/tool", REAL, mode=0o775)], None, LinkRefused,
                 "which its group may change", id="link-in-a-group-writable-folder"),
    pytest.param([LinkHop(f"{BIN}/tool", REAL, OWNER)], None, LinkRefused,
                 "not known", id="link-folders-unknown"),
    pytest.param([hop(f"{BIN}/tool", "/srv/other/tool"),
                  LinkHop("/srv/other/tool", REAL, OWNER, OTHERS_FOLDER)],
                 None, LinkRefused, f"/srv/other, which uid {OTHER} (its owner) may change",
                 id="chain-through-another-users-folder"),
    pytest.param([hop(f"{BIN}/tool", f"{BIN}/t{i}") for i in range(MAX_FOUND_LINKS + 1)], None,
                 LinkRefused, f"more than {MAX_FOUND_LINKS}", id="chain-longer-than-the-bound"),
    pytest.param(None, (*folders(os.path.dirname(REAL)), Holder(REAL, OWNER, 0o775)),
                 LinkRefused, "may be changed by its group", id="real-program-group-writable"),
    pytest.param(None, (*folders(os.path.dirname(REAL)), Holder(REAL, OTHER, 0o755)),
                 LinkRefused, f"may be changed by uid {OTHER}", id="real-program-of-another"),
    pytest.param(None, (*folders(os.path.dirname(REAL), mode=0o777), Holder(REAL, OWNER, 0o755)),
                 LinkRefused, "on its way may be changed by every user",
                 id="real-program-in-a-world-writable-folder"),
    pytest.param(None, (), LinkRefused, "not known", id="real-program-holders-unknown"),
]  # fmt: skip


@pytest.mark.parametrize(("links", "holders", "kind", "why"), ATTACKS)
def test_someone_else_choosing_what_a_found_name_runs_is_refused(
    tmp_path: Path,
    links: list[LinkHop] | None,
    holders: tuple[Holder, ...] | None,
    kind: type[RefusedError],
    why: str,
) -> None:
    with pytest.raises(RefusedError) as caught:
        judge(spec(found(links=links, holders=holders)), ctx(tmp_path))
    assert type(caught.value) is kind
    assert why in caught.value.why, caught.value.why


def test_a_sticky_world_writable_folder_on_the_way_is_not_anyone_elses_to_change(
    tmp_path: Path,
) -> None:
    sticky = (*folders(os.path.dirname(REAL), mode=0o1777), Holder(REAL, OWNER, 0o755))
    assert find_refusals(spec(found(holders=sticky)), ctx(tmp_path)) == []


@pytest.mark.parametrize("how", ["write", "fd"])
def test_a_link_in_a_folder_the_sandbox_writes_is_refused(tmp_path: Path, how: str) -> None:
    """~/.local/bin/tool -> ~/proj/out/tool -> the real program: the sandbox writes ~/proj/out,
    so it could retarget the chain's second link for the next run."""
    out = f"{HOME}/proj/out"
    chain = [hop(f"{BIN}/tool", f"{out}/tool"), hop(f"{out}/tool", REAL)]
    writes = {"write": [out]} if how == "write" else {"fds": [out]}
    with pytest.raises(CommandRefused, match=f"is in {out}, which the sandbox"):
        judge(spec(found(links=chain), **writes), ctx(tmp_path))  # type: ignore[arg-type]


def test_a_link_in_a_shared_scratch_folder_is_refused(tmp_path: Path) -> None:
    link = hop("/var/tmp/tool", REAL)
    with pytest.raises(CommandRefused, match="/var/tmp, which the sandbox or anyone may write"):
        judge(spec(found(links=[link], on_path="/var/tmp/tool")), ctx(tmp_path))


def test_a_real_program_in_a_folder_the_sandbox_writes_is_refused(tmp_path: Path) -> None:
    real = f"{HOME}/proj/out/tool"
    command = found(
        links=[hop(f"{BIN}/tool", real)],
        real=real,
        holders=(*folders(os.path.dirname(real)), Holder(real, OWNER, 0o755)),
    )
    with pytest.raises(CommandRefused, match="the sandbox may write"):
        judge(spec(command, write=[f"{HOME}/proj/out"]), ctx(tmp_path))


def test_an_explicit_path_through_the_owners_link_stays_refused_with_the_hint(
    tmp_path: Path,
) -> None:
    with pytest.raises(LinkRefused) as caught:
        judge(spec(found(on_path=None)), ctx(tmp_path))
    assert f"owned by uid {OWNER}, not root" in caught.value.why
    assert "name the program without a path ('tool')" in caught.value.why


def test_a_name_found_through_root_links_in_roots_folders_is_granted(tmp_path: Path) -> None:
    root_link = LinkHop("/usr/bin/tool", "/usr/lib/tool/tool", 0, folders("/usr/bin"))
    real = "/usr/lib/tool/tool"
    command = found(
        links=[root_link],
        real=real,
        holders=(*folders("/usr/lib/tool"), Holder(real, 0, 0o755)),
        on_path="/usr/bin/tool",
    )
    assert find_refusals(spec(command), ctx(tmp_path)) == []


def test_a_root_link_in_a_folder_anyone_may_write_is_refused(tmp_path: Path) -> None:
    """The link is root's (a root caller made it, as `lnk sandbox check` does), but its
    folder is 0777 without the sticky bit: any local user may replace it before the next
    discovery, so the link's owner alone does not make the chain root's."""
    shared = "/srv/shared"
    root_link = LinkHop(
        f"{shared}/tool", "/usr/bin/true", 0, (Holder("/", 0, 0o755), Holder(shared, 0, 0o777))
    )
    command = found(
        links=[root_link],
        real="/usr/bin/true",
        holders=(*folders("/usr/bin"), Holder("/usr/bin/true", 0, 0o755)),
        on_path=f"{shared}/tool",
    )
    with pytest.raises(LinkRefused, match="may change"):
        judge(spec(command), ctx(tmp_path))
