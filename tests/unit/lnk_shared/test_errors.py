"""The error tree in `lnk_shared.errors`' docstring is the real one: every subclass of LnkError
in the source is drawn under its real base, nothing drawn is missing from the source, and no
two errors share a name (one definition of each, so a name in a body or a log is one error).
Read from the source with `ast`, so no service's modules are imported to see their errors."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

from lnk_shared import errors
from lnk_shared.errors import LnkError, RefusedError, RemoteError, SpecError

ROOT = Path(__file__).resolve().parents[3]
SOURCES = [ROOT / "shared", ROOT / "services", ROOT / "cli", ROOT / "sandbox", ROOT / "admin"]
SKIPPED_PARTS = {"migrations", "__pycache__", "build"}
UNIT = 4  # characters of one level of the drawn tree ("├── ", "│   ")
_DRAWN = re.compile(r"^    (?P<prefix>(?:[│ ]   |[├└]── )*)(?P<name>[A-Z]\w*)\b")


def drawn(doc: str) -> dict[str, str | None]:
    """Each name drawn in the docstring's tree -> the name drawn above it (None for the root)."""
    lines = doc.split("\n\n")[1].splitlines()  # the tree: the docstring's second paragraph
    parents: dict[str, str | None] = {}
    stack: list[str] = []
    for line in lines:
        found = _DRAWN.match(line)
        if found is None:
            continue
        depth = len(found["prefix"]) // UNIT
        del stack[depth:]
        name = found["name"]
        assert name not in parents, f"{name} is drawn twice"
        parents[name] = stack[-1] if stack else None
        stack.append(name)
    return parents


@functools.cache
def defined() -> tuple[dict[str, str | None], list[str]]:
    """Every subclass of LnkError in the source -> its base (None for LnkError), and each name
    defined more than once (where)."""
    classes: list[tuple[str, list[str], str]] = []
    for root in SOURCES:
        for path in sorted(root.rglob("*.py")):
            if SKIPPED_PARTS.intersection(path.relative_to(root).parts):
                continue
            for node in ast.parse(path.read_text(encoding="utf-8")).body:  # errors: top level
                if isinstance(node, ast.ClassDef):
                    bases = [
                        b.id if isinstance(b, ast.Name) else b.attr
                        for b in node.bases
                        if isinstance(b, ast.Name | ast.Attribute)
                    ]
                    classes.append((node.name, bases, str(path.relative_to(ROOT))))
    parents: dict[str, str | None] = {"LnkError": None}
    grew = True
    while grew:
        grew = False
        for name, bases, _ in classes:
            base = next((b for b in bases if b in parents), None)
            if name not in parents and base is not None:
                parents[name] = base
                grew = True
    where: dict[str, list[str]] = {}
    for name, _, path in classes:
        if name in parents:
            where.setdefault(name, []).append(path)
    twice = [f"{n}: {', '.join(p)}" for n, p in sorted(where.items()) if len(p) > 1]
    return parents, twice


def test_the_docstrings_tree_is_every_error_under_its_real_base() -> None:
    real, _ = defined()
    shown = drawn(errors.__doc__ or "")
    assert sorted(set(real) - set(shown)) == [], "errors missing from the docstring's tree"
    assert sorted(set(shown) - set(real)) == [], "drawn in the tree, defined nowhere"
    assert {n: b for n, b in shown.items() if real[n] != b} == {}, "drawn under the wrong base"


def test_no_two_errors_share_a_name() -> None:
    _, twice = defined()
    assert twice == []


def test_the_scan_sees_a_misdrawn_tree_and_a_second_definition() -> None:
    """Neither check is vacuous: a tree drawn one level off is read so, and a duplicate found."""
    doc = "Errors.\n\n    LnkError   x\n    └── StateError   y\n        └── ProbesFailed\n"
    assert drawn(doc) == {"LnkError": None, "StateError": "LnkError", "ProbesFailed": "StateError"}
    assert drawn(doc.replace("        └── Probes", "    └── Probes"))["ProbesFailed"] == "LnkError"
    assert defined()[0]["KeyRefused"] == "RefusedError"


@pytest.mark.parametrize(
    ("error", "codes"),
    [
        (LnkError("x"), (1, 125)),
        (errors.UsageError("x"), (2, 125)),
        (SpecError("x", source="a.toml", line=2, key="k"), (2, 125)),
        (errors.ProgramNotFoundError("x"), (2, 127)),
        (errors.ProgramCannotRunError("x"), (2, 126)),
        (errors.ConfigError("x"), (2, 125)),
        (RefusedError("e", "w"), (3, 126)),
        (errors.LaunchRefused("e", "w"), (3, 126)),
        (errors.NotConfirmedError("x"), (1, 126)),
        (errors.StateError("x"), (1, 125)),
        (RemoteError("x", 3, 126), (3, 126)),
        (RemoteError("x", 2), (2, 125)),
    ],
)
def test_each_error_has_the_readmes_statuses(error: LnkError, codes: tuple[int, int]) -> None:
    assert (error.exit_code, error.run_exit_code) == codes


def test_an_entry_and_a_spec_location_are_shown_safely() -> None:
    assert str(RefusedError("a\x1bb", "why")) == "refused [refused]: a\\x1bb: why"
    assert str(SpecError("bad", source="f\u202e.toml", line=3, key="k")).startswith("f")
    assert "\u202e" not in str(SpecError("bad", source="f\u202e.toml", line=3, key="k"))


def test_an_error_said_elsewhere_keeps_its_class_and_the_words_whole() -> None:
    heard = errors.CommandRefused.said("the controller refused: refused [command]: x: y")
    assert type(heard) is errors.CommandRefused and heard.exit_code == 3
    assert isinstance(heard, RefusedError) and heard.why == str(heard)
    spec = errors.ProgramNotFoundError.said("no such program")
    assert spec.run_exit_code == 127 and isinstance(spec, SpecError) and spec.problem == str(spec)
