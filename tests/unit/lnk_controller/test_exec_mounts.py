"""Where code may be mapped under a finite list: the library folders the cache names, each
granted program under /usr and the folders it maps code from; never a folder that holds
programs the list does not grant."""

from __future__ import annotations

import os

import pytest

from lnk_controller.exec_mounts import (
    TOO_BROAD,
    _parse_cache,
    exec_binds,
    library_folders,
    program_folders,
)

LIBS = ("/usr/lib/x86_64-linux-gnu",)


@pytest.mark.parametrize(
    ("program", "folders"),
    [
        (
            "/usr/bin/python3.11",
            (
                "/usr/lib/python3.11",
                "/usr/lib/python3/dist-packages",
                "/usr/local/lib/python3.11/dist-packages",
            ),
        ),
        ("/usr/bin/git", ("/usr/lib/git-core", "/usr/libexec/git-core")),
        ("/usr/bin/dash", ()),
        ("/usr/bin/python3-config", ()),  # not an interpreter: a script of its own
        ("/usr/bin/gitk", ()),
    ],
)
def test_program_folders(program: str, folders: tuple[str, ...]) -> None:
    assert program_folders(program) == folders


@pytest.mark.parametrize(
    ("cache", "loaders", "folders"),
    [
        (["/usr/lib/x86_64-linux-gnu"], [], ("/usr/lib/x86_64-linux-gnu",)),
        (
            ["/usr/lib/x86_64-linux-gnu/libfakeroot", "/usr/local/cuda/lib"],
            ["/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"],
            (
                "/usr/lib/x86_64-linux-gnu",
                "/usr/lib/x86_64-linux-gnu/libfakeroot",
                "/usr/local/cuda/lib",
            ),
        ),
        # folders that hold ungranted programs are never made exec-capable whole
        (["/usr/lib", "/usr/bin", "/usr/local/lib", "/usr/libexec"], [], ()),
        # outside /usr: not made noexec, so nothing to bind over
        (["/opt/vendor/lib"], [], ()),
        ([], [], ()),
    ],
)
def test_library_folders(cache: list[str], loaders: list[str], folders: tuple[str, ...]) -> None:
    assert library_folders(cache, loaders) == folders


def test_granted_programs_under_usr_are_bound_alone_after_the_libraries() -> None:
    binds = exec_binds(["/usr/bin/dash", "/usr/bin/basename"], LIBS)
    assert binds == ("/usr/bin/basename", "/usr/bin/dash", "/usr/lib/x86_64-linux-gnu")


def test_a_program_outside_usr_and_any_program_are_not_bound_here() -> None:
    assert exec_binds(["/", "/opt/tool/bin/tool", "/home/u/bin/x"], LIBS) == LIBS


def test_a_path_inside_a_bound_folder_is_left_to_it() -> None:
    binds = exec_binds(["/usr/lib/x86_64-linux-gnu/helper"], LIBS)
    assert binds == LIBS


def test_a_granted_python_brings_its_standard_library_and_site_folders() -> None:
    binds = exec_binds(["/usr/bin/python3.11"], LIBS)
    assert "/usr/lib/python3.11" in binds
    assert "/usr/lib/python3/dist-packages" in binds
    assert "/usr/bin/python3.11" in binds
    assert "/usr/bin/python3" not in binds  # only the real path is granted


def test_nothing_too_broad_is_ever_bound() -> None:
    binds = exec_binds(["/usr/bin", "/usr/lib"], [*LIBS, "/usr/lib"])
    assert not set(binds) & TOO_BROAD


def test_an_empty_list_binds_only_the_libraries() -> None:
    assert exec_binds([], LIBS) == LIBS
    assert exec_binds([], []) == ()


def test_the_cache_listing_gives_each_librarys_real_folder() -> None:
    text = (
        "524 libs found in cache `/etc/ld.so.cache'\n"
        "\tlibc.so.6 (libc6,x86-64) => /lib/x86_64-linux-gnu/libc.so.6\n"
        "\tlibz.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libz.so.1\n"
        "\tbogus line\n"
        "\tlibx.so (libc6) => relative/libx.so\n"
    )

    assert _parse_cache(text) == (os.path.realpath("/lib/x86_64-linux-gnu"),)
