"""End-to-end fixtures: the installed `lnk` (from the prefix scripts/install made), run as a
real process against a box whose state lives in a temp dir."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

PREFIX = Path(os.environ.get("LNK_PREFIX", "/opt/lnk"))
LNK = PREFIX / "venv" / "bin" / "lnk"


@dataclass
class Box:
    env: dict[str, str]
    root: Path
    lnk_path: Path = LNK

    def lnk(self, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(LNK), *args],
            env=self.env,
            input=input,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )


@pytest.fixture
def box(tmp_path: Path) -> Box:
    if not LNK.exists():
        pytest.fail(f"{LNK} is missing: run scripts/install first")
    root = tmp_path / "box"
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
        "HOME": os.environ.get("HOME", "/root"),
        "LNK_CONFIG_DIR": str(root / "etc"),
        "LNK_STATE_DIR": str(root / "state"),
        "LNK_RUN_DIR": str(root / "run"),
        "LANG": "C.UTF-8",
    }
    return Box(env=env, root=root)
