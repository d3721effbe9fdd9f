"""The launch protocol for the C client: `lnk_launch_protocol.h`, written from
`lnk_shared.launch_protocol` so the C's limits, frame names and forwarded signals are the
Python definition's, never a second copy kept by hand. The header is checked in beside the C
client's sources; tests/unit/lnk_shared/test_launch_protocol_c.py writes it again and compares.

    python -m lnk_shared.launch_protocol_c > PATH/lnk_launch_protocol.h
"""

from __future__ import annotations

import sys

from lnk_shared import launch_protocol as protocol

__all__ = ["HEADER_NAME", "header"]

HEADER_NAME = "lnk_launch_protocol.h"
_LIMITS = (
    ("MAX_FRAME", "a frame's JSON, in bytes, either way"),
    ("MAX_FDS", "descriptors passed with one frame"),
    ("HEADER_BYTES", "a frame's length, big-endian, before its JSON"),
    ("MAX_ARGS", "arguments to the sandboxed program"),
    ("MAX_ARG_BYTES", "one argument"),
    ("MAX_TEXT", "cwd, path_env and a grant's path, in characters"),
    ("MAX_ENV_VALUE", "a terminal or locale variable's value"),
    ("MAX_TERMINAL", "rows and cols are below this"),
    ("MAX_STATUS", "an exit frame's status is 0 to this"),
)


def _frame_macro(kind: str) -> str:
    return "LNK_FRAME_" + kind.upper().replace("?", "_QUESTION")


def header() -> str:
    """The header's text."""
    lines = [
        "/* The launch socket's protocol for the C client, written by",
        " * `python -m lnk_shared.launch_protocol_c` from lnk_shared/launch_protocol.py, where",
        " * each frame, its fields, limits and order are defined: do not edit it here (a unit",
        " * test writes it again and compares). */",
        "#ifndef LNK_LAUNCH_PROTOCOL_H",
        "#define LNK_LAUNCH_PROTOCOL_H",
        "",
        f'#define LNK_LAUNCH_SOCKET "{protocol.LAUNCH_SOCKET}"',
        "",
        "/* Limits */",
    ]
    for name, what in _LIMITS:
        lines.append(f"#define LNK_{name} {getattr(protocol, name)} /* {what} */")
    lines += ["", "/* Frames, by who sends them: the client, then the controller */"]
    for kind in (*protocol.CLIENT_FRAMES, *protocol.SERVER_FRAMES):
        lines.append(f'#define {_frame_macro(kind)} "{kind}"')
    lines += [
        "",
        "/* The signals a client forwards to the program (<signal.h>'s names) */",
        f"#define LNK_FORWARDED_SIGNALS {', '.join(protocol.FORWARDED_SIGNALS)}",
        "",
        "#endif",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(header())
