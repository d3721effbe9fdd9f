"""Discovery on real files: links walked one component at a time, PATH looked up once."""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from lnk_shared import discovery
from lnk_shared.discovery import (
    DEFAULT_PATH,
    MAX_LINK_HOPS,
    JudgeContext,
    PathNotFound,
    context_for,
    resolve_path,
    resolve_spec,
)
from lnk_shared.errors import SpecError
from lnk_shared.grants import Identity, LinkHop
from lnk_shared.paths import BoxPaths
from lnk_shared.spec import Origin, Spec, SpecBuilder

OTHER_UID = 12345
ORIGIN = Origin("spec.toml", "k")


def make_ctx(tmp_path: Path) -> JudgeContext:
    box = BoxPaths(tmp_path / "box/config", tmp_path / "box/state", tmp_path / "box/run")
    env = {"PATH": "/usr/bin:/bin", "XDG_RUNTIME_DIR": str(tmp_path / "xdg")}
    return context_for(0, env=env, box=box, home=str(tmp_path / "home"))


def spec_of(*, read: Sequence[str] = (), commands: Sequence[str] = (), base: str = "/") -> Spec:
    builder = SpecBuilder(source="spec.toml")
    for text in read:
        builder.add_read(text, base, ORIGIN)
    for text in commands:
        builder.add_command(text, base, ORIGIN)
    return builder.build()


@pytest.fixture
def home(tmp_path: Path) -> Path:
    (tmp_path / "home").mkdir()
    return tmp_path / "home"


