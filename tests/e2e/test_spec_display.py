"""What a spec says reaches the owner's terminal only as visible escapes, and a spec too large to
be one is refused before it is parsed, by the client and by the controller.

The attacker writes a spec (or names folders and links a spec opens) holding every hostile
character class: C0 (ESC sequences that clear the screen, BEL, CR/LF that forge a line), DEL,
C1 (the 8-bit CSI U+009B), bidi overrides, zero-width characters and a file name that is not
UTF-8. The question that asks for consent is read on a real pty: each class shows as an escape
and none reaches the terminal raw.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from as_user import as_user
from on_pty import PROMPT, answer_on_pty

RunningBox = Any  # tests/e2e/conftest.py

pytestmark = pytest.mark.needs_root

PREFIX = Path(os.environ.get("LNK_PREFIX", "/opt/lnk"))
LNK = PREFIX / "venv" / "bin" / "lnk"
LNK_PYTHON = PREFIX / "venv" / "bin" / "python"
MAX_SPEC_BYTES = 256 * 1024  # lnk_shared.spec_size.MAX_SPEC_BYTES
EXIT_USAGE = 2
EXIT_RUN_ERROR = 125  # lnk_shared.errors: lnk's own error in a run

# Each hostile class, as it is in a name, and how it must be shown.
HOSTILE = "x\x1b[2J\x07\r\n\x7f\x9b31m\u202eevil\u2066\u200b\ufeff\u061cy"
HOSTILE_SHOWN = "x\\x1b[2J\\x07\\r\\n\\x7f\\x9b31m\\u202eevil\\u2066\\u200b\\ufeff\\u061cy"
# A spec may not write C0 or DEL in a path (refused as it is read): the rest, written in the spec.
WRITTEN = "w\x9b31m\u202eevil\u2066\u200b\ufeff\u061cz"
WRITTEN_SHOWN = "w\\x9b31m\\u202eevil\\u2066\\u200b\\ufeff\\u061cz"
# What must never reach the terminal raw (CR and LF are the pty's own around lines).
RAW = ["\x1b", "\x07", "\x7f", "\x9b", "\u202e", "\u2066", "\u200b", "\ufeff", "\u061c"]


def toml_string(text: str) -> str:
    """A TOML basic string holding `text`, every character outside printable ASCII escaped."""
    out = "".join(c if " " <= c <= "~" and c not in '"\\' else f"\\u{ord(c):04x}" for c in text)
    return f'"{out}"'


@pytest.fixture
def hostile_folders(running_box: RunningBox) -> Iterator[Path]:
    """A base in the owner's home: a folder with every hostile class in its name, root's link to
    it, a folder whose name is not UTF-8 and root's link to that, the owner's link to the first.
    Removed afterwards."""
    owner = running_box.owner
    base = owner.home / f"display-{secrets.token_hex(4)}"
    (base / HOSTILE).mkdir(parents=True)
    (base / WRITTEN).mkdir()
    raw = os.fsencode(base) + b"/bad\xff\xfe"
    os.mkdir(raw)
    subprocess.run(["chown", "-R", f"{owner.uid}:{owner.gid}", str(base)], check=True)
    # root's links (as an administrator leaves them): a grant may go through those
    (base / "to-hostile").symlink_to(base / HOSTILE)
    os.symlink(raw, os.fsencode(base / "to-bytes"))
    # the owner's link (what any user can make): refused, and the refusal quotes its target
    (base / "owners-link").symlink_to(base / HOSTILE)
    os.lchown(base / "owners-link", owner.uid, owner.gid)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _write_spec(running_box: RunningBox, path: Path, text: str) -> Path:
    path.write_text(text)
    os.chown(path, running_box.owner.uid, running_box.owner.gid)
    return path


def _assert_no_raw(text: str) -> None:
    for char in RAW:
        assert char not in text, f"{char!r} reached the terminal raw"


def test_the_question_on_a_real_pty_shows_every_hostile_class_as_escapes(
    running_box: RunningBox, hostile_folders: Path
) -> None:
    base = hostile_folders
    spec = _write_spec(
        running_box,
        base / "spec.toml",
        "[folders]\nread = ["
        + ", ".join(toml_string(str(p)) for p in (base / WRITTEN, base / "to-hostile"))
        + f", {toml_string(str(base / 'to-bytes'))}]\n",
    )
    owner = running_box.owner
    marker = base / "ran"
    status, seen = answer_on_pty(
        as_user(
            owner.uid,
            owner.gid,
            str(LNK),
            "sandbox",
            "run",
            "--spec",
            str(spec),
            "--command=touch",
            "--",
            "/usr/bin/touch",
            str(marker),
        ),
        "n",
        env=running_box.owner_env(),
        cwd=owner.home,
    )
    text = seen.decode("utf-8", errors="surrogateescape")
    assert PROMPT.decode() in text, text
    assert status == 126, text  # declined: not approved is a run's refusal
    assert not marker.exists()
    assert f"{base}/{WRITTEN_SHOWN}" in text, text
    assert text.count(f"{base}/{HOSTILE_SHOWN}") == 2, text  # the link's real path and target
    assert f"{base}/bad\\udcff\\udcfe" in text, text  # not UTF-8: its bytes as escapes
    _assert_no_raw(text)
    assert "\udcff" not in text and "\ufffd" not in text


def test_spec_show_prints_the_same_escapes(running_box: RunningBox, hostile_folders: Path) -> None:
    base = hostile_folders
    spec = _write_spec(
        running_box,
        base / "spec.toml",
        f"[folders]\nread = [{toml_string(str(base / 'to-hostile'))}]\n",
    )
    result = running_box.as_owner("spec", "show", "--spec", str(spec))
    assert result.returncode == 0, result.stderr
    assert f"{base}/{HOSTILE_SHOWN}" in result.stdout
    _assert_no_raw(result.stdout + result.stderr)
    shown_json = running_box.as_owner("spec", "show", "--spec", str(spec), "--json")
    assert json.loads(shown_json.stdout)["paths"]["read"][0]["real"] == str(base / HOSTILE)


@pytest.mark.parametrize("command", [["spec", "show"], ["sandbox", "run", "--yes"]])
def test_a_hostile_toml_key_is_named_as_escapes_in_the_error(
    running_box: RunningBox, hostile_folders: Path, command: list[str]
) -> None:
    """The same error from the CLI's own reading (spec show) and from the controller's, which
    the C client prints as it comes (sandbox run without a terminal)."""
    spec = _write_spec(
        running_box,
        hostile_folders / "spec.toml",
        f"[folders]\n{toml_string(HOSTILE)} = []\n",  # a key may hold C0 too
    )
    rest = ["--", "/bin/true"] if command[0] == "sandbox" else []
    result = running_box.as_owner(*command, "--spec", str(spec), *rest)
    assert result.returncode == (EXIT_RUN_ERROR if rest else EXIT_USAGE), result.stderr
    assert HOSTILE_SHOWN in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    _assert_no_raw(result.stdout + result.stderr)


def test_a_refusal_quoting_a_hostile_link_target_shows_it_as_escapes(
    running_box: RunningBox, hostile_folders: Path
) -> None:
    """The link is the owner's, so the controller refuses it naming where it points: that text
    is the attacker's, and the C client prints the controller's message as it comes."""
    spec = _write_spec(
        running_box,
        hostile_folders / "spec.toml",
        f"[folders]\nread = [{toml_string(str(hostile_folders / 'owners-link'))}]\n",
    )
    result = running_box.as_owner("sandbox", "run", "--yes", "--spec", str(spec), "--", "/bin/true")
    assert result.returncode == 126, result.stderr  # refused: a run's status
    assert "link-owner" in result.stderr
    assert f"{hostile_folders}/{HOSTILE_SHOWN}" in result.stderr, result.stderr
    _assert_no_raw(result.stdout + result.stderr)


# --- size ---------------------------------------------------------------------------------------

# The spec's grants come first and the padding after: a controller that parsed only the first
# bytes it read would see a valid spec and run the program.
SEND_DIRECT = """
import json, os, socket, sys
from lnk_cli.launch_dialogue import launch_request, no_flags
from lnk_shared.unix import recv_frame, send_frame
spec, run_dir, witness = sys.argv[1:4]
request = launch_request(["/usr/bin/touch", witness], no_flags(), yes=True)
request["fds"]["spec"] = 3
fd = os.open(spec, os.O_RDONLY | os.O_CLOEXEC)
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect(os.path.join(run_dir, "launch.sock"))
send_frame(sock, request, [0, 1, 2, fd])
while True:
    message, fds = recv_frame(sock, want_fds=True)
    for extra in fds:
        os.close(extra)
    if message.get("type") in ("exit", "error"):
        print(json.dumps(message))
        break
    if message.get("type") == "open":
        print(json.dumps(message))
        break
