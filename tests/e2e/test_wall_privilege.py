"""The wall's privilege side, attacked from inside a real sandbox: no capability, no way to
gain one, and no kernel interface the seccomp filter closes (namespaces, mounts, ptrace,
keyrings, BPF, io_uring, typing into a terminal).

Syscall attacks go through python3's ctypes, so the kernel's answer (the errno) is what is
checked, not a tool's message. Each has an outside check where the kernel would keep a trace.
"""

from __future__ import annotations

import os
import pty
import select
import shutil
import subprocess
import tty
from typing import Any

import pytest
from as_user import as_user
from install_prefix import LNK

RunningBox = Any  # tests/e2e/conftest.py

pytestmark = pytest.mark.needs_root

# A setuid-root program that says so when it does not run as root (and otherwise goes on to
# check a password): an oracle for "the setuid bit was honoured".
POLKIT_HELPER = "/usr/lib/polkit-1/polkit-agent-helper-1"
CAP_SETS = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")

# Calls a syscall by number with integer arguments and prints `errno=<name>` (or `ok=<result>`).
SYSCALL = """
import ctypes, errno, sys
libc = ctypes.CDLL(None, use_errno=True)
args = [ctypes.c_long(int(a)) for a in sys.argv[1:]]
result = libc.syscall(*args)
print(f"errno={errno.errorcode[ctypes.get_errno()]}" if result == -1 else f"ok={result}")
"""


def _status(text: str) -> dict[str, str]:
    return dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)


def _key_users() -> set[int]:
    """The uids the kernel keeps key quotas for (any uid that owns a key has a line)."""
    with open("/proc/key-users", encoding="ascii") as f:
        return {int(line.split(":", 1)[0]) for line in f if line.strip()}


# -- no privilege to start with -----------------------------------------------------------------


def test_sandbox_has_no_new_privs_and_no_capabilities(running_box: RunningBox) -> None:
    result = running_box.sh("cat /proc/self/status")
    assert result.returncode == 0, result.stderr
    status = _status(result.stdout)
    assert status["NoNewPrivs"].strip() == "1"
    assert {name: status[name].strip() for name in CAP_SETS} == dict.fromkeys(
        CAP_SETS, "0000000000000000"
    )
    assert status["Seccomp"].strip() == "2"


def test_sandbox_uid_differs_from_owner_and_has_only_its_own_group(
    running_box: RunningBox,
) -> None:
    result = running_box.sh("id -u; id -g; id -G; grep -E '^(Uid|Gid|Groups):' /proc/self/status")
    assert result.returncode == 0, result.stderr
    uid, gid, groups, *status_lines = result.stdout.splitlines()
    owner = running_box.owner
    assert int(uid) != owner.uid
    assert int(gid) != owner.gid
    assert groups.split() == [gid]
    status = _status("\n".join(status_lines))
    assert status["Uid"].split() == [uid] * 4
    assert status["Gid"].split() == [gid] * 4
    assert status["Groups"].split() == []  # no supplementary group at all


# -- setuid programs ----------------------------------------------------------------------------


@pytest.mark.parametrize("tool", ["su", "sudo"])
def test_su_and_sudo_to_root_fail(running_box: RunningBox, tool: str) -> None:
    found = shutil.which(tool, path="/usr/local/bin:/usr/bin:/bin")
    flags = [f"--command={tool}"] if found else []  # not installed: still try the name
    line = "su root -c 'id -u'" if tool == "su" else "sudo -n id -u"
    result = running_box.sh(f"{line} </dev/null; echo status=$?", *flags)
    lines = result.stdout.splitlines()
    assert lines and lines[-1].startswith("status="), f"the script did not run: {result.stderr}"
    assert lines[-1] != "status=0"
    assert "0" not in lines


def test_setuid_root_program_does_not_run_as_root(running_box: RunningBox) -> None:
    if not os.path.exists(POLKIT_HELPER):
        pytest.skip(f"{POLKIT_HELPER} is not installed: no setuid oracle here")
    result = running_box.sh(
        f"{POLKIT_HELPER} root </dev/null; echo status=$?", f"--command={POLKIT_HELPER}"
    )
    # The helper checks geteuid() first thing and says this only when it is not root.
    assert "needs to be setuid root" in result.stderr
    assert result.stdout.splitlines()[-2:] == ["FAILURE", "status=1"]


