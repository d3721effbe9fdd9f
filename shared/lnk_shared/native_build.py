"""Compile the box's programs from the C sources beside this file: the confiner,
`lnk-sandbox` (lnk_sandbox.c and the relay), the launcher, `lnk-spawn` (lnk_spawn.c, which the
controller runs as root to start bwrap), the client, `lnk` (lnk_client*.c: `lnk sandbox
run`'s quick path and an agent's bridge calls, the Python CLI for the rest), and the connector,
`lnk-connect` (lnk_connect.c: ssh's ProxyCommand inside a sandbox).

Each program's sources are named one by one in `SOURCES`: a new .c file beside them joins no
program (least of all the confiner, which runs inside every sandbox) until a line here lists it,
and `unlisted()` names any that none does (a unit test fails on one).

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
    "SOURCES",
    "SOURCES_DIR",
    "SPAWNER",
    "BuildError",
    "build",
    "build_all",
    "sources_of",
    "unlisted",
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
PROGRAMS = (CONFINER, SPAWNER, CLIENT, CONNECTOR)

# Each program's C files, in this folder. One line per file, so another branch's new file is
# one added line (a library to link would get its own table beside this one).
SOURCES: dict[str, tuple[str, ...]] = {
    CONFINER: (
        "lnk_sandbox.c",
        "relay.c",
    ),
    SPAWNER: ("lnk_spawn.c",),
    CLIENT: (
        "lnk_client.c",
        "lnk_client_bridge.c",
        "lnk_client_dialogue.c",
        "lnk_client_json.c",
        "lnk_client_proof.c",
        "lnk_client_text.c",
        "lnk_client_values.c",
    ),
    CONNECTOR: ("lnk_connect.c",),
}
# Linked after a program's sources: the client signs an agent's bridge calls with Ed25519 from
# libsodium's libsodium.a (Debian's libsodium-dev), a small audited library with no config
# file, no dlopen and no engines (OpenSSL's libcrypto.a would add megabytes and its config).
LIBRARIES: dict[str, tuple[str, ...]] = {CLIENT: ("-lsodium",)}


class BuildError(RuntimeError):
    """A program could not be compiled (no compiler, or the compiler refused the sources)."""


def sources_of(program: str, folder: Path = SOURCES_DIR) -> list[str]:
    """The paths of `program`'s C files in `folder`, as `SOURCES` lists them."""
    if program not in SOURCES:
        raise ValueError(f"no such program: {program} (one of {', '.join(PROGRAMS)})")
    return [str(folder / name) for name in SOURCES[program]]


def unlisted(folder: Path = SOURCES_DIR) -> list[str]:
    """The .c files in `folder` that no program lists: built into nothing until one does."""
    listed = {name for names in SOURCES.values() for name in names}
    return sorted(p.name for p in folder.glob("*.c") if p.name not in listed)


def build(out_path: str | Path, *, program: str = CONFINER, cc: str = "cc") -> Path:
    """Compile `program` into `out_path` (mode 0755); raise BuildError naming the fix."""
    sources = sources_of(program)
    missing = [path for path in sources if not Path(path).is_file()]
    if missing:
        raise BuildError(f"{program}'s sources are missing: {', '.join(missing)}")
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
