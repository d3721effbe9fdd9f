"""A fresh Python child that loads a seccomp program as the confiner does, then attacks.

Shared by the seccomp unit tests (tests/unit/lnk_controller/test_seccomp*.py): `PRELUDE` is the
child's start (the program's hex is in its JSON argument; `load_filter` sets no_new_privs and
loads it; `attempt` records each result as "OK", a value or the errno's name) and `results_of`
reads back the JSON document the child prints last.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

__all__ = ["PRELUDE", "results_of", "run_child"]

PRELUDE = """
import ctypes, errno, json, mmap, os, signal, socket, subprocess, sys, threading
ARGS = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
results = {}

class SockFprog(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))

def load_filter(name="filter"):
    # as lnk_sandbox.c: no_new_privs, then seccomp(SECCOMP_SET_MODE_FILTER, 0, &prog)
    program = bytes.fromhex(ARGS[name])
    buffer = ctypes.create_string_buffer(program, len(program))
    prog = SockFprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    assert libc.prctl(38, 1, 0, 0, 0) == 0
    assert libc.syscall(ctypes.c_long(317), ctypes.c_long(1), ctypes.c_long(0),
                        ctypes.byref(prog)) == 0, ctypes.get_errno()

def attempt(label, fn):
    try:
        value = fn()
    except OSError as exc:
        results[label] = errno.errorcode[exc.errno]
    else:
        results[label] = "OK" if value is None else value

def sys_call(*args):
    rc = libc.syscall(*(ctypes.c_long(a) if isinstance(a, int) else a for a in args))
    if rc < 0:
        raise OSError(ctypes.get_errno(), "syscall")
    return rc

def call(*args):
    sys_call(*args)

def in_fork(fn):
    # a forked child, so a namespace it makes does not change the later attacks
    pid = os.fork()
    if pid == 0:
        try:
            fn()
        except OSError as exc:
            os._exit(exc.errno)
        os._exit(0)
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    if code:
        raise OSError(code, "in child")
"""


def results_of(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def run_child(body: str, **args: Any) -> subprocess.CompletedProcess[str]:
    """Run PRELUDE + `body` in a fresh `python -I -S` with `args` as its JSON argument."""
    script = PRELUDE + body + "\nprint(json.dumps(results), flush=True)\n"
    return subprocess.run(
        [sys.executable, "-I", "-S", "-c", script, json.dumps(args)],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
        timeout=60,
        check=False,
    )
