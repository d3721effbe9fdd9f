"""The quick path of `lnk sandbox run`: it takes exactly the plain form, sends the request the
full client would, speaks the same frames, and imports none of the heavy modules."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from lnk_cli import app, launch_dialogue
from lnk_cli.launch_dialogue import launch_request, no_flags, plain_run
from lnk_shared.spec_flags import flags_document
from lnk_shared.unix import recv_frame, send_frame

PLAIN = [
    (["--", "/bin/true"], (None, False, ["/bin/true"])),
    (["--yes", "--", "/bin/true", "-x"], (None, True, ["/bin/true", "-x"])),
    (["--spec", "a.toml", "--", "ls"], ("a.toml", False, ["ls"])),
    (["--spec=a.toml", "--yes", "--", "ls"], ("a.toml", True, ["ls"])),
    (["--yes", "--spec", "a", "--spec", "b", "--", "ls"], ("b", True, ["ls"])),
    (["--", "ls", "--", "--yes"], (None, False, ["ls", "--", "--yes"])),
]

NOT_PLAIN = [
    [],
    ["/bin/true"],  # no "--": argparse decides
    ["--"],  # no program
    ["--read", "/tmp", "--", "ls"],  # a spec flag: the full client
    ["--ye", "--", "ls"],  # an abbreviation argparse would accept
    ["--spec", "--", "ls"],
    ["--spec"],
    ["--spec="],
    ["--spec", "-x", "--", "ls"],
    ["-h"],
    ["--help", "--", "ls"],
    ["--yes", "--with-fd", "3:read", "--", "ls"],
]


@pytest.mark.parametrize(("words", "expected"), PLAIN)
def test_the_plain_form_is_read(words: list[str], expected: object) -> None:
    assert plain_run(words) == expected


@pytest.mark.parametrize("words", NOT_PLAIN)
def test_anything_else_goes_to_the_full_client(words: list[str]) -> None:
    assert plain_run(words) is None


@pytest.mark.parametrize(("words", "expected"), PLAIN)
def test_the_request_is_the_full_clients(words: list[str], expected: object) -> None:
    args = app.build_parser("sandbox").parse_args(["sandbox", "run", *words])
    command = args.program[1:] if args.program[:1] == ["--"] else args.program
    full = launch_request(command, flags_document(args), yes=bool(args.yes))
    spec, yes, quick_command = plain_run(words) or (None, False, [])
    assert (spec, launch_request(quick_command, no_flags(), yes=yes)) == (args.spec, full)


def _frames() -> launch_dialogue._Frames:
    from _json import encode_basestring_ascii, make_scanner

    return launch_dialogue._Frames(encode_basestring_ascii, make_scanner)


MESSAGES: list[object] = [
    {},
    {"type": "launch", "argv": ["/bin/echo", "héllo", "\x00\x1f\x7f", "\udcff", "🙂"]},
    {"n": [0, -1, 2**40], "t": True, "f": False, "z": None, "d": {"x": [[]], "y": ""}},
    {'q"uote\\': '\\"\n\r\t'},
]


@pytest.mark.parametrize("message", MESSAGES)
def test_frames_encode_as_json_does(message: dict[str, object]) -> None:
    text = _frames().encode(message)
    assert text == json.dumps(message, separators=(",", ":"))
    assert _frames().decode(text) == message


@pytest.mark.parametrize(
    "text",
    ['{"a":1,"a":2}', '{"a":1} ', "[1]", '{"a":NaN}', '{"a":Infinity}', "{", '{"a":1}{}'],
)
def test_frames_decode_only_one_strict_json_object(text: str) -> None:
    with pytest.raises(ValueError):
        _frames().decode(text)


def test_frames_refuse_what_a_request_never_holds() -> None:
    with pytest.raises(TypeError):
        _frames().encode({"x": 1.5})


def test_frames_and_descriptors_cross_to_the_controllers_frames(tmp_path: Path) -> None:
    frames = _frames()
    marker = tmp_path / "marker"
    marker.write_text("passed along")
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    fd = os.open(marker, os.O_RDONLY)
    try:
        frames.send(ours, {"type": "launch", "argv": ["ls"]}, [fd])
        message, got = recv_frame(theirs, want_fds=True)
        assert message == {"type": "launch", "argv": ["ls"]}
        assert len(got) == 1
        assert os.read(got[0], 100) == b"passed along"
        os.close(got[0])
        send_frame(theirs, {"type": "exit", "status": 7}, [fd])
        answer, received = frames.receive(ours)
        assert answer == {"type": "exit", "status": 7}
        assert len(received) == 1
        os.close(received[0])
        theirs.close()
        with pytest.raises(EOFError):
            frames.receive(ours)
    finally:
        os.close(fd)
        ours.close()
        theirs.close()


def test_an_oversized_frame_is_refused_before_it_is_read() -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ours, theirs:
        theirs.sendall((launch_dialogue.MAX_FRAME + 1).to_bytes(4, "big"))
        with pytest.raises(ValueError, match="over the limit"):
            _frames().receive(ours)


# What each costs to import here is 10-15 ms; the quick path needs none of them.
HEAVY = ("argparse", "json", "socket", "signal", "re", "enum", "typing", "lnk_cli.app")

_IMPORTS = """
import os, sys
os.environ["LNK_RUN_DIR"] = sys.argv[1]
from lnk_cli.launch_dialogue import quick_run
status = quick_run(["--yes", "--", "/bin/true"])
print(status, " ".join(sorted(sys.modules)))
"""


def test_the_quick_path_imports_none_of_the_heavy_modules(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-S", "-c", _IMPORTS, str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
        stdin=subprocess.DEVNULL,
        env={"PYTHONPATH": ":".join(sys.path)},
    )
    status, modules = out.stdout.split(" ", 1)
    assert status == "125"  # it ran: no box there (lnk's own error in a run)
    assert "the box is not running" in out.stderr
    assert [m for m in HEAVY if m in modules.split()] == []


def test_lnk_takes_the_quick_path_only_for_the_plain_form(tmp_path: Path) -> None:
    def lnk(*words: str) -> subprocess.CompletedProcess[str]:
        code = "import sys; from lnk_cli.__main__ import main; sys.argv[0] = 'lnk'; main()"
        return subprocess.run(
            [sys.executable, "-X", "importtime", "-c", code, *words],
            capture_output=True,
            text=True,
            check=False,
            stdin=subprocess.DEVNULL,
            env={"PYTHONPATH": ":".join(sys.path), "LNK_RUN_DIR": str(tmp_path)},
        )

    quick = lnk("sandbox", "run", "--yes", "--", "/bin/true")
    full = lnk("sandbox", "run", "--read", str(tmp_path), "--", "/bin/true")
    for ran in (quick, full):
        assert ran.returncode == 125  # no box: lnk's own error in a run
        assert "the box is not running" in ran.stderr
    assert "argparse" not in quick.stderr
    assert "argparse" in full.stderr
