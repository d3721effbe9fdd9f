"""The install the e2e tests run against: `LNK_PREFIX` (default /opt/lnk), as scripts/install
made it. One place, so a run against another prefix never reaches a different install's `lnk`."""

from __future__ import annotations

import os
from pathlib import Path

PREFIX = Path(os.environ.get("LNK_PREFIX", "/opt/lnk"))
LNK = PREFIX / "venv" / "bin" / "lnk"
PYTHON = PREFIX / "venv" / "bin" / "python"
