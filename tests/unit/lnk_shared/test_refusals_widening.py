"""What a path cannot show, on real files under tmp_path (`box`): a write grant judged against the
spec by identity (its folder bind-mounted, a hard link, an agent home holding it), and folders
the owner's login PATH puts first, which a context made for a launch that writes nothing does
not read, so a write judged with it is a state error, never a grant.
"""

from __future__ import annotations

import dataclasses
import os
import re
import stat

import pytest
from refusal_box import SPEC_FILE, Box

from lnk_shared.discovery import (
    JudgeContext,
    context_for,
    resolve_path,
    writes_anything,
)
from lnk_shared.errors import (
    OutsideCodeRefused,
    SelfWideningRefused,
    SettingsGrantRefused,
    StateError,
)
from lnk_shared.grants import Identity, ResolvedPath
from lnk_shared.paths import BoxPaths
from lnk_shared.refusals import check_self_widening, find_refusals
from lnk_shared.spec import FdGrant, PathEntry, Spec

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


# --- the login PATH -----------------------------------------------------------------------


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
