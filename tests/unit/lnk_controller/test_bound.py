"""Binding what was judged: the same object by identity, opened without links, or a refusal."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from lnk_controller.bound import (
    JudgedObject,
    changed,
    identity_of,
    judged_identities,
    open_judged,
    open_no_links,
    same_spec,
)
from lnk_shared.discovery import context_for, resolve_path
from lnk_shared.errors import LaunchRefused
from lnk_shared.grants import Identity
from lnk_shared.paths import BoxPaths


@pytest.fixture
def home(tmp_path: Path) -> Path:
    (tmp_path / "work/out").mkdir(parents=True)
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh/id").write_text("KEY\n")
    return tmp_path


def _judged(path: Path, home: Path) -> JudgedObject:
    resolved = resolve_path(str(path), base="/", home=str(home))
    return JudgedObject(resolved.real, resolved.identity)


@contextmanager
def _client(path: Path) -> Iterator[int]:
    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)  # as the client does: following links
    try:
        yield fd
    finally:
        os.close(fd)


def _bind(obj: JudgedObject, client: int, home: Path, *, unsafe: bool = False) -> dict[str, int]:
    return open_judged([obj], {obj.real: client}, home=str(home), unsafe_skip_identity_check=unsafe)


def test_an_unchanged_grant_opens_as_the_object_judged(home: Path) -> None:
    obj = _judged(home / "work/out", home)
    with _client(home / "work/out") as client:
        opened = _bind(obj, client, home)
        assert identity_of(opened[obj.real]) == obj.identity
        os.close(opened[obj.real])


@pytest.mark.parametrize("swap", ["the grant", "its parent"])
def test_a_link_swapped_in_after_judging_is_refused_naming_the_path(home: Path, swap: str) -> None:
    obj = _judged(home / "work/out", home)
    if swap == "the grant":
        (home / "work/out").rename(home / "work/out.old")
        (home / "work/out").symlink_to(home / ".ssh")
    else:
        (home / "work").rename(home / "work.old")
        (home / "work.old/out").rename(home / "work.old/was-out")
        os.symlink(home, home / "work")  # ~/work/out is now ~/out
        (home / "out").mkdir()
    with (
        _client(home / "work/out") as client,
        pytest.raises(LaunchRefused, match=r"~/work/out: it changed after it was judged"),
    ):  # follows the link, as a client would
        _bind(obj, client, home)


def test_the_same_name_holding_another_folder_is_refused(home: Path) -> None:
    obj = _judged(home / "work/out", home)
    (home / "work/out").rename(home / "work/out.old")
    (home / "work/out").mkdir()  # no link at all: only the identity tells
    with (
        _client(home / "work/out") as client,
        pytest.raises(LaunchRefused, match="changed after it was judged"),
    ):
        _bind(obj, client, home)


def test_a_client_descriptor_of_another_object_is_refused(home: Path) -> None:
    obj = _judged(home / "work/out", home)
    with (
        _client(home / ".ssh") as client,
        pytest.raises(LaunchRefused, match="changed after it was judged"),
    ):
        _bind(obj, client, home)


def test_unsafe_skip_binds_what_the_swapped_link_points_at(home: Path) -> None:
    """What the switch reopens: the leak the identity check closes."""
    obj = _judged(home / "work/out", home)
    (home / "work/out").rename(home / "work/out.old")
    (home / "work/out").symlink_to(home / ".ssh")
    with _client(home / "work/out") as client:
        opened = _bind(obj, client, home, unsafe=True)
        assert identity_of(opened[obj.real]) == identity_of(client)  # ~/.ssh
        os.close(opened[obj.real])


def test_an_object_without_a_judged_identity_is_refused(home: Path) -> None:
    with (
        _client(home / "work/out") as client,
        pytest.raises(LaunchRefused, match="changed after it was judged"),
    ):
        _bind(JudgedObject(str(home / "work/out"), None), client, home)


def test_a_grant_the_client_did_not_pass_is_refused(home: Path) -> None:
    obj = _judged(home / "work/out", home)
    with pytest.raises(LaunchRefused, match="did not pass it open"):
        open_judged([obj], {}, home=str(home))


def test_a_passed_descriptor_is_bound_itself_after_the_comparison(home: Path) -> None:
    resolved = resolve_path(str(home / "work/out"), base="/", home=str(home))
    fd = os.open(home / "work/out", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    other = os.open(home / ".ssh", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        opened = open_judged([JudgedObject(resolved.real, resolved.identity, fd)], {}, home="/")
        assert identity_of(opened[resolved.real]) == resolved.identity
        os.close(opened[resolved.real])
        with pytest.raises(LaunchRefused):
            open_judged([JudgedObject(resolved.real, resolved.identity, other)], {}, home="/")
    finally:
        os.close(fd)
        os.close(other)


@pytest.mark.parametrize("link_at", ["end", "middle"])
def test_open_no_links_refuses_a_link_anywhere_on_the_path(home: Path, link_at: str) -> None:
    (home / "alias").symlink_to("work")
    path = home / ("alias" if link_at == "end" else "alias/out")
    with pytest.raises(OSError) as caught:
        open_no_links(str(path))
    assert caught.value.errno == errno.ELOOP


def test_open_no_links_refuses_a_magic_link() -> None:
    with pytest.raises(OSError) as caught:
        open_no_links("/proc/self/cwd")
    assert caught.value.errno == errno.ELOOP


def test_one_path_judged_as_two_objects_is_refused(home: Path) -> None:
    first = resolve_path(str(home / "work/out"), base="/", home=str(home))
    (home / "work/out").rename(home / "work/out.old")
    (home / "work/out").mkdir()
    second = resolve_path(str(home / "work/out"), base="/", home=str(home))
    assert judged_identities([first], [first], str(home)) == {first.real: first.identity}
    with pytest.raises(LaunchRefused, match="~/work/out"):
        judged_identities([first], [second], str(home))


def test_the_spec_read_must_be_the_file_at_its_judged_path(home: Path) -> None:
    spec = home / "work/spec.toml"
    spec.write_text("")
    box = BoxPaths(home / "b/c", home / "b/s", home / "b/r")
    ctx = context_for(os.getuid(), env={}, box=box, spec_file=str(spec), home=str(home))
    fd = os.open(spec, os.O_RDONLY | os.O_CLOEXEC)
    try:
        same_spec(fd, ctx)
        spec.rename(home / "work/old.toml")
        spec.write_text("")  # another file under the name judged
        ctx = context_for(os.getuid(), env={}, box=box, spec_file=str(spec), home=str(home))
        with pytest.raises(LaunchRefused, match=r"~/work/spec.toml: it changed"):
            same_spec(fd, ctx)
    finally:
        os.close(fd)


def test_changed_names_the_path_as_the_owner_writes_it() -> None:
    assert changed("/home/o/work/out", "/home/o").entry == "~/work/out"
    assert changed("/home/other/x", "/home/o").entry == "/home/other/x"
    assert changed("/home/o", "/home/o").entry == "~"


def test_identity_is_device_inode_and_type(home: Path) -> None:
    fd = os.open(home / "work", os.O_PATH | os.O_CLOEXEC)
    try:
        info = os.stat(home / "work")
        assert identity_of(fd) == Identity(info.st_dev, info.st_ino, stat.S_IFDIR)
    finally:
        os.close(fd)
