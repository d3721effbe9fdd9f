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
The wheel holds binaries for one platform, so it is tagged for it (py3-none-<platform>).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from setuptools import Distribution, setup
from setuptools.command.bdist_wheel import bdist_wheel
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


class BinaryDistribution(Distribution):
    def has_ext_modules(self) -> bool:
        return True  # a compiled program inside: a platform wheel, installed to platlib


class PlatformWheel(bdist_wheel):
    def get_tag(self) -> tuple[str, str, str]:
        _python, _abi, platform = super().get_tag()
        return "py3", "none", platform  # no Python extension: any Python 3, this platform


setup(
    distclass=BinaryDistribution,
    cmdclass={
        "build_py": BuildPyWithNative,
        "build_scripts": BuildScriptsWithClient,
        "bdist_wheel": PlatformWheel,
    },
)
