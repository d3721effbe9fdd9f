"""Compile the box's programs from the C sources beside this file: the confiner,
`lnk-sandbox` (lnk_sandbox.c and the relay, every .c but the launcher's and the client's), the
launcher, `lnk-spawn` (lnk_spawn.c, which the controller runs as root to start bwrap), the
client, `lnk` (lnk_client*.c: `lnk sandbox run`'s quick path, the Python CLI for the rest), and
the connector, `lnk-connect` (lnk_connect.c: ssh's ProxyCommand inside a sandbox).

Used by setup.py (which loads this file by path, before the package is importable), by the
unit tests and by hand (`python build.py DIR` writes them all into DIR). Static: nothing needs the
ELF loader or the box's libc inside the sandbox to start them, and the hardening flags are fixed
here, in one place.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

__all__ = [
    "CFLAGS",
    "CLIENT",
    "CONFINER",
    "CONNECTOR",
    "LIBRARIES",
    "PROGRAMS",
    "SOURCES_DIR",
    "SPAWNER",
    "BuildError",
    "build",
    "build_all",
]

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


CONFINER = "lnk-sandbox"
SPAWNER = "lnk-spawn"
CLIENT = "lnk"
CONNECTOR = "lnk-connect"
_SPAWNER_SOURCE = "lnk_spawn.c"
_CLIENT_SOURCES = "lnk_client*.c"
_CONNECTOR_SOURCE = "lnk_connect.c"
PROGRAMS = (CONFINER, SPAWNER, CLIENT, CONNECTOR)
# Linked after a program's sources: the client signs an agent's bridge calls with Ed25519 from
# libsodium's libsodium.a (Debian's libsodium-dev), a small audited library with no config
# file, no dlopen and no engines (OpenSSL's libcrypto.a would add megabytes and its config).
LIBRARIES = {CLIENT: ("-lsodium",)}


class BuildError(RuntimeError):
    """A program could not be compiled (no compiler, or the compiler refused the sources)."""


def _sources(program: str) -> list[str]:
    spawner = SOURCES_DIR / _SPAWNER_SOURCE
    connector = SOURCES_DIR / _CONNECTOR_SOURCE
    client = sorted(SOURCES_DIR.glob(_CLIENT_SOURCES))
    if program == SPAWNER:
        return [str(spawner)]
    if program == CONNECTOR:
        return [str(connector)]
    if program == CLIENT:
        return [str(p) for p in client]
    if program == CONFINER:
        others = {spawner, connector, *client}
        return sorted(str(p) for p in SOURCES_DIR.glob("*.c") if p not in others)
    raise ValueError(f"no such program: {program} (one of {', '.join(PROGRAMS)})")


def build(out_path: str | Path, *, program: str = CONFINER, cc: str = "cc") -> Path:
    """Compile `program` into `out_path` (mode 0755); raise BuildError naming the fix."""
    sources = _sources(program)
    compiler = shutil.which(cc)
    if compiler is None:
        raise BuildError(
            f"no C compiler ({cc}) to build {program}: install gcc, libc6-dev and libsodium-dev"
        )
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        [compiler, *CFLAGS, "-o", str(out), *sources, *LIBRARIES.get(program, ())],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise BuildError(f"building {program} failed:\n{result.stderr}")
    out.chmod(0o755)
    return out


def build_all(folder: str | Path, *, cc: str = "cc") -> list[Path]:
    """Every program into `folder`, each under its own name."""
    return [build(Path(folder) / program, program=program, cc=cc) for program in PROGRAMS]


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} FOLDER  (writes {' and '.join(PROGRAMS)} into it)")
    for path in build_all(sys.argv[1]):
        print(path)
