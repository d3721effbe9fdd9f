"""The C client speaks the one launch protocol: its header is the one written from
`lnk_shared.launch_protocol` (written again here and compared), its limits and frame names come
from that header, and every field name its frames write or read is one the definition has. (The
bytes themselves are compared with the Python client's in tests/unit/lnk_cli/
test_native_client.py.)"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from lnk_shared import launch_protocol as protocol
from lnk_shared.launch_protocol_c import HEADER_NAME, header
from lnk_shared.spec_flags import FLAG_NAMES

ROOT = Path(__file__).resolve().parents[3]


def _source(name: str) -> Path:
    """The one file of this name in the tree (the C client's folder may move)."""
    found = [
        path
        for path in ROOT.rglob(name)
        if not {".git", "build", "dist", ".venv"} & set(path.relative_to(ROOT).parts)
    ]
    assert len(found) == 1, found
    return found[0]


def test_the_checked_in_header_is_the_one_the_definition_writes() -> None:
    checked_in = _source(HEADER_NAME).read_text()
    assert checked_in == header(), (
        f"write it again: python -m lnk_shared.launch_protocol_c > {_source(HEADER_NAME)}"
    )


def test_the_module_writes_the_header_on_stdout() -> None:
    ran = subprocess.run(
        [sys.executable, "-m", "lnk_shared.launch_protocol_c"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert ran.stdout == header()


def test_the_header_holds_every_limit_frame_and_signal_of_the_definition() -> None:
    text = header()
    defined = dict(re.findall(r"#define (LNK_\w+) (.+?)(?: /\*.*)?$", text, re.M))
    for name in ("MAX_FRAME", "MAX_FDS", "HEADER_BYTES", "MAX_ARGS", "MAX_ARG_BYTES"):
        assert int(defined[f"LNK_{name}"]) == getattr(protocol, name)
    frames = {value.strip('"') for key, value in defined.items() if key.startswith("LNK_FRAME_")}
    assert frames == set(protocol.CLIENT_FRAMES) | set(protocol.SERVER_FRAMES)
    assert defined["LNK_FORWARDED_SIGNALS"].split(", ") == list(protocol.FORWARDED_SIGNALS)
    assert defined["LNK_LAUNCH_SOCKET"] == f'"{protocol.LAUNCH_SOCKET}"'


def test_the_c_client_takes_its_limits_and_names_from_the_header() -> None:
    shared = _source("lnk_client.h").read_text()
    assert f'#include "{HEADER_NAME}"' in shared
    for name in ("MAX_FRAME", "MAX_FDS", "HEADER_BYTES"):
        assert re.search(rf"#define {name} LNK_{name}\b", shared), name
    client = _source("lnk_client.c").read_text()
    dialogue = _source("lnk_client_dialogue.c").read_text()
    assert "#define LAUNCH_SOCKET LNK_LAUNCH_SOCKET" in client
    assert '"launch.sock"' not in client + dialogue  # the name, as a C string
    assert "{LNK_FORWARDED_SIGNALS}" in dialogue
    assert not re.search(r'json_is\(type, "', dialogue)  # each frame's name is the header's


def _written_keys(c_text: str) -> set[str]:
    """The JSON keys C string literals write: `\\"name\\":`."""
    return set(re.findall(r'\\"(\w+)\\":', c_text))


def test_every_field_the_c_client_writes_or_reads_is_in_the_definition() -> None:
    client = _source("lnk_client.c").read_text()
    dialogue = _source("lnk_client_dialogue.c").read_text()
    sent = {name for kind in protocol.CLIENT_FRAMES for name in protocol.FIELDS[kind]}
    allowed = {protocol.TYPE} | sent | set(protocol.LAUNCH_FDS_FIELDS) | set(FLAG_NAMES)
    written = _written_keys(client) | _written_keys(dialogue)
    assert written - allowed == set()
    assert {"argv", "cwd", "path_env", "flags", "env", "fds", "with_fds", "signal"} <= written
    kinds = set(re.findall(r'\\"type\\":\\"([^\\"]+)\\"', client + dialogue))
    assert kinds == {protocol.LAUNCH, protocol.OPENED, protocol.SIGNAL}
    assert kinds <= set(protocol.CLIENT_FRAMES)
    read = set(re.findall(r'json_get\([^,]+, "(\w+)"\)', dialogue))
    answered = {name for kind in protocol.SERVER_FRAMES for name in protocol.FIELDS[kind]}
    assert read - ({protocol.TYPE} | answered) == set()
    assert {"paths", "lines", "status", "message", "run_exit"} <= read


def test_a_field_outside_the_definition_would_be_seen() -> None:
    """The scan is not vacuous: a key the definition lacks shows up."""
    assert _written_keys('text_str(t, "{\\"type\\":\\"signal\\",\\"pid\\":");') == {"type", "pid"}