def test_setuid_passwd_and_mount_run_without_root(running_box: RunningBox) -> None:
    result = running_box.sh(
        "passwd </dev/null; echo passwd=$?; touch /tmp/still-here; "
        "mount -t tmpfs none /tmp; echo mount=$?; ls /tmp",
        "--command=passwd",
        "--command=mount",
    )
    lines = result.stdout.splitlines()
    assert "passwd=0" not in lines
    assert "mount=0" not in lines
    assert "still-here" in lines  # /tmp was not covered by a new mount
    assert "must be superuser" in result.stderr


# -- kernel interfaces the seccomp filter closes ------------------------------------------------


def test_unshare_user_namespace_is_refused(running_box: RunningBox) -> None:
    script = (
        "unshare -U id -u; echo status=$?; "
        f'python3 -c "$0" 272 {0x10000000}; python3 -c "$0" 272 {0x00020000}'
    )
    result = running_box.run(
        "--command=unshare",
        "--command=id",
        "--command=python3",
        cmd=["/bin/sh", "-c", script, SYSCALL],
    )
    lines = result.stdout.splitlines()
    assert lines[0] == "status=1", result.stderr
    assert lines[1:] == ["errno=EPERM", "errno=EPERM"]  # CLONE_NEWUSER, CLONE_NEWNS


def test_mount_tmpfs_is_refused(running_box: RunningBox) -> None:
    code = "\n".join(
        [
            "import ctypes, errno, os",
            "libc = ctypes.CDLL(None, use_errno=True)",
            'open("/tmp/still-here", "w").close()',
            'r = libc.mount(b"none", b"/tmp", b"tmpfs", 0, None)',
            'print("mount", r, errno.errorcode.get(ctypes.get_errno()))',
            'r = libc.syscall(428, -100, b"/tmp", 0)  # open_tree',
            'print("open_tree", r, errno.errorcode.get(ctypes.get_errno()))',
            'r = libc.syscall(430, b"tmpfs", 0)  # fsopen',
            'print("fsopen", r, errno.errorcode.get(ctypes.get_errno()))',
            'print(sorted(os.listdir("/tmp")))',
        ]
    )
    result = running_box.run(cmd=["python3", "-c", code])
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "mount -1 EPERM",
        "open_tree -1 EPERM",
        "fsopen -1 EPERM",
        "['still-here']",
    ]


def test_ptrace_attach_to_another_sandbox_process_is_refused(running_box: RunningBox) -> None:
    code = "\n".join(
        [
            "import ctypes, errno, subprocess",
            "libc = ctypes.CDLL(None, use_errno=True)",
            'child = subprocess.Popen(["sleep", "30"])',
            "r = libc.ptrace(ctypes.c_long(16), ctypes.c_long(child.pid), None, None)",
            "err = errno.errorcode.get(ctypes.get_errno())",
            'with open(f"/proc/{child.pid}/status") as f:',
            '    tracer = [l.split()[1] for l in f if l.startswith("TracerPid:")][0]',
            "child.kill()",
            "child.wait()",
            'print(f"attach={r} errno={err} tracer={tracer}")',
        ]
    )
    result = running_box.run("--command=sleep", cmd=["python3", "-c", code])
    assert result.returncode == 0, result.stderr
    assert result.stdout == "attach=-1 errno=EPERM tracer=0\n"


