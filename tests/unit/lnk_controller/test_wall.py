"""The wall: bwrap's command line as a pure function of the layout. Each test parses the argv the
way bwrap does (by each option's arity), so a value that looks like an option stays a value and
an option this file does not know fails every test until someone decides it is safe."""

from __future__ import annotations

import dataclasses
import pwd
import socket
from typing import Any

import pytest

from lnk_controller.wall import (
    BOOT_ID_PATH,
    ETC_FILES,
    SANDBOX_HOSTNAME,
    Bind,
    SandboxLayout,
    bwrap_argv,
    sandbox_hosts,
    sandbox_passwd,
)

# bwrap's options that the wall may use, with how many arguments each takes.
ARITY = {
    "--unshare-all": 0,
    "--unshare-user": 0,
    "--share-net": 0,
    "--die-with-parent": 0,
    "--disable-userns": 0,
    "--new-session": 0,
    "--clearenv": 0,
    "--hostname": 1,
    "--setenv": 2,
    "--uid": 1,
    "--gid": 1,
    "--symlink": 2,
    "--bind": 2,
    "--ro-bind": 2,
    "--perms": 1,
    "--size": 1,
    "--file": 2,
    "--ro-bind-data": 2,
    "--proc": 1,
    "--dev": 1,
    "--tmpfs": 1,
    "--remount-ro": 1,
    "--json-status-fd": 1,
    "--chdir": 1,
}
# What puts something in the sandbox's root: all of it must come before `--remount-ro /`.
MOUNTS = {
    "--bind",
    "--ro-bind",
    "--ro-bind-data",
    "--tmpfs",
    "--file",
    "--symlink",
    "--proc",
    "--dev",
}

Op = tuple[str, tuple[str, ...]]


def parse(argv: list[str]) -> tuple[list[Op], list[str]]:
    """(options with their arguments, the command after `--`), as bwrap reads them."""
    assert argv[0] == "/usr/bin/bwrap"
    ops: list[Op] = []
    i = 1
    while argv[i] != "--":
        option = argv[i]
        assert option in ARITY, f"the wall uses {option}, which this test does not know"
        n = ARITY[option]
        ops.append((option, tuple(argv[i + 1 : i + 1 + n])))
        i += 1 + n
    return ops, argv[i + 1 :]


def layout(**changes: Any) -> SandboxLayout:
    base = SandboxLayout(
        uid=2_000_000_005,
        gid=2_000_000_005,
        user_name="lnk-sbx-2000000005",
        home=Bind("/run/lnk/sandboxes/sbx-1/home", "/home/lnk-sbx-2000000005", write=True),
        prefix="/opt/lnk",
        command=("/usr/bin/python3", "-c", "print(1)"),
        cwd="/home/owner/project",
        env={"TERM": "xterm-256color"},
        terminal=False,
        system_links={"/bin": "usr/bin", "/lib": "usr/lib"},
        system_dirs=("/usr",),
        etc_binds=("/etc/ssl",),
        etc_copies=((10, "/etc/hosts"), (12, "/etc/ld.so.cache")),
        passwd_fd=7,
        group_fd=8,
        policy_fd=9,
    )
    return dataclasses.replace(base, **changes)


def ops_of(lay: SandboxLayout) -> list[Op]:
    return parse(bwrap_argv(lay))[0]


def options(lay: SandboxLayout) -> list[str]:
    return [option for option, _ in ops_of(lay)]


def index_of(ops: list[Op], option: str, *args: str) -> int:
    return ops.index((option, args))


EVERY_CASE = [
    pytest.param({"terminal": t, "network_host": n}, id=f"terminal={t}-network_host={n}")
    for t in (False, True)
    for n in (False, True)
]


@pytest.mark.parametrize("changes", EVERY_CASE)
@pytest.mark.parametrize(
    "option",
    ["--unshare-all", "--unshare-user", "--die-with-parent", "--disable-userns", "--clearenv"],
)
def test_isolating_options_are_always_there(changes: dict[str, Any], option: str) -> None:
    assert options(layout(**changes)).count(option) == 1


@pytest.mark.parametrize(("network_host", "shared"), [(False, False), (True, True)])
def test_network_is_shared_only_in_host_mode(network_host: bool, shared: bool) -> None:
    assert ("--share-net" in options(layout(network_host=network_host))) is shared


