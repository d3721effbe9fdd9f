"""bwrap's options leave its command line (`bwrap --args FD`): what `ps` shows every local user
of the chain is the launcher's flags, `bwrap --args N --` and the command, never a staging path,
an owner's folder or an environment value."""

from __future__ import annotations

import dataclasses
import os
import subprocess

import pytest

from lnk_controller.spawn import held_confiner_command, split_bwrap_argv, split_confiner_command
from lnk_controller.wall import ARGV_PATH, Bind, SandboxLayout, bwrap_argv
from lnk_shared.errors import LaunchRefused

COMMAND = ("/opt/lnk/venv/bin/lnk-sandbox", "--", "/bin/cat", "notes.txt")


def layout(**changes: object) -> SandboxLayout:
    base = SandboxLayout(
        uid=2_000_000_005,
        gid=2_000_000_005,
        user_name="lnk-sbx-2000000005",
        home=Bind("/run/lnk/sandboxes/sbx-1/home", "/home/lnk-sbx-2000000005", write=True),
        prefix="/opt/lnk",
        command=COMMAND,
        cwd="/home/owner/secret-project",
        env={"API_TOKEN": "--", "OTHER": "x"},
        terminal=False,
        binds=(Bind("/run/lnk/sandboxes/sbx-1/g0", "/home/owner/secret-project", True),),
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def test_options_leave_the_command_line_and_the_command_stays() -> None:
    argv = bwrap_argv(layout())
    head, data = split_bwrap_argv(argv, COMMAND)
    assert head == ["/usr/bin/bwrap", "--args"]
    options = data.split(b"\0")
    assert options.pop() == b""  # each option ends in a NUL
    assert [o.decode() for o in options] == argv[1 : len(argv) - len(COMMAND) - 1]
    assert b"/home/owner/secret-project" in data and b"sbx-1/g0" in data
    assert b"API_TOKEN" in data


def test_an_environment_value_of_dashes_does_not_cut_the_options_short() -> None:
    argv = bwrap_argv(layout(env={"A": "--", "B": "--"}))
    _, data = split_bwrap_argv(argv, COMMAND)
    # Everything up to the command's own "--" went in: the last option is the working folder.
    assert data.endswith(b"--chdir\0/home/owner/secret-project\0")


def test_an_argv_that_does_not_end_in_the_command_is_refused() -> None:
    with pytest.raises(LaunchRefused, match="does not end in its command"):
        split_bwrap_argv(["/usr/bin/bwrap", "--unshare-all", "--", "/bin/true"], COMMAND)


def test_real_bwrap_reads_the_options_and_shows_none_of_them() -> None:
    """The split argv run by the real bwrap: the options take effect (a bind, an environment
    value) and its /proc/PID/cmdline, as another user reads it, holds none of them."""
    options = ["--ro-bind", "/", "/", "--dev", "/dev", "--setenv", "SECRET_VALUE", "s3cr3t"]
    argv = [
        "/usr/bin/bwrap",
        *options,
        "--",
        "/bin/sh",
        "-c",
        "echo $SECRET_VALUE; cat /proc/$PPID/cmdline",
    ]
    head, data = split_bwrap_argv(argv, tuple(argv[len(options) + 2 :]))
    fd = os.memfd_create("args")
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    try:
        done = subprocess.run(
            [*head, str(fd), "--", *argv[len(options) + 2 :]],
            pass_fds=(fd,),
            capture_output=True,
            timeout=30,
            check=False,
        )
    finally:
        os.close(fd)
    assert done.returncode == 0, done.stderr
    value, _, cmdline = done.stdout.partition(b"\n")
    assert value == b"s3cr3t"
    assert b"s3cr3t" not in cmdline and b"--ro-bind" not in cmdline


def test_the_programs_argv_leaves_the_command_line_for_the_confiners_file() -> None:
    command, data = split_confiner_command(COMMAND)
    assert command == ("/opt/lnk/venv/bin/lnk-sandbox", "--")
    assert data == b"/bin/cat\0notes.txt\0"


def test_a_command_without_the_confiners_separator_is_left_as_it_is() -> None:
    assert split_confiner_command(("/bin/true",)) == (("/bin/true",), None)


def test_the_argv_file_is_copied_read_only_where_the_confiner_reads_it() -> None:
    argv = bwrap_argv(layout(command=("/c", "--"), argv_fd=11))
    at = argv.index(ARGV_PATH)
    assert argv[at - 4 : at] == ["--perms", "0444", "--file", "11"]
    assert argv[-3:] == ["--", "/c", "--"]


@pytest.mark.parametrize(
    ("command", "held"),
    [
        (("/c", "--"), ("/c", "--release-fd", "7", "--")),
        (("/c", "--", "/bin/cat", "x"), ("/c", "--release-fd", "7", "--", "/bin/cat", "x")),
    ],
)
def test_a_held_start_tells_the_confiner_its_release_descriptor(
    command: tuple[str, ...], held: tuple[str, ...]
) -> None:
    assert held_confiner_command(command, 7) == held


def test_a_held_start_without_the_confiners_separator_is_refused() -> None:
    with pytest.raises(LaunchRefused, match="no `--`"):
        held_confiner_command(("/bin/true",), 7)
