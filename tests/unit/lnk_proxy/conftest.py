"""The proxy's C pass over model request bodies (lnk_proxy/native/json_scan.c), compiled once
per session from this checkout's source with this interpreter's headers and put where
strict_json imports it from, before any test module imports strict_json: the unit tests run
the checkout's sources (scripts/dev-pytest), whose lnk_proxy folder holds no built module, and
must exercise the pass, not the fallback without it. A build that fails fails every test here
(the pass is part of what is tested), with the compiler's message."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from types import ModuleType

NATIVE = Path(__file__).resolve().parents[3] / "services/proxy/lnk_proxy/native"
SOURCES = (NATIVE / "json_scan.c", NATIVE / "json_scan_module.c")  # setup.py's JSON_SCAN
# setup.py's flags (its JSON_SCAN extension), plus what setuptools adds for a shared object.
FLAGS = ("-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-D_FORTIFY_SOURCE=2",
         "-fstack-protector-strong", "-fPIC", "-shared")  # fmt: skip


def build_json_scan(folder: Path) -> ModuleType:
    """json_scan.c compiled into `folder` and loaded as lnk_proxy._json_scan."""
    compiler = shutil.which("cc")
    if compiler is None:
        raise RuntimeError("no C compiler (cc) to build lnk_proxy._json_scan: install gcc")
    out = folder / ("_json_scan" + importlib.machinery.EXTENSION_SUFFIXES[0])
    include = sysconfig.get_paths()["include"]
    result = subprocess.run(
        [compiler, *FLAGS, f"-I{include}", "-o", str(out), *map(str, SOURCES)],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"building lnk_proxy._json_scan failed:\n{result.stderr}")
    spec = importlib.util.spec_from_file_location("lnk_proxy._json_scan", out)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {out}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


if "lnk_proxy._json_scan" not in sys.modules:
    _FOLDER = Path(tempfile.mkdtemp(prefix="lnk-json-scan-"))
    try:
        sys.modules["lnk_proxy._json_scan"] = build_json_scan(_FOLDER)
    finally:  # loaded: the mapping stays valid once the file is gone
        shutil.rmtree(_FOLDER, ignore_errors=True)
