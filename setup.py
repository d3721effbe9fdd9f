"""Build hook: compile the confiner, lnk-sandbox, and the launcher, lnk-spawn, into the package,
and the C client in place of the `lnk` script; all else is pyproject.toml.

`pip install .` (scripts/install) and `pip wheel` (the Ansible deploy, the compose image) both
run build_py and build_scripts, so every installed copy has the binaries at
lnk_controller/native/lnk-sandbox and lnk_controller/native/lnk-spawn (mode 0755: where the
controller's config looks for them, though the confiner's sources are the in-sandbox room's,
sandbox/lnk_inside/native/), and `bin/lnk` is the C client (cli/lnk_cli/native/lnk_client.c),
which runs the Python CLI (cli/bin/lnk's entry point) for all but a plain `lnk sandbox run`
without a terminal; `bin/lnk-connect` beside it is ssh's ProxyCommand inside a sandbox
(sandbox/lnk_inside/native/lnk_connect.c). Every source is listed in lnk_shared/native_build.py.
The proxy's strict JSON pass (services/proxy/lnk_proxy/native/json_scan.c) is a CPython
extension module, lnk_proxy._json_scan, built against the Python that builds the wheel (Debian's
python3-dev), so the wheel is tagged for that Python and platform (cp311-cp311-<platform>), as is
the controller's, lnk_controller._placeholder_calls (lnk_controller/ext/placeholder_calls.c: a
write grant's placeholder syscalls in batches, made with the GIL released) and
lnk_controller._placeholder_pool (ext/placeholder_pool.c: those placeholders renamed in from
the owner's pool and back).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from setuptools import Distribution, Extension, setup
from setuptools.command.build_py import build_py

NATIVE_BUILD = Path(__file__).resolve().parent / "shared/lnk_shared/native_build.py"


def _native_build() -> ModuleType:
    """lnk_shared/native_build.py, loaded by path: the packages are not importable while
    building."""
    spec = importlib.util.spec_from_file_location("lnk_native_build", NATIVE_BUILD)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {NATIVE_BUILD}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildPyWithNative(build_py):
    def run(self) -> None:
        super().run()
        native = _native_build()
        for program in (native.CONFINER, native.SPAWNER):  # the client goes to bin/, below
            native.build(
                Path(self.build_lib) / "lnk_controller" / "native" / program, program=program
            )


# setuptools has no build_scripts module of its own: the class it runs is distutils', which its
# distribution names (importing distutils directly would pick the stdlib's on 3.11).
build_scripts = Distribution().get_command_class("build_scripts")


class BuildScriptsWithClient(build_scripts):  # type: ignore[misc,valid-type]
    def run(self) -> None:
        super().run()
        native = _native_build()
        native.build(Path(self.build_dir) / "lnk", program=native.CLIENT)
        # ssh's ProxyCommand inside a sandbox, beside the client (box_client.py grants both)
        native.build(Path(self.build_dir) / native.CONNECTOR, program=native.CONNECTOR)


# The proxy's one pass over a model request's body before msgspec parses it (strict_json.py).
# No static flag: an extension module is loaded by the interpreter, not run on its own.
JSON_SCAN = Extension(
    "lnk_proxy._json_scan",
    sources=[
        "services/proxy/lnk_proxy/native/json_scan.c",  # the pass (json_scan.h)
        "services/proxy/lnk_proxy/native/json_scan_module.c",  # its CPython module
    ],
    extra_compile_args=[
        "-std=c11",
        "-O2",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-D_FORTIFY_SOURCE=2",
        "-fstack-protector-strong",
    ],
)


# A write grant's placeholder syscalls in batches with the GIL released (placeholder_make.py).
# The openat2 walk, the owner's-credentials mkdir and the sealing both share
# (ext/placeholder_syscalls.h: `depends`, so a change to it rebuilds both).
PLACEHOLDER_SYSCALLS = ["services/controller/lnk_controller/ext/placeholder_syscalls.h"]
PLACEHOLDER_CALLS = Extension(
    "lnk_controller._placeholder_calls",
    sources=["services/controller/lnk_controller/ext/placeholder_calls.c"],
    depends=PLACEHOLDER_SYSCALLS,
    extra_compile_args=JSON_SCAN.extra_compile_args,
)

# The placeholders' pool (placeholder_pool.py): empty folders renamed into a write grant's
# folder and back, so a launch neither makes nor frees an inode for them.
PLACEHOLDER_POOL = Extension(
    "lnk_controller._placeholder_pool",
    sources=["services/controller/lnk_controller/ext/placeholder_pool.c"],
    depends=PLACEHOLDER_SYSCALLS,
    extra_compile_args=JSON_SCAN.extra_compile_args,
)


setup(
    ext_modules=[
        JSON_SCAN,
        PLACEHOLDER_CALLS,
        PLACEHOLDER_POOL,
    ],  # a platform wheel for this Python (bdist_wheel's own tag)
    cmdclass={
        "build_py": BuildPyWithNative,
        "build_scripts": BuildScriptsWithClient,
    },
)
