"""The one escaping function: every hostile class shown as an escape, printable text as is."""

from __future__ import annotations

import pytest

from lnk_shared import display
from lnk_shared.display import shown, shown_cut, shown_lines

HOSTILE = [
    # C0, DEL, ESC, BEL, CR/LF: cursor moves, erases, bells, forged lines
    ("\x00", "\\x00"),
    ("\x07", "\\x07"),
    ("\x08", "\\x08"),
    ("\t", "\\t"),
    ("\n", "\\n"),
    ("\r", "\\r"),
    ("\x1b[2J\x1b[H", "\\x1b[2J\\x1b[H"),
    ("\x1b]0;title\x07", "\\x1b]0;title\\x07"),
    ("\x1f", "\\x1f"),
    ("\x7f", "\\x7f"),
    # C1, the 8-bit CSI first: a terminal in 8-bit mode reads U+009B as ESC [
    ("\x80", "\\x80"),
    ("\x9b2J", "\\x9b2J"),
    ("\x9d0;x\x9c", "\\x9d0;x\\x9c"),
    ("\x9f", "\\x9f"),
    # bidi controls: what follows reads reversed
    ("\u202a", "\\u202a"),
    ("\u202b", "\\u202b"),
    ("\u202c", "\\u202c"),
    ("\u202d", "\\u202d"),
    ("evil\u202egpj.sh", "evil\\u202egpj.sh"),
    ("\u2066", "\\u2066"),
    ("\u2067", "\\u2067"),
    ("\u2068", "\\u2068"),
    ("\u2069", "\\u2069"),
    ("\u200e", "\\u200e"),
    ("\u200f", "\\u200f"),
    ("\u061c", "\\u061c"),
    # zero-width: two names that look alike
    ("~/wo\u200brk", "~/wo\\u200brk"),
    ("\u200c", "\\u200c"),
    ("\u200d", "\\u200d"),
    ("\u2060", "\\u2060"),
    ("\ufeff", "\\ufeff"),
    ("\xad", "\\xad"),
    # line separators and odd spaces
    ("\u2028", "\\u2028"),
    ("\u2029", "\\u2029"),
    ("a\xa0b", "a\\xa0b"),
    # lone surrogates: a file name's bytes that are not UTF-8 (surrogateescape)
    ("bad\udcff", "bad\\udcff"),
    ("\ud800", "\\ud800"),
    # tags and other non-printables outside the BMP
    ("\U000e0001", "\\U000e0001"),
]

PRINTABLE = [
    "",
    "~/src/app",
    "/srv/data with spaces",
    "back\\slash",
    "café/日本語/ü",
    "pypi.org",
    "*.pythonhosted.org",
    "emoji 🙂",
]


@pytest.mark.parametrize(("hostile", "expected"), HOSTILE)
def test_hostile_characters_are_shown_as_escapes(hostile: str, expected: str) -> None:
    assert shown(hostile) == expected


@pytest.mark.parametrize(("hostile", "expected"), HOSTILE)
def test_what_is_shown_is_printable_and_encodes(hostile: str, expected: str) -> None:
    out = shown(hostile)
    assert out.isprintable()
    out.encode("ascii")  # every escape is ASCII: no terminal encoding can refuse it


@pytest.mark.parametrize("text", PRINTABLE)
def test_printable_text_is_shown_as_is(text: str) -> None:
    assert shown(text) == text


@pytest.mark.parametrize("text", [h for h, _ in HOSTILE] + PRINTABLE)
def test_shown_is_idempotent(text: str) -> None:
    assert shown(shown(text)) == shown(text)


def test_every_c0_c1_and_del_is_escaped() -> None:
    for code in [*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0)]:
        assert shown(chr(code)).startswith("\\"), hex(code)


def test_shown_lines_keeps_only_its_own_line_breaks() -> None:
    assert shown_lines("first\nsecond \x1b[A\r") == "first\nsecond \\x1b[A\\r"


@pytest.mark.parametrize(
    ("text", "limit", "expected"),
    [
        ("abcdef", 4, "abcd"),
        ("ab\x1bcd", 5, "ab"),  # the escape would be cut in two: it is left out whole
        ("ab\x1bcd", 6, "ab\\x1b"),
        ("\u202e" * 10, 13, "\\u202e\\u202e"),
        ("", 3, ""),
    ],
)
def test_shown_cut_never_cuts_an_escape_in_two(text: str, limit: int, expected: str) -> None:
    assert shown_cut(text, limit) == expected
    assert len(shown_cut(text, limit)) <= limit


def test_all_is_exported() -> None:
    assert sorted(display.__all__) == sorted(set(display.__all__))
    for name in display.__all__:
        assert hasattr(display, name)