"""


def _padded_spec(running_box: RunningBox, base: Path, size: int) -> tuple[Path, Path]:
    out = base / "out"
    out.mkdir()
    os.chown(out, running_box.owner.uid, running_box.owner.gid)
    head = f'[folders]\nwrite = ["{out}"]\n[commands]\nallow = ["touch"]\n'
    spec = _write_spec(running_box, base / "big.toml", head + "#" * (size - len(head) - 1) + "\n")
    return spec, out / f"ran-{secrets.token_hex(4)}"


def test_an_oversized_spec_sent_to_the_launch_socket_is_refused_by_the_controller(
    running_box: RunningBox, hostile_folders: Path
) -> None:
    spec, witness = _padded_spec(running_box, hostile_folders, 10 * 1024 * 1024)
    owner = running_box.owner
    sent = subprocess.run(
        as_user(
            owner.uid,
            owner.gid,
            str(LNK_PYTHON),
            "-I",
            "-c",
            SEND_DIRECT,
            str(spec),
            str(running_box.run_dir),
            str(witness),
        ),
        env=running_box.owner_env(),
        cwd=str(owner.home),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert sent.returncode == 0, sent.stderr
    answer = json.loads(sent.stdout.strip().splitlines()[-1])
    assert answer["type"] == "error", answer
    assert answer["exit"] == EXIT_USAGE
    assert f"larger than {MAX_SPEC_BYTES} bytes" in answer["message"]
    assert not witness.exists()


def test_an_oversized_spec_is_refused_by_the_client_before_it_is_sent(
    running_box: RunningBox, hostile_folders: Path
) -> None:
    spec, witness = _padded_spec(running_box, hostile_folders, MAX_SPEC_BYTES + 1)
    result = running_box.as_owner(
        "sandbox", "run", "--yes", "--spec", str(spec), "--", "/usr/bin/touch", str(witness)
    )
    assert result.returncode == EXIT_RUN_ERROR, result.stderr
    assert f"{spec}: the spec is larger than {MAX_SPEC_BYTES} bytes" in result.stderr
    assert not witness.exists()
    shown = running_box.as_owner("spec", "show", "--spec", str(spec))
    assert shown.returncode == EXIT_USAGE and "larger than" in shown.stderr


def test_a_spec_at_the_limit_still_runs(running_box: RunningBox, hostile_folders: Path) -> None:
    spec, witness = _padded_spec(running_box, hostile_folders, MAX_SPEC_BYTES)
    assert spec.stat().st_size == MAX_SPEC_BYTES
    result = running_box.as_owner(
        "sandbox", "run", "--yes", "--spec", str(spec), "--", "/usr/bin/touch", str(witness)
    )
    assert result.returncode == 0, result.stderr
    assert witness.exists()