@pytest.mark.parametrize(
    ("name", "argv"),
    [
        # keyctl(KEYCTL_GET_KEYRING_ID, KEY_SPEC_USER_KEYRING, create=1): makes a keyring
        ("keyctl", ["250", "0", "-4", "1"]),
        # add_key("user", "lnk-bait", "x", 1, KEY_SPEC_USER_KEYRING): strings via argv below
        ("add_key", ["248", "ADDR:user", "ADDR:lnk-bait", "ADDR:x", "1", "-4"]),
        # bpf(BPF_PROG_LOAD, NULL, 0)
        ("bpf", ["321", "5", "0", "0"]),
        # io_uring_setup(4, &params) with a zeroed 120-byte io_uring_params
        ("io_uring_setup", ["425", "4", "BUF:120"]),
    ],
)
def test_kernel_interface_is_refused(running_box: RunningBox, name: str, argv: list[str]) -> None:
    code = "\n".join(
        [
            "import ctypes, errno, sys",
            "libc = ctypes.CDLL(None, use_errno=True)",
            "keep = []",
            "def arg(a):",
            '    if a.startswith("ADDR:"):',
            "        keep.append(ctypes.c_char_p(a[5:].encode()))",
            "        return ctypes.c_void_p(ctypes.cast(keep[-1], ctypes.c_void_p).value)",
            '    if a.startswith("BUF:"):',
            "        keep.append(ctypes.create_string_buffer(int(a[4:])))",
            "        return ctypes.c_void_p(ctypes.addressof(keep[-1]))",
            "    return ctypes.c_long(int(a))",
            "r = libc.syscall(*[arg(a) for a in sys.argv[1:]])",
            "err = errno.errorcode.get(ctypes.get_errno())",
            "import os",
            'print(os.getuid(), f"ok={r}" if r != -1 else f"errno={err}")',
        ]
    )
    before = _key_users()
    result = running_box.run(cmd=["python3", "-c", code, *argv])
    assert result.returncode == 0, result.stderr
    uid, answer = result.stdout.split()
    assert answer == "errno=EPERM", f"{name}: {answer}"
    assert int(uid) not in _key_users() - before  # no key or keyring left in the kernel


TIOCSTI_PROBE = "\n".join(
    [
        "import errno, fcntl, os, termios",
        'print("isatty", os.isatty(0))',
        "try:",
        '    fcntl.ioctl(0, termios.TIOCSTI, b"X")',
        '    print("pushed")',
        "except OSError as exc:",
        '    print("errno", errno.errorcode[exc.errno])',
    ]
)


def _tiocsti(run: Any) -> tuple[Any, list[int]]:
    """Run the probe with a real terminal of the caller as stdin (stdout a pipe: no relay)."""
    master, secondary = pty.openpty()
    try:
        tty.setraw(secondary)
        result = run(["python3", "-c", TIOCSTI_PROBE], secondary)
        typed, _, _ = select.select([secondary], [], [], 0.2)
    finally:
        os.close(master)
        os.close(secondary)
    return result, typed


def test_tiocsti_on_the_sandbox_stdin_is_refused(running_box: RunningBox) -> None:
    """The caller's stdin is a real terminal (no terminal relay: stdout is a pipe); pushing
    bytes into its input would type commands into the caller's shell. The sandbox does not get
    that terminal (stdio_guard: /dev/null in its place), and TIOCSTI is refused anyway."""
    result, typed = _tiocsti(lambda cmd, stdin: running_box.run(cmd=cmd, stdin=stdin))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "isatty False\nerrno EPERM\n"
    assert typed == []  # nothing arrived in the caller's terminal input


def test_tiocsti_on_the_callers_own_terminal_is_refused_by_seccomp_alone(
    running_box: RunningBox, private_box: Any
) -> None:
    """The same with the terminal passed in as it is (the `unsafe_caller_terminal` test
    switch): the seccomp filter alone still refuses TIOCSTI on the caller's real terminal."""
    owner = running_box.owner
    with private_box("unsafe_caller_terminal = true") as box:
        env = {
            **running_box.owner_env(),
            **{k: v for k, v in box.env.items() if k.startswith("LNK_")},
        }

        def run(cmd: list[str], stdin: int) -> Any:
            argv = as_user(owner.uid, owner.gid, str(LNK), "sandbox", "run", "--yes",
                           "--command=python3", "--", *cmd)  # fmt: skip
            return subprocess.run(
                argv, env=env, cwd=str(owner.home), stdin=stdin, capture_output=True,
                text=True, timeout=60, check=False,
            )  # fmt: skip

        result, typed = _tiocsti(run)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "isatty True\nerrno EPERM\n"
    assert typed == []
