"""The README's main job, as a new user meets it: `scripts/install && scripts/demo` on a prefix that
did not exist, with run, state and config folders of its own (so a box running on this machine is
not disturbed), twice. A broken install or demo fails CI here, whatever the machine already had.

Also what the install leaves: `lnk` linked where it was asked to be, and a prefix holding what
the box runs and no more (no test, lint or deploy tool, importable neither outside nor inside a
sandbox; no stray top-level package from the wheel).
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = [pytest.mark.needs_root, pytest.mark.e2e]

CHECKOUT = Path(__file__).resolve().parents[2]
INSTALL_TIMEOUT_S = 900  # a new venv and every runtime dependency, on a loaded 2-core machine
DEMO_TIMEOUT_S = 300
UID_BLOCK_START = 2_090_000_000  # apart from the test boxes' blocks and a real box's default
UID_BLOCK = 1000
# What a box never runs: the test environment's and the deploy tools' top-level modules.
NOT_IN_THE_PREFIX = ("pytest", "ruff", "mypy", "ansible", "ansiblelint", "hypothesis", "paramiko")


@dataclass(frozen=True)
class FreshBox:
    prefix: Path
    bin_dir: Path
    demo_dir: Path
    env: dict[str, str]

    @property
    def lnk(self) -> Path:
        return self.prefix / "venv" / "bin" / "lnk"

    def script(self, name: str, timeout: float) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(CHECKOUT / "scripts" / name)],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


def _sandbox_users(first: int, last: int) -> list[str]:
    with open("/etc/passwd", encoding="utf-8") as f:
        return [line for line in f if first <= int(line.split(":")[2]) <= last]


@pytest.fixture(scope="module")
def fresh_box() -> Iterator[FreshBox]:
    tag = secrets.token_hex(4)
    prefix = Path(f"/opt/lnk-mainjob-{tag}")
    roots = {
        "LNK_CONFIG_DIR": Path(f"/etc/lnk-mainjob-{tag}"),
        "LNK_STATE_DIR": Path(f"/var/lib/lnk-mainjob-{tag}"),
        "LNK_RUN_DIR": Path(f"/run/lnk-mainjob-{tag}"),
    }
    bin_dir = Path(f"/run/lnk-mainjob-bin-{tag}")
    demo_dir = Path(f"/srv/lnk-mainjob-{tag}")
    for path in (prefix, bin_dir, demo_dir, *roots.values()):
        assert not path.exists(), f"{path} exists before the test made it"
    first = UID_BLOCK_START + secrets.randbelow(1000) * UID_BLOCK
    # The only thing made ahead: a uid block of its own, so this box never shares (or reconciles
    # away) another box's sandbox users. Everything else the install and the demo make.
    roots["LNK_CONFIG_DIR"].mkdir(mode=0o755)
    (roots["LNK_CONFIG_DIR"] / "controller.toml").write_text(
        f"uid_first = {first}\nuid_last = {first + UID_BLOCK - 1}\n"
    )
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin",
        "HOME": "/root",
        "LANG": "C.UTF-8",
        "LNK_PREFIX": str(prefix),
        "LNK_BIN_DIR": str(bin_dir),
        "LNK_DEMO_DIR": str(demo_dir),
        **{name: str(path) for name, path in roots.items()},
    }
    box = FreshBox(prefix, bin_dir, demo_dir, env)
    try:
        yield box
    finally:
        if box.lnk.exists():
            subprocess.run(
                [str(box.lnk), "box", "down"], env=env, capture_output=True, timeout=60, check=False
            )
        left = _sandbox_users(first, first + UID_BLOCK - 1)
        for path in (prefix, bin_dir, demo_dir, *roots.values()):
            shutil.rmtree(path, ignore_errors=True)
        assert not left, f"sandbox users left behind: {left}"


@pytest.fixture(scope="module")
def installed(fresh_box: FreshBox) -> subprocess.CompletedProcess[str]:
    return fresh_box.script("install", INSTALL_TIMEOUT_S)


def _assert_demo(done: subprocess.CompletedProcess[str], box: FreshBox) -> None:
    out = done.stdout
    assert done.returncode == 0, f"scripts/demo exited {done.returncode}:\n{out}\n{done.stderr}"
    for line in (
        "proxy: ",
        "controller: ",
        "read   : the sample project",
        "write  : out/result.txt written",
        "refused: read /root",
        "refused: read /etc/shadow",
        "refused: write the project",
        "refused: run /usr/bin/id",
        "on the host, out/result.txt: written from inside the sandbox",
        "exit status: 126",  # a run refused (lnk_shared.errors.EXIT_RUN_REFUSED)
    ):
        assert line in out, f"scripts/demo did not print {line!r}:\n{out}"
    assert "LEAKED" not in out
    summary = [line for line in out.splitlines() if "leaked" in line and " refused" in line]
    assert summary, f"no check summary in:\n{out}"
    assert summary[-1].startswith("nothing leaked: "), summary
    assert "lnk: refused [" in done.stderr + out  # the refused spec names its rule
    assert not (box.demo_dir / "evil.txt").exists()


def test_install_on_a_prefix_that_never_existed_works_and_links_lnk(
    installed: subprocess.CompletedProcess[str], fresh_box: FreshBox
) -> None:
    assert installed.returncode == 0, f"scripts/install failed:\n{installed.stderr}"
    link = fresh_box.bin_dir / "lnk"
    assert link.is_symlink() and link.resolve() == fresh_box.lnk.resolve()
    assert f"lnk is on PATH as {link} -> {fresh_box.lnk}" in installed.stdout
    version = subprocess.run(
        ["lnk", "--version"],
        env={**fresh_box.env, "PATH": f"{fresh_box.bin_dir}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert version.returncode == 0 and version.stdout.startswith("lnk "), version


def test_the_demo_runs_on_the_fresh_prefix_and_again(
    installed: subprocess.CompletedProcess[str], fresh_box: FreshBox
) -> None:
    assert installed.returncode == 0, installed.stderr
    _assert_demo(fresh_box.script("demo", DEMO_TIMEOUT_S), fresh_box)
    again = fresh_box.script("demo", DEMO_TIMEOUT_S)  # the box is up already: works the same
    _assert_demo(again, fresh_box)
    assert "proxy: already running" in again.stdout


def test_install_again_on_the_same_prefix_works(
    installed: subprocess.CompletedProcess[str], fresh_box: FreshBox
) -> None:
    assert installed.returncode == 0, installed.stderr
    again = fresh_box.script("install", INSTALL_TIMEOUT_S)
    assert again.returncode == 0, f"a second scripts/install failed:\n{again.stderr}"


def test_the_prefix_holds_what_the_box_runs_and_no_test_or_deploy_tool(
    installed: subprocess.CompletedProcess[str], fresh_box: FreshBox
) -> None:
    assert installed.returncode == 0, installed.stderr
    python = fresh_box.prefix / "venv" / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    present = sorted(os.listdir(site))
    for name in (*NOT_IN_THE_PREFIX, "bin"):
        assert name not in present, f"{name} is in the box's prefix: {present}"
    for module in (*NOT_IN_THE_PREFIX, "bin"):
        imported = subprocess.run(
            [str(python), "-c", f"import {module}"], capture_output=True, timeout=30, check=False
        )
        assert imported.returncode != 0, f"the box's Python imports {module}"
    assert not list((fresh_box.prefix / "venv" / "bin").glob("pytest*"))


def test_a_sandbox_cannot_import_the_test_tools(
    installed: subprocess.CompletedProcess[str], fresh_box: FreshBox
) -> None:
    assert installed.returncode == 0, installed.stderr
    up = subprocess.run(
        [str(fresh_box.lnk), "box", "up"],
        env=fresh_box.env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert up.returncode == 0, up.stderr
    probe = (
        "import importlib.util, sys\n"
        f"found = [m for m in {NOT_IN_THE_PREFIX!r} if importlib.util.find_spec(m)]\n"
        "print('found:', found)\n"
        "import lnk_shared\n"  # the box's own packages are there: the probe itself works
        "print('lnk_shared: ok')\n"
    )
    python = str(fresh_box.prefix / "venv" / "bin" / "python")
    ran = subprocess.run(
        [
            str(fresh_box.lnk),
            "sandbox",
            "run",
            "--yes",
            "--command",
            python,
            "--",
            python,
            "-c",
            probe,
        ],
        env=fresh_box.env,
        cwd="/",
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    assert "found: []" in ran.stdout and "lnk_shared: ok" in ran.stdout, ran.stdout