@pytest.mark.parametrize(("terminal", "new_session"), [(False, True), (True, False)])
def test_tiocsti_without_a_terminal_is_stopped_by_a_new_session(
    terminal: bool, new_session: bool
) -> None:
    assert ("--new-session" in options(layout(terminal=terminal))) is new_session


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"TERM": "dumb"},
        {"TERM": "xterm", "LANG": "C.UTF-8", "LC_ALL": "en_US.UTF-8"},
        {"LANG": "--bind", "TERM": "/ /"},  # values that look like options stay values
    ],
)
def test_environment_is_exactly_the_given_keys_after_clearenv(env: dict[str, str]) -> None:
    ops = ops_of(layout(env=env))
    set_env = [(args[0], args[1]) for option, args in ops if option == "--setenv"]
    assert dict(set_env) == env
    assert len(set_env) == len(env)
    clear = index_of(ops, "--clearenv")
    assert all(ops.index(("--setenv", pair)) > clear for pair in set_env)


def test_ids_inside_are_the_sandbox_users() -> None:
    ops = ops_of(layout())
    assert ("--uid", ("2000000005",)) in ops
    assert ("--gid", ("2000000005",)) in ops


GRANTS = (
    Bind("/run/lnk/sandboxes/sbx-1/g0", "/home/owner/project", write=True),
    Bind("/run/lnk/sandboxes/sbx-1/g1", "/srv/data", write=False),
)


@pytest.mark.parametrize(("bind", "option"), [(GRANTS[0], "--bind"), (GRANTS[1], "--ro-bind")])
def test_write_grants_are_read_write_and_read_grants_read_only(bind: Bind, option: str) -> None:
    ops = ops_of(layout(binds=GRANTS))
    mounts_of_dest = [(o, a) for o, a in ops if o in ("--bind", "--ro-bind") and a[1] == bind.dest]
    assert mounts_of_dest == [(option, (bind.source, bind.dest))]


@pytest.mark.parametrize(
    "dests",
    [
        # A read grant inside a write grant: if mounted first, the write grant covers it.
        ["/home/owner/project/vendor", "/home/owner/project"],
        ["/a/b/c/d", "/a/b", "/a/b/c", "/a"],
        ["/home/owner/p/x", "/home/owner/p", "/home/owner/p-other/y", "/home/owner/p-other"],
    ],
)
def test_a_grant_inside_another_is_mounted_after_it(dests: list[str]) -> None:
    binds = tuple(
        Bind(f"/run/lnk/sandboxes/sbx-1/g{n}", dest, write=n % 2 == 1)
        for n, dest in enumerate(dests)
    )
    order = [a[1] for o, a in ops_of(layout(binds=binds)) if o in ("--bind", "--ro-bind")]
    for outer in dests:
        for inner in dests:
            if inner.startswith(outer + "/"):
                assert order.index(outer) < order.index(inner), (outer, inner)


@pytest.mark.parametrize(
    "hidden",
    [
        ("/home/owner/project/.lnk",),
        ("/home/owner/project/.lnk", "/home/owner/project/Link/Agents"),
    ],
)
def test_each_hidden_path_is_covered_by_an_empty_locked_tmpfs(hidden: tuple[str, ...]) -> None:
    ops = ops_of(layout(binds=GRANTS, hidden=hidden))
    last_grant = max(i for i, (o, _) in enumerate(ops) if o in ("--bind", "--ro-bind"))
    for path in hidden:
        at = index_of(ops, "--tmpfs", path)
        assert ops[at - 1] == ("--perms", ("0000",))
        assert ops[at + 1] == ("--remount-ro", (path,))
        assert at > last_grant, "a grant mounted later would uncover the hidden path"


def test_read_only_entries_inside_a_write_grant_come_after_it() -> None:
    read_only = (
        Bind("/run/lnk/sandboxes/sbx-1/g0/.git/hooks", "/home/owner/project/.git/hooks"),
        Bind("/run/lnk/sandboxes/sbx-1/g0/.envrc", "/home/owner/project/.envrc"),
    )
    ops = ops_of(layout(binds=GRANTS, read_only_inside=read_only))
    last_write = max(i for i, (o, _) in enumerate(ops) if o == "--bind")
    for bind in read_only:
        assert index_of(ops, "--ro-bind", bind.source, bind.dest) > last_write
    dests = {a[1] for o, a in ops if o == "--bind"}
    assert not dests & {b.dest for b in read_only}, "read-only entries must never be rw-bound"


