"""The box's `lnk` inside a sandbox that may call a bridge: where it is put and how bwrap
makes it (in its read-only root, never in a folder the sandbox writes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lnk_controller.box_client import BOX_BIN_INSIDE, box_client_links, inside_path
from lnk_controller.wall import Bind, SandboxLayout, bwrap_argv


@pytest.mark.parametrize(
    ("with_client", "expected"),
    [(True, f"{BOX_BIN_INSIDE}:/usr/bin:/bin"), (False, "/usr/bin:/bin")],
)
def test_the_box_client_is_first_on_path_only_where_a_bridge_may_be_called(
    with_client: bool, expected: str
) -> None:
    assert inside_path("/usr/bin:/bin", with_client=with_client) == expected


def test_the_link_names_the_installs_client_and_nothing_else_of_its_venv() -> None:
    links = box_client_links(Path("/opt/lnk/venv/bin"))
    assert links == {f"{BOX_BIN_INSIDE}/lnk": "/opt/lnk/venv/bin/lnk"}


def test_bwrap_makes_the_link_in_its_root_before_it_is_remounted_read_only() -> None:
    layout = SandboxLayout(
        uid=1,
        gid=1,
        user_name="u",
        home=Bind("/s/home", "/home/u", True),
        prefix="/opt/lnk",
        command=("/bin/true",),
        cwd="/",
        env={},
        terminal=False,
        box_links=box_client_links(Path("/opt/lnk/venv/bin")),
    )
    argv = bwrap_argv(layout)
    at = argv.index("--symlink", argv.index("--dir"))
    assert argv[at - 2 : at + 3] == [
        "--dir",
        BOX_BIN_INSIDE,
        "--symlink",
        "/opt/lnk/venv/bin/lnk",
        f"{BOX_BIN_INSIDE}/lnk",
    ]
    root_read_only = next(
        i for i in range(len(argv) - 1) if argv[i : i + 2] == ["--remount-ro", "/"]
    )
    assert at < root_read_only  # made in the root tmpfs, which is then made read-only
