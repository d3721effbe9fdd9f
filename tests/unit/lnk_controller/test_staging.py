"""Staging's placeholders: which dot entries a write grant is missing (so an empty read-only
stand-in keeps the sandbox from planting them), and removing a stand-in only while it is still
the very empty file or folder made here."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from lnk_controller.placeholder_make import set_immutable
from lnk_controller.placeholders import (
    PLACEHOLDER,
    _missing_entries,
    remove_placeholder,
)
from lnk_controller.staging import TMPFS_NAMES, staged_names, wanted_binds, wanted_paths
from lnk_shared.paths import PROJECT_RUN_DOT_ENTRIES
from lnk_shared.protected_names import GIT_REDIRECTS

TOP_LEVEL = sorted({entry.split("/")[0] for entry in PROJECT_RUN_DOT_ENTRIES})


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    path = tmp_path / "project"
    path.mkdir()
    return path


def missing(folder: Path) -> dict[str, bool]:
    """Each missing entry and whether its placeholder is a folder."""
    return {entry: content is None for entry, content in contents(folder).items()}


def contents(folder: Path) -> dict[str, bytes | None]:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return dict(_missing_entries(fd))
    finally:
        os.close(fd)


def test_empty_folder_misses_every_top_level_entry_once(folder: Path) -> None:
    assert sorted(missing(folder)) == TOP_LEVEL


def test_missing_git_gets_one_folder_placeholder_covering_hooks_and_config(folder: Path) -> None:
    found = missing(folder)
    assert found[".git"] is True
    assert [entry for entry in found if entry.startswith(".git/")] == []


def test_git_without_hooks_or_config_gets_both(folder: Path) -> None:
    (folder / ".git").mkdir()
    found = missing(folder)
    assert found[".git/hooks"] is True
    assert found[".git/config"] is False
    assert ".git" not in found


def test_git_with_config_but_no_hooks_gets_hooks(folder: Path) -> None:
    (folder / ".git").mkdir()
    (folder / ".git" / "config").write_text("[core]\n")
    found = missing(folder)
    assert found.get(".git/hooks") is True
    assert ".git/config" not in found


def test_complete_git_needs_nothing(folder: Path) -> None:
    (folder / ".git").mkdir()
    for name in GIT_REDIRECTS:
        if name.kind == "folder":
            (folder / name.path).mkdir(parents=True)
        else:
            (folder / name.path).write_text("")
    assert [entry for entry in missing(folder) if entry.startswith(".git/")] == []


def test_git_file_of_a_worktree_or_submodule_is_not_an_error(folder: Path) -> None:
    # In a linked worktree or a submodule, `.git` is a file ("gitdir: ..."); nothing can be
    # made under it, and it is present, so nothing under .git is missing.
    (folder / ".git").write_text("gitdir: /home/owner/repo/.git/worktrees/project\n")
    found = missing(folder)
    assert [entry for entry in found if entry == ".git" or entry.startswith(".git/")] == []


@pytest.mark.parametrize("entry", TOP_LEVEL)
def test_every_top_level_placeholder_is_an_empty_folder_git_never_lists(
    folder: Path, entry: str
) -> None:
    # Whatever the tool expects (.envrc and .npmrc are files), the stand-in at the top is an
    # empty folder: git neither lists nor adds one, inside the sandbox or outside.
    assert missing(folder)[entry] is True


@pytest.mark.parametrize(
    ("entry", "content"),
    [
        (".git/config", b""),
        (".git/config.worktree", b""),
        (".git/commondir", b".\n"),  # "." is .git itself: git reads it as if absent
        (".git/hooks", None),
        (".git/info", None),
        (".git/modules", None),
        (".git/worktrees", None),
    ],
)
def test_placeholders_inside_git_are_what_git_reads_as_absent(
    folder: Path, entry: str, content: bytes | None
) -> None:
    (folder / ".git").mkdir()
    assert contents(folder)[entry] == content


def test_every_git_redirect_is_covered_inside_an_existing_git(folder: Path) -> None:
    (folder / ".git").mkdir()
    found = contents(folder)
    assert sorted(e for e in found if e.startswith(".git/")) == sorted(
        n.path for n in GIT_REDIRECTS
    )


@pytest.mark.parametrize("entry", [".envrc", ".vscode", ".git"])
def test_existing_entries_are_not_missing(folder: Path, entry: str) -> None:
    (folder / entry).mkdir()
    assert entry not in missing(folder)


def test_dangling_link_counts_as_present(folder: Path) -> None:
    # A link is present (kept read-only by the wall); a placeholder cannot replace it.
    (folder / ".envrc").symlink_to("/nonexistent/envrc")
    assert ".envrc" not in missing(folder)


def record(path: Path) -> str:
    info = os.lstat(path)
    return f"{PLACEHOLDER}{info.st_dev}:{info.st_ino}:{path}"


@pytest.fixture
def file_placeholder(folder: Path) -> Iterator[tuple[Path, str]]:
    path = folder / ".envrc"
    os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o444))
    yield path, record(path)


@pytest.fixture
def folder_placeholder(folder: Path) -> Iterator[tuple[Path, str]]:
    path = folder / ".vscode"
    path.mkdir(mode=0o555)
    yield path, record(path)
    if path.exists():
        path.chmod(0o755)


def test_empty_file_placeholder_is_removed(file_placeholder: tuple[Path, str]) -> None:
    path, rec = file_placeholder
    remove_placeholder(rec)
    assert not os.path.lexists(path)


def test_empty_folder_placeholder_is_removed(folder_placeholder: tuple[Path, str]) -> None:
    path, rec = folder_placeholder
    remove_placeholder(rec)
    assert not os.path.lexists(path)


def test_file_placeholder_someone_filled_stays(file_placeholder: tuple[Path, str]) -> None:
    path, rec = file_placeholder
    path.chmod(0o644)
    path.write_text("use nix\n")
    remove_placeholder(rec)
    assert path.read_text() == "use nix\n"


def test_folder_placeholder_someone_filled_stays(folder_placeholder: tuple[Path, str]) -> None:
    path, rec = folder_placeholder
    path.chmod(0o755)
    (path / "settings.json").write_text("{}")
    remove_placeholder(rec)
    assert (path / "settings.json").read_text() == "{}"


def test_swapped_placeholder_is_left_alone(file_placeholder: tuple[Path, str]) -> None:
    path, rec = file_placeholder
    other = path.with_name("other")
    other.touch()  # made while the placeholder exists, so its inode differs
    os.replace(other, path)
    remove_placeholder(rec)
    assert path.exists()


def test_placeholder_swapped_for_a_link_leaves_link_and_target(
    folder: Path, file_placeholder: tuple[Path, str]
) -> None:
    path, rec = file_placeholder
    victim = folder / "owners-empty-file"
    victim.touch()
    path.unlink()
    path.symlink_to(victim)
    remove_placeholder(rec)
    assert path.is_symlink()
    assert victim.exists()


def test_folder_placeholder_swapped_for_an_empty_folder_stays(
    folder_placeholder: tuple[Path, str],
) -> None:
    path, rec = folder_placeholder
    other = path.with_name("other")
    other.mkdir()  # made while the placeholder exists, so its inode differs
    path.rmdir()
    other.rename(path)
    remove_placeholder(rec)
    assert path.is_dir()


def test_missing_placeholder_is_tolerated(file_placeholder: tuple[Path, str]) -> None:
    path, rec = file_placeholder
    path.unlink()
    remove_placeholder(rec)
    remove_placeholder(rec)  # twice: a second cleanup after a crash


def test_placeholder_path_with_colons(tmp_path: Path) -> None:
    path = tmp_path / "a:b" / "c:d"
    path.mkdir(parents=True)
    rec = record(path)
    assert rec.endswith(str(path))
    remove_placeholder(rec)
    assert not path.exists()


@pytest.mark.parametrize(
    ("program", "files", "bound"),
    [
        ("/home/u/tools/run", frozenset({"/home/u/tools/run"}), True),  # pinned in its folder
        ("/home/u/tools/run", frozenset(), False),  # a folder of programs: the grant covers it
        ("/opt/x/run", frozenset(), True),  # outside every grant: bound on its own
        ("/usr/bin/cat", frozenset({"/usr/bin/cat"}), False),  # the system's, bound read-only
        ("/", frozenset(), False),  # allow = ["*"]
        ("/home/u/tools", frozenset(), False),  # the granted folder itself
    ],
)
def test_a_program_file_in_a_granted_folder_is_bound_as_itself(
    program: str, files: frozenset[str], bound: bool
) -> None:
    wanted = wanted_paths(["/home/u/tools"], [], [], (program,), files)
    assert wanted.count(program) == bound + (program == "/home/u/tools")  # bound once at most
    assert "/home/u/tools" in wanted


def test_immutable_placeholder_is_removed(folder_placeholder: tuple[Path, str]) -> None:
    # Placeholders are made immutable (nobody but root removes one while its sandbox runs);
    # the clean-up clears the flag before removing it.
    path, rec = folder_placeholder
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        set_immutable(fd, True)
    finally:
        os.close(fd)
    with pytest.raises(PermissionError):
        path.rmdir()
    remove_placeholder(rec)
    assert not os.path.lexists(path)


def test_commondir_placeholder_is_removed_and_a_filled_one_stays(folder: Path) -> None:
    (folder / ".git").mkdir()
    path = folder / ".git" / "commondir"
    path.write_bytes(b".\n")
    remove_placeholder(record(path))
    assert not path.exists()
    path.write_bytes(b"../other\n")
    remove_placeholder(record(path))
    assert path.read_bytes() == b"../other\n"


@pytest.mark.parametrize(
    ("programs_apart", "read", "execute", "wanted"),
    [
        # a finite list: the granted program in a read grant gets a bind of its own
        (
            True,
            ["/srv/tools"],
            ("/srv/tools/bin/a", "/usr/bin/dash"),
            [("/srv/tools", False, False), ("/srv/tools/bin/a", False, True)],
        ),
        # unsafe_loader_maps_anything: the grant itself is exec-capable, no bind of its own
        (False, ["/srv/tools"], ("/srv/tools/bin/a",), [("/srv/tools", False, False)]),
        # a read grant that is the program itself: staged once, exec-capable (staging)
        (True, ["/srv/tools/bin/a"], ("/srv/tools/bin/a",), [("/srv/tools/bin/a", False, False)]),
        # programs under /usr are mounted in /usr's view, and `*` names no program
        (True, [], ("/usr/bin/dash", "/"), []),
        (True, [], ("/opt/x/bin/x",), [("/opt/x/bin/x", False, True)]),
    ],
)
def test_which_programs_get_a_bind_of_their_own(
    programs_apart: bool,
    read: list[str],
    execute: tuple[str, ...],
    wanted: list[tuple[str, bool, bool]],
) -> None:
    assert wanted_binds(read, [], [], execute, programs_apart=programs_apart) == wanted


@pytest.mark.parametrize(
    ("programs_apart", "read", "write", "execute"),
    [
        (True, [], [], ("/usr/bin/true",)),  # a plain launch: the tmpfs and /usr's clone
        (True, ["/srv/tools"], ["/srv/w"], ("/srv/tools/bin/a", "/opt/x/bin/x")),
        (False, ["/srv/tools"], [], ("/srv/tools/bin/a",)),  # no /usr clone: no `usr`
    ],
)
def test_the_record_names_every_mount_staging_makes_in_its_order(
    programs_apart: bool, read: list[str], write: list[str], execute: tuple[str, ...]
) -> None:
    # Written with the record (SandboxStore.create) instead of by staging: a name missing here
    # would be a mount made unrecorded, which a crash would leave behind.
    binds = wanted_binds(read, write, [], execute, programs_apart=programs_apart)
    names = staged_names(len(binds), programs_apart=programs_apart)
    grants = [f"g{n}" for n in range(len(binds))]
    assert names == (*TMPFS_NAMES, *grants, *(["usr"] if programs_apart else []))
