"""Which placeholders a held start makes first: the first under each folder (its probe), in
the order they are made; the rest are left for the held start."""

from __future__ import annotations

import pytest

from lnk_controller.placeholder_plan import parent_of, split_probes


@pytest.mark.parametrize(
    ("entry", "parent"),
    [(".envrc", ""), (".git/config", ".git"), (".git/hooks", ".git"), ("a/b/c", "a/b")],
)
def test_parent_of(entry: str, parent: str) -> None:
    assert parent_of(entry) == parent


@pytest.mark.parametrize(
    ("names", "probes", "rest"),
    [
        ([], [], []),
        ([".envrc"], [".envrc"], []),
        ([".a", ".b", ".c"], [".a"], [".b", ".c"]),
        (
            [".a", ".git/commondir", ".git/config", ".z"],
            [".a", ".git/commondir"],
            [".git/config", ".z"],
        ),
        ([".git/config", ".git/hooks"], [".git/config"], [".git/hooks"]),
    ],
)
def test_the_first_under_each_folder_is_its_probe(
    names: list[str], probes: list[str], rest: list[str]
) -> None:
    entries = [(n, None if "/" not in n else b"") for n in names]
    got_probes, got_rest = split_probes(entries)
    assert [e for e, _ in got_probes] == probes
    assert [e for e, _ in got_rest] == rest
    assert sorted(got_probes + got_rest) == sorted(entries)  # each entry once, content kept
