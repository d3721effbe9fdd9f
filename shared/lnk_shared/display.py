"""Text that came from a spec, a path, a sandbox or a log, made safe to show a person.

`shown(text)` is the one escaping function for everything lnk box prints that it did not write
itself: a TOML key, a path and a link's target, a host name, a sandbox's command, a wire log
line, a check's finding. Every character Python does not call printable (`str.isprintable`:
the categories Cc, Cf, Cs, Co, Cn, Zl, Zp and every Zs but the space) is replaced by a visible
escape, as `repr` writes it:

    C0 controls, DEL, C1 controls (U+0080..U+009F, U+009B CSI included)   \\x1b  \\x9b  \\x7f
    tab, line feed, carriage return                                      \\t  \\n  \\r
    bidi controls (U+202A..U+202E, U+2066..U+2069, U+200E/F, U+061C)    \\u202e
    zero-width characters (U+200B..U+200D, U+2060, U+FEFF), soft hyphen  \\u200b
    line and paragraph separators, no-break and other odd spaces        \\u2028  \\xa0
    lone surrogates (a file name's bytes that are not UTF-8)            \\udcff
    anything outside the BMP that is not printable                      \\U000e0001

so a hostile name cannot move the cursor, redraw or erase the question that asks for consent,
reverse the order of what follows it, hide a character, or crash the printer with a byte the
terminal's encoding cannot hold.

`shown` is idempotent (its output is printable ASCII where it changed anything), so a message
that holds an already shown name can pass through it again at the point it is printed:
`shown_lines` does that for a message of several lines, keeping only its own line breaks.

Security limitations: a backslash is NOT escaped (so that `shown` is idempotent): a name that
holds the four characters `\\x1b` reads the same as one that holds ESC. Printable look-alikes
(a Cyrillic letter for a Latin one, full-width letters) are NOT changed: they are printable
text, and the exact bytes are in `--json`. This does NOT shorten text; callers cut it.
"""

from __future__ import annotations

__all__ = ["shown", "shown_cut", "shown_lines"]

_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape(char: str) -> str:
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def shown(text: str) -> str:
    """`text` with every character that is not printable written as a visible escape."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escape(c) for c in text)


def shown_lines(text: str) -> str:
    """A message of several lines, each `shown`: its own line breaks stay, nothing else does."""
    return "\n".join(shown(line) for line in text.split("\n"))


def shown_cut(text: str, limit: int) -> str:
    """`shown(text)` cut to at most `limit` characters, never in the middle of an escape."""
    out: list[str] = []
    used = 0
    for char in text:
        piece = char if char.isprintable() else _escape(char)
        if used + len(piece) > limit:
            break
        out.append(piece)
        used += len(piece)
    return "".join(out)