def test_root_is_remounted_read_only_after_every_mount() -> None:
    ops = ops_of(layout(binds=GRANTS, hidden=("/home/owner/project/.lnk",)))
    remount_root = index_of(ops, "--remount-ro", "/")
    assert remount_root > max(i for i, (o, _) in enumerate(ops) if o in MOUNTS)


@pytest.mark.parametrize(
    ("fd_field", "fd", "dest"),
    [
        ("passwd_fd", 7, "/etc/passwd"),
        ("group_fd", 8, "/etc/group"),
        ("policy_fd", 9, "/run/lnk-confiner/policy"),
    ],
)
def test_generated_files_come_from_descriptors_not_the_host(
    fd_field: str, fd: int, dest: str
) -> None:
    ops = ops_of(layout(**{fd_field: fd}))
    at = index_of(ops, "--file", str(fd), dest)
    assert ops[at - 1] == ("--perms", ("0444",) if fd_field == "policy_fd" else ("0644",))
    others = [(o, a) for o, a in ops if o != "--file" and a and a[-1] == dest]
    assert others == [], f"{dest} is also mounted from elsewhere"


ETC_COPIES = ((10, "/etc/hosts"), (12, "/etc/ld.so.cache"), (13, "/etc/localtime"))


def test_etc_copies_are_files_from_their_descriptors_read_only_at_the_end() -> None:
    ops = ops_of(layout(etc_copies=ETC_COPIES))
    remount_root = index_of(ops, "--remount-ro", "/")
    for fd, path in ETC_COPIES:
        at = index_of(ops, "--file", str(fd), path)
        assert ops[at - 1] == ("--perms", ("0644",)), "a copy must not be writable or executable"
        assert at < remount_root, "a copy after the remount would stay writable"
        assert [a for o, a in ops if a and a[-1] == path] == [(str(fd), path)]


def test_etc_directories_are_bound_read_only_and_never_copied() -> None:
    ops = ops_of(layout(etc_binds=("/etc/ssl", "/etc/terminfo"), etc_copies=ETC_COPIES))
    for path in ("/etc/ssl", "/etc/terminfo"):
        assert [(o, a) for o, a in ops if a and a[-1] == path] == [("--ro-bind", (path, path))]
    assert not [a for o, a in ops if o == "--bind" and a[1].startswith("/etc")]


def test_etc_has_only_the_given_entries() -> None:
    ops = ops_of(layout(etc_binds=("/etc/ssl",), etc_copies=ETC_COPIES))
    in_etc = {a[-1] for o, a in ops if o != "--setenv" and a and a[-1].startswith("/etc/")}
    assert in_etc == {"/etc/ssl", "/etc/passwd", "/etc/group", *(p for _, p in ETC_COPIES)}
    assert ("--ro-bind", ("/etc", "/etc")) not in ops


def test_layout_without_etc_entries_has_only_the_generated_ones() -> None:
    ops = ops_of(layout(etc_binds=(), etc_copies=()))
    in_etc = {a[-1] for o, a in ops if o != "--setenv" and a and a[-1].startswith("/etc/")}
    assert in_etc == {"/etc/passwd", "/etc/group"}


def test_host_user_files_are_not_among_the_etc_files() -> None:
    secrets = {"/etc/passwd", "/etc/group", "/etc/shadow", "/etc/gshadow", "/etc/sudoers"}
    assert not secrets & set(ETC_FILES)
    assert not [p for p in ETC_FILES if p.startswith(("/etc/ssh", "/etc/lnk", "/etc/sudoers"))]


@pytest.mark.parametrize(
    "command",
    [
        ("/usr/bin/true",),
        ("/bin/sh", "-c", "echo hi"),
        ("--bind", "/", "/host"),  # an argument that looks like an option stays the program's
        ("/usr/bin/env", "--", "--ro-bind"),
    ],
)
def test_command_follows_the_double_dash(command: tuple[str, ...]) -> None:
    ops, after = parse(bwrap_argv(layout(command=command)))
    assert tuple(after) == command
    assert ("--bind", ("/", "/host")) not in ops


def test_status_descriptor_only_when_given() -> None:
    assert "--json-status-fd" not in options(layout(status_fd=-1))
    assert ("--json-status-fd", ("11",)) in ops_of(layout(status_fd=11))


def test_cwd_is_the_last_option() -> None:
    assert ops_of(layout(cwd="/home/owner/project/src"))[-1] == (
        "--chdir",
        ("/home/owner/project/src",),
    )


def _names(table: str) -> list[str]:
    return [line.split(":")[0] for line in table.splitlines()]


