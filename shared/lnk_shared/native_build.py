"""Compile the box's C programs from each room's sources: the confiner, `lnk-sandbox`
(lnk_inside/native/lnk_sandbox.c and the relay: it runs inside every sandbox), the connector,
`lnk-connect` (lnk_inside/native/lnk_connect.c: ssh's ProxyCommand inside a sandbox), the
launcher, `lnk-spawn` (lnk_controller/native/lnk_spawn.c, which the controller runs as root to
start bwrap), and the client, `lnk` (lnk_cli/native/lnk_client*.c: the caller's program,
`lnk sandbox run`'s quick path and an agent's bridge calls, the Python CLI for the rest).

One build for the three rooms, here because lnk_shared is the one package every room may
depend on: the flags (static, hardened) are fixed in one place, and each program's sources are
named one by one in `SOURCES`, in its room's `native/` folder (`ROOMS`). A new .c file there
joins no program (least of all the confiner) until a line here lists it, and `unlisted()` names
any that none does (a unit test fails on one).

Used by setup.py (which loads this file by path, before the packages are importable), by the
unit tests and by hand (`python native_build.py DIR` writes them all into DIR). The rooms'
folders are found beside this package: in a checkout, each package sits in its own top-level
folder (`CHECKOUT_FOLDERS`, pyproject.toml's `where`); installed, the packages are siblings in
site-packages, their C sources shipped as package data. Static: nothing needs the ELF loader or
the box's libc inside the sandbox to start them.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

__all__ = [
    "CFLAGS",
    "CHECKOUT_FOLDERS",
    "CLIENT",
    "CONFINER",
    "CONNECTOR",
    "LIBRARIES",
    "PROGRAMS",
    "ROOMS",
    "SOURCES",
    "SPAWNER",
    "BuildError",
    "build",
    "build_all",
    "native_folder",
    "sources_of",
    "unlisted",
]

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

# Each program's room: the package whose `native/` folder holds its sources (who runs it).
ROOMS: dict[str, str] = {
    CONFINER: "lnk_inside",  # inside every sandbox, hostile ground
    CONNECTOR: "lnk_inside",
    SPAWNER: "lnk_controller",  # root's, in the controller
    CLIENT: "lnk_cli",  # the caller's
}
# In a checkout, the top-level folder each room's package sits in (pyproject.toml's `where`).
CHECKOUT_FOLDERS: dict[str, str] = {
    "lnk_inside": "sandbox",
    "lnk_controller": "services/controller",
    "lnk_cli": "cli",
}
_HERE = Path(__file__).resolve().parent

# Each program's C files, in its room's native/ folder. One line per file, so another branch's
# new file is one added line (a library to link would get its own table beside this one).
SOURCES: dict[str, tuple[str, ...]] = {
    CONFINER: (
        "lnk_sandbox.c",
        "relay.c",
        "relay_direction.c",
        "relay_own_thread.c",
        "write_all.c",
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
    CONNECTOR: (
        "lnk_connect.c",
        "write_all.c",  # shared with the confiner's relay
    ),
}
# Linked after a program's sources: the client signs an agent's bridge calls with Ed25519 from
# libsodium's libsodium.a (Debian's libsodium-dev), a small audited library with no config
# file, no dlopen and no engines (OpenSSL's libcrypto.a would add megabytes and its config).
LIBRARIES: dict[str, tuple[str, ...]] = {CLIENT: ("-lsodium",)}


class BuildError(RuntimeError):
    """A program could not be compiled (no compiler, or the compiler refused the sources)."""


def _checkout_root() -> Path | None:
    """The checkout this file is in (shared/lnk_shared/), or None when it is installed."""
    root = _HERE.parents[1]
    if _HERE.parent.name == "shared" and (root / "pyproject.toml").is_file():
        return root
    return None


def native_folder(room: str) -> Path:
    """The `native/` folder of `room`'s package, in this checkout or this installation."""
    if room not in CHECKOUT_FOLDERS:
        raise ValueError(f"no such room: {room} (one of {', '.join(CHECKOUT_FOLDERS)})")
    root = _checkout_root()
    base = _HERE.parent if root is None else root / CHECKOUT_FOLDERS[room]
    return base / room / "native"


def sources_of(program: str, folder: Path | None = None) -> list[str]:
    """The paths of `program`'s C files, as `SOURCES` lists them, in its room's folder (or in
    `folder`)."""
    if program not in SOURCES:
        raise ValueError(f"no such program: {program} (one of {', '.join(PROGRAMS)})")
    where = native_folder(ROOMS[program]) if folder is None else folder
    return [str(where / name) for name in SOURCES[program]]


def unlisted(folder: Path | None = None) -> list[str]:
    """The .c files that no program of their room lists, in every room's folder (or that no
    program lists, in `folder`): built into nothing until one does."""
    if folder is not None:
        listed = {name for names in SOURCES.values() for name in names}
        return sorted(p.name for p in folder.glob("*.c") if p.name not in listed)
    found = []
    for room in CHECKOUT_FOLDERS:
        listed = {
            name for program, names in SOURCES.items() if ROOMS[program] == room for name in names
        }
        found += [
            f"{room}/{p.name}" for p in native_folder(room).glob("*.c") if p.name not in listed
        ]
    return sorted(found)


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
