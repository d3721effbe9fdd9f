"""The README's usage block, run as written: each line that names no placeholder (ID, NAME, ...)
and offers no alternatives (`|`, `[...]`) is run by the box's real owner, on a real pty (where
a line has no `--yes`, the question is answered "y"), in a project folder holding what the README
says it holds (a Makefile, `out/`, `project.toml`, `build.py`), and what it should have done is
looked for on the host afterwards. The `pip download` line runs against a PyPI stand-in
(`pypi_server.py`: pypi.org's simple index and files.pythonhosted.org's file, at their names in
a test-internet namespace, over TLS with a test CA) on a box of its own whose sandboxes trust
that CA through the system's store, as pip finds the real one's (`net_standin.trusting_box`).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from as_user import as_user
from conftest import _private_box
from net import Host, TestInternet
from net_certs import Certs
from net_standin import bundle_with, extra_address, point, serve, trusting_box
from on_pty import answer_on_pty
from pypi_server import FILES, INDEX, wheel

pytestmark = [pytest.mark.e2e, pytest.mark.needs_root]
RunningBox = Any  # tests/e2e/conftest.py
PREFIX = Path(os.environ.get("LNK_PREFIX", "/opt/lnk"))
README = Path(__file__).parents[2] / "README.md"
# Lines run by a test of their own: the internet one, against its stand-in hosts; the git
# clone over ssh by test_git_ssh.py, a test sshd standing in for github.com.
NOT_HERE = ("pip download", "git clone")
PYPI_SERVER = Path(__file__).with_name("pypi_server.py")
PYPI_HOST = 5  # the stand-in's address in the test internet's public subnet (net_standin)
STAND_IN_VERSION = "2.32.3"  # the project the README downloads, served at this version
PLACEHOLDER = re.compile(r"\b[A-Z][A-Z_.]*[A-Z]\b|\b[A-Z]\b")  # ID, NAME, KEY.pub's KEY, S, F

MAKEFILE = "out/hello.txt:\n\techo hello from make > out/hello.txt\n"
BUILD_PY = "with open('out/built.txt', 'w') as f:\n    f.write('built by python\\n')\n"
PROJECT_TOML = '[folders]\nread = ["."]\nwrite = ["out"]\n'


def usage_lines() -> list[str]:
    """The README's usage block, one command a line, comments cut."""
    text = README.read_text()
    block = text.split("## Usage\n", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    return [line.split("  #", 1)[0].strip() for line in block.splitlines() if line.strip()]


def runnable(line: str) -> bool:
    return not ("|" in line or "[" in line or "…" in line or PLACEHOLDER.search(line))


@pytest.fixture(scope="module")
def project(running_box: RunningBox) -> Iterator[Path]:
    owner = running_box.owner
    folder = owner.home / "src" / f"app-{secrets.token_hex(3)}"
    (folder / "out").mkdir(parents=True)
    (folder / "Makefile").write_text(MAKEFILE)
    (folder / "build.py").write_text(BUILD_PY)
    (folder / "project.toml").write_text(PROJECT_TOML)
    subprocess.run(["chown", "-R", f"{owner.uid}:{owner.gid}", str(owner.home / "src")], check=True)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _env(box: RunningBox) -> dict[str, str]:
    # `lnk` as a box's user finds it: the install's on PATH first.
    return {**box.owner_env(), "PATH": f"{PREFIX}/venv/bin:/usr/local/bin:/usr/bin:/bin"}


SHELL_PROMPT = b"$ "  # bash's default prompt ends so: the shell reads its terminal (typed
# earlier, what is typed would be flushed by the client's switch to raw mode)


def test_the_usage_block_has_the_lines_this_test_runs() -> None:
    lines = [line for line in usage_lines() if runnable(line)]
    assert any("-- make" in line for line in lines)
    assert any(line.endswith("-- bash") for line in lines)
    assert any("python3 build.py" in line for line in lines)
    assert any("pip download" in line for line in lines)
    assert "lnk --help" in lines


def test_each_line_of_the_usage_block_runs_as_written(
    running_box: RunningBox, project: Path
) -> None:
    box = running_box
    ran: list[str] = []
    for line in usage_lines():
        if not runnable(line) or any(skip in line for skip in NOT_HERE):
            continue
        argv = shlex.split(line)
        assert argv[0] == "lnk", line
        argv[0] = str(PREFIX / "venv" / "bin" / "lnk")
        if argv[-1] == "bash":  # the interactive shell: a program that is not a builtin runs
            status, screen = answer_on_pty(
                as_user(box.owner.uid, box.owner.gid, *argv),
                "/usr/bin/expr 40 + 2\nexit 7",
                env={**_env(box), "TERM": "dumb"},
                cwd=project,
                prompt=SHELL_PROMPT,
            )
            assert status == 7, screen
            assert b"\r\n42\r\n" in screen, screen  # expr ran: not refused as under a list
        else:
            owner = box.owner
            command = as_user(owner.uid, owner.gid, *argv)
            status, screen = answer_on_pty(command, "y", env=_env(box), cwd=project)
            assert status == 0, (line, screen.decode(errors="replace"))
        ran.append(line)
    assert (project / "out" / "hello.txt").read_text() == "hello from make\n"
    assert (project / "out" / "built.txt").read_text() == "built by python\n"
    for made in (project / "out").iterdir():  # made by the sandbox, landed as the owner's
        assert made.stat().st_uid == box.owner.uid
    assert len(ran) >= 5, ran


def test_the_pip_line_downloads_through_the_proxy_from_the_pypi_stand_in(
    running_box: RunningBox, project: Path
) -> None:
    """The README's `pip download` line as written: pip in the sandbox reads pypi.org's index
    and fetches the wheel from files.pythonhosted.org (both granted on the line, through the
    proxy) and the wheel lands in `out/` as the owner's, byte for byte what the stand-in
    served."""
    (line,) = [line for line in usage_lines() if "pip download" in line]
    argv = shlex.split(line)
    project_name = argv[-1]
    name, served = wheel(project_name, STAND_IN_VERSION)
    owner = running_box.owner
    with TestInternet() as net:
        address = extra_address(net, PYPI_HOST)
        host = Host(INDEX, address, net.public_netns, net.tmp / "pypi.log")
        ca_file = net.tmp / "pypi-ca.pem"
        certs = Certs(net.id)
        ca_file.write_text(certs.pem)
        cert, key = certs.issue(host, [INDEX, FILES], net.tmp)
        log = net.tmp / "pypi.jsonl"
        log.touch()
        args = [address, str(log), str(cert), str(key), project_name, STAND_IN_VERSION]
        proxy_config = (
            f'unsafe_public_networks = ["{net.public_subnet}"]\nunsafe_dns_table = "{net.dns_file}"'
        )
        wrap = trusting_box(bundle_with(ca_file, net.tmp))
        with (
            serve(net, PYPI_SERVER, args, net.tmp / "pypi.err"),
            _private_box(proxy_config=proxy_config, services_wrap=wrap) as box,
        ):
            point(net, [INDEX, FILES], address)
            # The owner's own PATH (Debian's pip, as a box's user has it), this box's folders.
            env = {**running_box.owner_env(), **{k: box.env[k] for k in box.env if "LNK_" in k}}
            argv[0] = str(PREFIX / "venv" / "bin" / "lnk")
            command = as_user(owner.uid, owner.gid, *argv)
            status, screen = answer_on_pty(command, "y", env=env, cwd=project)
            arrived = [json.loads(entry) for entry in log.read_text().splitlines()]
    assert status == 0, (line, screen.decode(errors="replace"))
    assert b"/usr/bin/pip" in screen  # the approval question named the system's pip
    downloaded = project / "out" / name
    assert downloaded.read_bytes() == served
    assert downloaded.stat().st_uid == owner.uid
    assert [r["host"] for r in arrived] == [INDEX, FILES], arrived
    assert arrived[0]["path"] == f"/simple/{project_name}/"
