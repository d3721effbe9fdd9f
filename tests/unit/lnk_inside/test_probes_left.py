"""The steps for what a sandbox leaves or runs, outside any sandbox (as root, unconfined): each
reports "through" exactly when its attempt worked, and leaves what the outside then judges."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from seccomp_child import results_of, run_child

from lnk_cli.check.plan_left import LIBRARY_CANDIDATES
from lnk_controller import seccomp
from lnk_inside import probes_left
from lnk_inside.probes import run_step

IN_CHILD = (
    "import json, sys; from lnk_inside.probes import run_step; "
    "print(json.dumps(run_step(json.loads(sys.argv[1]))))"
)


def test_set_id_modes_are_left_when_nothing_stops_them(tmp_path: Path) -> None:
    paths = [str(tmp_path / "a"), str(tmp_path / "b")]
    result = run_step({"id": "s", "kind": "set_id", "paths": paths})
    assert result["outcome"] == "through"
    assert result["detail"] == "chmod 04755, fchmod 02755, create with mode 06755"
    assert os.lstat(paths[0]).st_mode & stat.S_ISGID
    assert os.lstat(paths[1]).st_mode & stat.S_ISUID


def test_shared_modes_are_left_when_nothing_stops_them(tmp_path: Path) -> None:
    paths = [str(tmp_path / "f"), str(tmp_path / "d")]
    assert run_step({"id": "s", "kind": "shared", "paths": paths})["outcome"] == "through"
    assert stat.S_IMODE(os.lstat(paths[0]).st_mode) == 0o666
    assert stat.S_IMODE(os.lstat(paths[1]).st_mode) == 0o777


def test_a_cleared_umask_leaves_shared_modes_when_nothing_strips_them(tmp_path: Path) -> None:
    paths = [str(tmp_path / "f"), str(tmp_path / "d")]
    before = os.umask(0o022)
    try:
        assert run_step({"id": "u", "kind": "umask", "paths": paths})["outcome"] == "through"
        assert os.umask(0o022) == 0o022  # the step put the umask back
    finally:
        os.umask(before)
    assert stat.S_IMODE(os.lstat(paths[0]).st_mode) == 0o666
    assert stat.S_IMODE(os.lstat(paths[1]).st_mode) == 0o777


def test_an_acl_is_left_when_nothing_stops_it(tmp_path: Path) -> None:
    paths = [str(tmp_path / "f"), str(tmp_path / "d")]
    assert run_step({"id": "a", "kind": "acl", "paths": paths})["outcome"] == "through"
    assert stat.S_IMODE(os.lstat(paths[0]).st_mode) & stat.S_IWOTH  # the ACL set it
    assert "system.posix_acl_default" in os.listxattr(paths[1])


def test_a_step_that_cannot_make_its_files_is_stopped(tmp_path: Path) -> None:
    paths = [str(tmp_path / "none" / "f"), str(tmp_path / "none" / "d")]
    result = run_step({"id": "s", "kind": "shared", "paths": paths})
    assert result["outcome"] == "stopped" and "ENOENT" in result["detail"]


def test_dev_write_and_preload_get_through_where_writing_and_mapping_work(tmp_path: Path) -> None:
    made = run_step({"id": "d", "kind": "dev_write", "path": str(tmp_path / "dev-file")})
    assert made["outcome"] == "through" and not (tmp_path / "dev-file").exists()
    library = next(p for p in LIBRARY_CANDIDATES if os.path.exists(p))
    copy = str(tmp_path / "lib.so")
    step = {"id": "p", "kind": "preload", "copy_from": library, "copy_to": copy}
    assert run_step(step)["outcome"] == "through"
    assert not os.path.exists(copy)


@pytest.mark.needs_root
def test_preload_from_a_noexec_mount_is_stopped(tmp_path: Path) -> None:
    library = next(p for p in LIBRARY_CANDIDATES if os.path.exists(p))
    mount = tmp_path / "noexec"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "noexec,size=4m", "tmpfs", mount], check=True)
    try:
        copy = str(mount / "lib.so")
        step = {"id": "p", "kind": "preload", "copy_from": library, "copy_to": copy}
        # in a child, as in a sandbox: the failed map may keep the file's first pages mapped
        child = subprocess.run(
            [sys.executable, "-c", IN_CHILD, json.dumps(step)],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        result = json.loads(child.stdout)
        assert result["outcome"] == "stopped"
        assert "failed to map segment" in result["detail"]
        assert not os.path.exists(copy)
    finally:
        subprocess.run(["umount", mount], check=True)


LOADER = "/lib64/ld-linux-x86-64.so.2"


@pytest.mark.skipif(not os.path.exists(LOADER), reason="an x86_64 glibc loader")
def test_the_loader_maps_a_program_on_an_exec_capable_mount_and_not_on_a_noexec_one(
    tmp_path: Path,
) -> None:
    mount = tmp_path / "noexec"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "noexec,size=4m", "tmpfs", mount], check=True)
    try:
        copy = mount / "basename"
        copy.write_bytes(Path("/usr/bin/basename").read_bytes())
        copy.chmod(0o755)
        mapped = run_step({"id": "m", "kind": "maps", "argv": [LOADER, "--verify", str(copy)]})
        assert mapped["outcome"] == "stopped"
        here = [LOADER, "--verify", "/usr/bin/basename"]
        assert run_step({"id": "m", "kind": "maps", "argv": here})["outcome"] == "through"
    finally:
        subprocess.run(["umount", mount], check=True)


def test_listen_gets_through_on_an_open_network() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = run_step({"id": "l", "kind": "listen", "udp_port": port})
    assert result["outcome"] == "through"
    assert result["detail"].startswith("listen on an unbound TCP socket, bind a TCP port")


DESCRIPTOR_STEPS = """
if ARGS["confined"]:
    load_filter()
import sys
sys.path.insert(0, ARGS["path"])  # the child runs isolated (-I): the installed package's folder
from lnk_inside.probes import run_step
for call in ("pidfd_getfd", "kcmp"):
    step = {"id": "d", "kind": "descriptor", "call": call}
    attempt(call, lambda: run_step(step)["outcome"])
"""


@pytest.mark.parametrize("confined", [False, True], ids=["open", "filtered"])
def test_a_childs_descriptor_is_taken_and_compared_unless_the_filter_refuses(
    confined: bool,
) -> None:
    """The kernel lets a parent of the same uid take and compare its child's descriptors, so
    `check`'s probe gets through unconfined and is stopped only by the sandbox's filter."""
    deny_list, unix_block = seccomp.programs()
    results = results_of(
        run_child(
            DESCRIPTOR_STEPS,
            filter=deny_list.hex(),
            unix=unix_block.hex(),
            confined=confined,
            path=str(Path(probes_left.__file__).parents[1]),
        )
    )
    expected = "stopped" if confined else "through"
    assert results == {"pidfd_getfd": expected, "kcmp": expected}, results