def test_sandbox_passwd_names_only_root_the_sandbox_user_and_nobody() -> None:
    passwd, group = sandbox_passwd("lnk-sbx-2000000005", 2_000_000_005, 2_000_000_005, "/home/x")
    assert _names(passwd) == ["root", "lnk-sbx-2000000005", "nobody"]
    assert _names(group) == ["root", "lnk-sbx-2000000005", "nogroup"]
    assert "lnk-sbx-2000000005:x:2000000005:2000000005:" in passwd
    assert "/home/x" in passwd


def test_sandbox_passwd_leaks_no_host_user() -> None:
    passwd, group = sandbox_passwd("lnk-sbx-2000000005", 2_000_000_005, 2_000_000_005, "/home/x")
    host = {p.pw_name for p in pwd.getpwall()} - {"root", "nobody", "lnk-sbx-2000000005"}
    assert not host & set(_names(passwd))
    assert not host & set(_names(group))


# -- what the sandbox learns of the host ------------------------------------------------------


def test_nothing_naming_or_identifying_the_host_is_among_the_etc_files() -> None:
    identifying = {"/etc/hosts", "/etc/hostname", "/etc/machine-id", "/etc/mailname"}
    assert not identifying & set(ETC_FILES)
    assert not [p for p in ETC_FILES if p.startswith(("/var", "/etc/dbus"))]


def test_the_sandbox_gets_its_own_hosts_file_from_a_descriptor() -> None:
    ops = ops_of(layout(etc_copies=((12, "/etc/ld.so.cache"),), hosts_fd=14))
    at = index_of(ops, "--file", "14", "/etc/hosts")
    assert ops[at - 1] == ("--perms", ("0644",))
    assert at < index_of(ops, "--remount-ro", "/")
    assert [a for o, a in ops if a and a[-1] == "/etc/hosts"] == [("14", "/etc/hosts")]


def test_its_own_boot_id_covers_the_fresh_procs() -> None:
    ops = ops_of(layout(boot_id_fd=15))
    at = index_of(ops, "--ro-bind-data", "15", BOOT_ID_PATH)
    assert index_of(ops, "--proc", "/proc") < at, "a /proc mounted after would cover it"


def test_no_hosts_file_or_boot_id_unless_given() -> None:
    ops = ops_of(layout(etc_copies=()))
    assert "--ro-bind-data" not in [o for o, _ in ops]
    assert not [a for o, a in ops if a and a[-1] == "/etc/hosts"]


def test_sandbox_hosts_names_only_loopback_and_the_sandbox() -> None:
    text = sandbox_hosts()
    names = {n for line in text.splitlines() for n in line.split()[1:]}
    assert names == {"localhost", "ip6-localhost", "ip6-loopback", SANDBOX_HOSTNAME}
    assert socket.gethostname() not in names
    addresses = {line.split()[0] for line in text.splitlines()}
    assert addresses == {"127.0.0.1", "127.0.1.1", "::1"}


@pytest.mark.parametrize(
    "shm",
    [None, Bind("/run/lnk/sandboxes/sbx-1/shm", "/dev/shm", write=True)],
    ids=["tmpfs", "bind"],
)
def test_dev_is_remounted_read_only_after_its_shm_is_mounted(shm: Bind | None) -> None:
    ops = ops_of(layout(shm=shm, binds=GRANTS))
    remount_dev = index_of(ops, "--remount-ro", "/dev")
    inside_dev = [i for i, (o, a) in enumerate(ops) if o in MOUNTS and a[-1].startswith("/dev")]
    assert remount_dev > max(inside_dev), "a mount made in /dev after the remount would fail"
    assert index_of(ops, "--dev", "/dev") < remount_dev


def test_the_writable_dev_switch_leaves_dev_writable() -> None:
    assert ("--remount-ro", ("/dev",)) not in ops_of(layout(unsafe_writable_dev=True))


def test_usr_is_bound_from_its_staged_noexec_view_never_from_the_host() -> None:
    ops = ops_of(layout(system_dirs=("/usr",), system_sources={"/usr": "/run/lnk/sandboxes/x/usr"}))
    index_of(ops, "--ro-bind", "/run/lnk/sandboxes/x/usr", "/usr")
    assert ("--ro-bind", ("/usr", "/usr")) not in ops  # never the host's exec-capable /usr


def test_without_a_clone_usr_is_bound_as_it_is() -> None:
    ops = ops_of(layout(system_dirs=("/usr",)))
    index_of(ops, "--ro-bind", "/usr", "/usr")