def test_plain_folder_resolves_to_itself(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    resolved = resolve_path(str(tmp_path / "data"), base="/", home="/nonexistent")
    assert resolved.real == str(tmp_path / "data")
    assert resolved.links == ()
    assert resolved.is_dir
    assert not resolved.is_socket


def test_link_hop_is_recorded_with_its_owner_uid(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    link = tmp_path / "link"
    link.symlink_to("data")
    os.lchown(link, OTHER_UID, OTHER_UID)
    resolved = resolve_path(str(link), base="/", home="/nonexistent")
    assert resolved.real == str(tmp_path / "data")
    assert resolved.links == (LinkHop(str(link), "data", OTHER_UID),)


def test_every_hop_of_a_chain_is_recorded_in_order(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "c").symlink_to(tmp_path / "real")
    (tmp_path / "b").symlink_to("c")
    (tmp_path / "a").symlink_to("b")
    resolved = resolve_path("a/", base=str(tmp_path), home="/nonexistent")
    assert resolved.real == str(tmp_path / "real")
    assert [(h.link, h.target) for h in resolved.links] == [
        (str(tmp_path / "a"), "b"),
        (str(tmp_path / "b"), "c"),
        (str(tmp_path / "c"), str(tmp_path / "real")),
    ]
    assert {h.owner_uid for h in resolved.links} == {os.getuid()}


def test_link_in_the_middle_of_a_path_is_recorded(tmp_path: Path) -> None:
    (tmp_path / "real/sub").mkdir(parents=True)
    (tmp_path / "mid").symlink_to("real")
    resolved = resolve_path(str(tmp_path / "mid/sub"), base="/", home="/nonexistent")
    assert resolved.real == str(tmp_path / "real/sub")
    assert [h.link for h in resolved.links] == [str(tmp_path / "mid")]


def test_dot_dot_after_a_link_is_resolved_physically(tmp_path: Path) -> None:
    (tmp_path / "deep/inner").mkdir(parents=True)
    (tmp_path / "deep/secret").mkdir()
    (tmp_path / "secret").mkdir()  # where a lexical `..` would land
    (tmp_path / "link").symlink_to(tmp_path / "deep/inner")
    resolved = resolve_path("link/../secret", base=str(tmp_path), home="/nonexistent")
    assert resolved.real == str(tmp_path / "deep/secret")
    assert os.path.realpath(tmp_path / "link/../secret") == resolved.real


def test_dot_dot_in_a_link_target_is_resolved_from_the_link_folder(tmp_path: Path) -> None:
    (tmp_path / "a/b").mkdir(parents=True)
    (tmp_path / "target").mkdir()
    (tmp_path / "a/b/up").symlink_to("../../target")
    resolved = resolve_path(str(tmp_path / "a/b/up"), base="/", home="/nonexistent")
    assert resolved.real == str(tmp_path / "target")


@pytest.mark.parametrize("written", ["~", "~/", "~/proj", "~/proj/../proj"])
def test_tilde_is_the_given_home_not_dollar_home(
    home: Path, written: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    (home / "proj").mkdir()
    monkeypatch.setenv("HOME", "/nonexistent")
    resolved = resolve_path(written, base="/", home=str(home))
    expected = home if written in ("~", "~/") else home / "proj"
    assert resolved.real == str(expected)
    assert resolved.written == written


def test_relative_path_is_read_against_its_base(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    assert resolve_path("d", base=str(tmp_path), home="/x").real == str(tmp_path / "d")


def test_file_and_socket_are_told_apart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "f").write_text("x")
    monkeypatch.chdir(tmp_path)
    with socket.socket(socket.AF_UNIX) as server:
        server.bind("s.sock")
        sock = resolve_path("s.sock", base=str(tmp_path), home="/x")
    regular = resolve_path("f", base=str(tmp_path), home="/x")
    assert sock.is_socket and not sock.is_dir
    assert not regular.is_socket and not regular.is_dir


@pytest.fixture
def loops(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "self").symlink_to("self")
    (tmp_path / "ping").symlink_to("pong")
    (tmp_path / "pong").symlink_to("ping")
    (tmp_path / "up").symlink_to("up/..")
    yield tmp_path


@pytest.mark.parametrize("name", ["self", "ping", "pong", "up", "ping/x"])
def test_link_loop_is_path_not_found(loops: Path, name: str) -> None:
    with pytest.raises(PathNotFound, match="too many links"):
        resolve_path(name, base=str(loops), home="/x")


def test_link_chain_at_the_kernel_limit_resolves_and_one_more_does_not(tmp_path: Path) -> None:
    (tmp_path / "end").mkdir()
    previous = "end"
    for i in range(MAX_LINK_HOPS + 1):
        (tmp_path / f"l{i}").symlink_to(previous)
        previous = f"l{i}"
    at_limit = resolve_path(f"l{MAX_LINK_HOPS - 1}", base=str(tmp_path), home="/x")
    assert len(at_limit.links) == MAX_LINK_HOPS
    with pytest.raises(PathNotFound, match="too many links"):
        resolve_path(f"l{MAX_LINK_HOPS}", base=str(tmp_path), home="/x")


def test_link_loop_in_a_spec_is_a_clear_spec_error(loops: Path, home: Path) -> None:
    spec = spec_of(read=[str(loops / "ping")])
    with pytest.raises(SpecError, match="too many links") as caught:
        resolve_spec(spec, make_ctx(loops))
    assert caught.value.key == "folders.read"
    assert str(loops / "ping") in str(caught.value)


@pytest.mark.parametrize(
    "name", ["absent", "absent/deeper", "file/inside", "dangling", "dangling/x", "a" * 300]
)
def test_missing_path_is_a_spec_error(tmp_path: Path, home: Path, name: str) -> None:
    (tmp_path / "file").write_text("x")
    (tmp_path / "dangling").symlink_to("nowhere")
    spec = spec_of(read=[name], base=str(tmp_path))
    with pytest.raises(SpecError, match="cannot be granted") as caught:
        resolve_spec(spec, make_ctx(tmp_path))
    assert caught.value.key == "folders.read"
    assert repr(name) in str(caught.value)


def test_link_to_a_name_too_long_is_a_spec_error(tmp_path: Path, home: Path) -> None:
    (tmp_path / "long").symlink_to("x" * 300)
    spec = spec_of(read=[str(tmp_path / "long")])
    with pytest.raises(SpecError, match="cannot be granted"):
        resolve_spec(spec, make_ctx(tmp_path))


@pytest.fixture
def path_dirs(tmp_path: Path) -> Path:
    """bin/tool -> ../real/tool-1.2 (executable); other/tool not executable."""
    (tmp_path / "real").mkdir()
    tool = tmp_path / "real/tool-1.2"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin/tool").symlink_to("../real/tool-1.2")
    (tmp_path / "other").mkdir()
    (tmp_path / "other/tool").write_text("not a program")
    return tmp_path


def test_path_lookup_grants_the_real_executable(path_dirs: Path, home: Path) -> None:
    path_env = f"{path_dirs / 'other'}:{path_dirs / 'bin'}"
    resolved = resolve_spec(spec_of(commands=["tool"]), make_ctx(path_dirs), path_env=path_env)
    (command,) = resolved.commands
    assert command.real == str(path_dirs / "real/tool-1.2")
    assert command.written == "tool"
    assert [h.link for h in command.links] == [str(path_dirs / "bin/tool")]
    assert not command.is_dir


def test_path_lookup_skips_relative_path_entries(
    path_dirs: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(path_dirs)
    with pytest.raises(SpecError, match="not a program found on PATH"):
        resolve_spec(spec_of(commands=["tool"]), make_ctx(path_dirs), path_env="bin:other")


def test_real_system_program_is_found_on_path(tmp_path: Path, home: Path) -> None:
    resolved = resolve_spec(spec_of(commands=["python3"]), make_ctx(tmp_path))
    (command,) = resolved.commands
    assert command.real == os.path.realpath("/usr/bin/python3")
    assert os.access(command.real, os.X_OK)


@pytest.mark.parametrize(
    ("command", "why"),
    [
        ("no-such-program-lnk", "not a program found on PATH"),
        ("/no/such/program", "no such program"),
        ("plain.txt", "not an executable file or a folder"),
    ],
)
def test_bad_command_is_a_spec_error(tmp_path: Path, home: Path, command: str, why: str) -> None:
    (tmp_path / "plain.txt").write_text("x")
    (tmp_path / "plain.txt").chmod(0o644)
    spec = spec_of(commands=[command if "/" in command else f"./{command}"], base=str(tmp_path))
    if command.startswith("no-such"):
        spec = spec_of(commands=[command])
    with pytest.raises(SpecError, match=why) as caught:
        resolve_spec(spec, make_ctx(tmp_path))
    assert caught.value.key == "commands.allow"


def test_command_folder_is_granted_as_a_folder(tmp_path: Path, home: Path) -> None:
    resolved = resolve_spec(spec_of(commands=["/usr/bin"]), make_ctx(tmp_path))
    assert resolved.commands[0].is_dir


def test_commands_star_resolves_no_program(tmp_path: Path, home: Path) -> None:
    resolved = resolve_spec(spec_of(commands=["*", "no-such-program-lnk"]), make_ctx(tmp_path))
    assert resolved.commands_any
    assert resolved.commands == ()


def test_with_fd_resolves_the_open_folder(tmp_path: Path, home: Path) -> None:
    (tmp_path / "passed").mkdir()
    fd = os.open(tmp_path / "passed", os.O_RDONLY | os.O_DIRECTORY)
    try:
        builder = SpecBuilder()
        builder.add_fd(f"{fd}:write", ORIGIN)
        (grant,) = resolve_spec(builder.build(), make_ctx(tmp_path)).with_fds
    finally:
        os.close(fd)
    assert grant.fd == fd
    assert grant.write
    assert grant.path.real == str(tmp_path / "passed")


def test_with_fd_of_a_file_is_a_spec_error(tmp_path: Path, home: Path) -> None:
    (tmp_path / "f").write_text("x")
    fd = os.open(tmp_path / "f", os.O_RDONLY)
    try:
        builder = SpecBuilder()
        builder.add_fd(f"{fd}:read", ORIGIN)
        with pytest.raises(SpecError, match="not a folder"):
            resolve_spec(builder.build(), make_ctx(tmp_path))
    finally:
        os.close(fd)


def test_with_fd_that_is_not_open_is_a_spec_error(tmp_path: Path, home: Path) -> None:
    builder = SpecBuilder()
    builder.add_fd(f"{(1 << 20) - 1}:read", ORIGIN)
    with pytest.raises(SpecError, match="is not open"):
        resolve_spec(builder.build(), make_ctx(tmp_path))


def test_context_resolves_every_protected_path(tmp_path: Path, home: Path) -> None:
    (tmp_path / "realhome").mkdir()
    (tmp_path / "linkhome").symlink_to("realhome")
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs/s.toml").write_text("")
    (tmp_path / "speclink.toml").symlink_to("specs/s.toml")
    box = BoxPaths(tmp_path / "c", tmp_path / "s", tmp_path / "r")
    env = {"PATH": f"{tmp_path / 'linkhome'}/bin::relative", "XDG_RUNTIME_DIR": "/run/user/77"}
    ctx = context_for(
        77, env=env, box=box, home=str(tmp_path / "linkhome"),
        spec_file=str(tmp_path / "speclink.toml"),
    )  # fmt: skip
    real_home = str(tmp_path / "realhome")
    assert ctx.owner_uid == 77
    assert ctx.home == real_home
    assert ctx.user_settings == f"{real_home}/.lnk"
    assert ctx.agent_folders == (f"{real_home}/Link/Agents", f"{real_home}/Link/History")
    assert ctx.box_dirs == (str(tmp_path / "c"), str(tmp_path / "s"), str(tmp_path / "r"))
    assert f"{real_home}/bin" in ctx.path_dirs
    assert "/usr/bin" in ctx.path_dirs  # the default PATH is always protected too
    assert all(d.startswith("/") for d in ctx.path_dirs)
    assert "/run" in ctx.socket_dirs
    assert "/run/user/77" in ctx.socket_dirs
    assert ctx.spec_file == str(tmp_path / "specs/s.toml")


def test_context_without_runtime_dir_protects_the_usual_one(tmp_path: Path) -> None:
    box = BoxPaths(tmp_path / "c", tmp_path / "s", tmp_path / "r")
    ctx = context_for(4242, env={}, box=box, home=str(tmp_path))
    assert "/run/user/4242" in ctx.socket_dirs
    assert "/usr/local/bin" in ctx.path_dirs


def test_context_home_comes_from_the_password_database(tmp_path: Path) -> None:
    box = BoxPaths(tmp_path / "c", tmp_path / "s", tmp_path / "r")
    assert context_for(0, env={}, box=box).home == os.path.realpath("/root")


def test_context_for_an_unknown_uid_is_a_spec_error(tmp_path: Path) -> None:
    box = BoxPaths(tmp_path / "c", tmp_path / "s", tmp_path / "r")
    with pytest.raises(SpecError, match="no entry in the password database"):
        context_for(3_999_999_999, env={}, box=box)


def test_the_walk_records_the_identity_of_the_object_it_reached(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "alias").symlink_to("real")
    resolved = resolve_path("alias", base=str(tmp_path), home="/x")
    info = os.stat(tmp_path / "real")
    assert resolved.identity == Identity(info.st_dev, info.st_ino, stat.S_IFDIR)
    assert resolved.real == str(tmp_path / "real")


def test_identity_is_not_part_of_what_is_approved(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    before = resolve_path("d", base=str(tmp_path), home="/x")
    (tmp_path / "other").mkdir()  # made while d exists: another inode
    (tmp_path / "d").rmdir()
    (tmp_path / "other").rename(tmp_path / "d")
    after = resolve_path("d", base=str(tmp_path), home="/x")
    assert before.identity != after.identity
    assert before == after  # the same place: asked again only when the place changes


def test_a_proc_folder_of_the_viewers_own_process_is_walked() -> None:
    resolved = resolve_path(f"/proc/{os.getpid()}/cwd", base="/", home="/x")
    assert resolved.real == os.path.realpath(os.getcwd())


def test_a_context_walks_each_folder_once_and_answers_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default PATH given as the caller's, and named again by the system's profiles: one
    walk each, with the very answers a walk per mention gave."""
    box = BoxPaths(tmp_path / "c", tmp_path / "s", tmp_path / "r")
    (tmp_path / ".profile").write_text(f"PATH=/usr/bin:/bin:$HOME/bin:{tmp_path}/bin\n")
    walked: list[str] = []
    walk = discovery._walk

    def counted(path: str, *, must_exist: bool, identify: bool = True) -> discovery.Walk:
        walked.append(path)
        return walk(path, must_exist=must_exist, identify=identify)

    monkeypatch.setattr(discovery, "_walk", counted)
    ctx = context_for(os.getuid(), env={"PATH": DEFAULT_PATH}, box=box, home=str(tmp_path))
    assert len(walked) == len(set(walked))
    assert "/usr/bin" in walked and f"{tmp_path}/bin" in walked
    assert ctx.path_dirs == tuple(
        dict.fromkeys(discovery.real_or_planned(d) for d in DEFAULT_PATH.split(":"))
    )
    assert os.path.realpath("/usr/bin") in ctx.login_path_dirs
    assert f"{tmp_path}/bin" in ctx.login_path_dirs


def test_a_walk_without_identities_ends_where_the_full_walk_does(tmp_path: Path) -> None:
    (tmp_path / "real" / "sub").mkdir(parents=True)
    (tmp_path / "link").symlink_to("real")
    for written in ("link/sub", "link/sub/missing/deeper", "real", "/"):
        path = os.path.join(tmp_path, written) if written != "/" else "/"
        full = discovery._walk(path, must_exist=False)
        bare = discovery._walk(path, must_exist=False, identify=False)
        assert (bare.real, bare.links, bare.exists, bare.mode) == (
            full.real, full.links, full.exists, full.mode,
        )  # fmt: skip
        assert bare.identity is None and bare.folders == ()


def test_a_name_found_through_a_link_records_where_and_who_may_change_it(
    path_dirs: Path, home: Path
) -> None:
    os.lchown(path_dirs / "bin/tool", OTHER_UID, OTHER_UID)
    os.chmod(path_dirs / "bin", 0o775)
    resolved = resolve_spec(
        spec_of(commands=["tool"]), make_ctx(path_dirs), path_env=str(path_dirs / "bin")
    )
    (command,) = resolved.commands
    assert command.found_on_path == str(path_dirs / "bin/tool")
    (link,) = command.links
    assert link.owner_uid == OTHER_UID
    assert link.folders[0].path == "/"
    assert (link.folders[-1].path, link.folders[-1].mode) == (str(path_dirs / "bin"), 0o775)
    assert [h.path for h in command.holders][-2:] == [str(path_dirs / "real"), command.real]
    assert command.holders[-1].mode == 0o755


def test_a_path_written_is_not_marked_found_on_path(path_dirs: Path, home: Path) -> None:
    resolved = resolve_spec(spec_of(commands=[str(path_dirs / "bin/tool")]), make_ctx(path_dirs))
    assert resolved.commands[0].found_on_path is None


def test_a_name_found_as_a_loop_of_links_says_so(tmp_path: Path, home: Path) -> None:
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin/tool").symlink_to("tool2")
    (tmp_path / "bin/tool2").symlink_to("tool")
    with pytest.raises(SpecError, match="a loop of links") as caught:
        resolve_spec(spec_of(commands=["tool"]), make_ctx(tmp_path), path_env=str(tmp_path / "bin"))
    assert caught.value.key == "commands.allow"
