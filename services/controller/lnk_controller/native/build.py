"""Compile the confiner, `lnk-sandbox`, from the C sources beside this file.

Used by setup.py (which loads this file by path, before the package is importable) and by the
unit tests. Static: nothing needs the ELF loader or the box's libc inside the sandbox to start
it, and the hardening flags are fixed here, in one place.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

__all__ = ["CFLAGS", "SOURCES_DIR", "BuildError", "build"]

SOURCES_DIR = Path(__file__).resolve().parent
CFLAGS = (
    "-std=c11",
    "-O2",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-static",
    "-D_FORTIFY_SOURCE=2",
    "-fstack-protector-strong",
    "-pthread",
)


class BuildError(RuntimeError):
    """The confiner could not be compiled (no compiler, or the compiler refused the sources)."""


def build(out_path: str | Path, *, cc: str = "cc") -> Path:
    """Compile every native/*.c into `out_path` (mode 0755); raise BuildError naming the fix."""
    compiler = shutil.which(cc)
    if compiler is None:
        raise BuildError(
            f"no C compiler ({cc}) to build the confiner lnk-sandbox: install gcc and libc6-dev"
        )
    sources = sorted(str(p) for p in SOURCES_DIR.glob("*.c"))
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        [compiler, *CFLAGS, "-o", str(out), *sources],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise BuildError(f"building lnk-sandbox failed:\n{result.stderr}")
    out.chmod(0o755)
    return out
