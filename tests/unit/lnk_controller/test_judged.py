"""A judged launch as values: which of its programs are bound as the very file judged."""

from __future__ import annotations

import stat

from lnk_controller.judged import Judged, program_files
from lnk_shared.grants import Grants, Identity, ResolvedSpec


def _judged(execute: tuple[str, ...], identities: dict[str, Identity]) -> Judged:
    spec = ResolvedSpec(None, (), (), (), False, False, (), False, False, (), (), (), ())
    return Judged(Grants(spec, (), ()), "d", "k", execute[0], execute, None, None, identities)


def test_only_programs_judged_as_regular_files_are_program_files() -> None:
    ids = {
        "/usr/bin/git": Identity(1, 2, stat.S_IFREG),
        "/home/o/tools": Identity(1, 3, stat.S_IFDIR),
    }
    judged = _judged(("/usr/bin/git", "/home/o/tools", "/usr/bin/env"), ids)
    assert program_files(judged) == frozenset({"/usr/bin/git"})  # env: no identity, not bound


def test_the_users_env_is_never_in_a_repr_nor_compared() -> None:
    judged = _judged(("/bin/sh",), {})
    with_env = Judged(**{**judged.__dict__, "env": {"TOKEN": "secret-value"}})
    assert "secret-value" not in repr(with_env)
    assert with_env == judged
