"""`lnk bridge` in the C client (lnk_cli/native/lnk_client_bridge.c, lnk_client_proof.c): what it
sends is the Python client's proof byte for byte (Ed25519 is deterministic: the same key, nonce and
time sign the same), the real store bridge accepts it, every answer is printed as Python prints
it, and a form the C path does not take is left to the Python CLI. A key file Python refuses is
refused before anything is sent: test_native_bridge_key_file.py.

The C client runs from a folder with no Python beside it (`c_only`), so an answer cannot come
from an exec'd Python CLI: a form the C path does not take fails there instead, naming the
plain forms (what an agent under a finite [commands] list sees). The bridges and the runner are
tests/unit/helpers/bridge_clients.py.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from bridge_clients import (
    AGENT,
    FAST,
    TIMEOUT_S,
    FakeBridge,
    RealBridge,
    answer_frame,
    bridge_env,
    c_answer,
    key_pem,
    run_words,
)
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import example, given
from hypothesis import strategies as st

from lnk_shared.frames import MAX_FRAME
from lnk_shared.proof_client import encode_body
from lnk_shared.proofs import sign_call


@pytest.fixture
def two_bridges() -> Iterator[tuple[RealBridge, RealBridge]]:
    bridges = (RealBridge(), RealBridge())
    try:
        yield bridges
    finally:
        for bridge in bridges:
            bridge.close()


# --- against the real store bridge: the same answers ------------------------------------------


SESSION = [
    ["store", "lease", "acquire", "--ttl", "30", "--holder", "h-1"],
    [
        "store",
        "append",
        "c1",
        '{"b": 1, "a": [1.5, "ü"]}',
        '"two"',
        "--expected-seq",
        "0",
        "--token",
        "1",
    ],
    ["store", "append", "c1", "3", "--expected-seq=0", "--token=1"],  # a stale sequence: refused
    ["store", "read", "c1", "--from", "2"],
    ["store", "read", "c1", "--limit=1"],
    ["store", "lease", "renew", "--token", "1", "--ttl", "20"],
    ["store", "lease", "renew"],  # no --token: the handler's usage error
    ["store", "lease", "release", "--token", "1"],
    ["inbox", "read"],
    ["inbox", "ack", "5"],
    ["inbox", "send", "nobody", "hello"],  # no such agent: the bridge's refusal
]


def _timeless(out: bytes) -> bytes:
    """A lease's expiry is the bridge's clock at the call: the one part two runs differ in."""
    return re.sub(rb'"expires_at": [0-9.]+', b'"expires_at": T', out)


def test_a_session_of_calls_is_the_python_clients_answer_for_answer(
    c_only: Path, two_bridges: tuple[RealBridge, RealBridge], py: Any
) -> None:
    """Every call the C client makes is accepted by the real bridge (its proof verifies), and
    what it prints and exits with is the Python client's, call for call."""
    c_bridge, py_bridge = two_bridges
    for words in SESSION:
        c = c_answer(c_only, ["bridge", *words], c_bridge.env())
        p = py(["bridge", *words], py_bridge.env())
        assert (c[0], _timeless(c[1]), c[2]) == (p[0], _timeless(p[1]), p[2]), words
    assert c[0] == 1 and b"nobody" in c[2]  # the last one was refused, by the bridge


def test_another_agents_key_is_refused_by_the_bridge(c_only: Path, two_bridges: Any) -> None:
    """A key that is not the agent's enrolled one signs a proof the bridge refuses."""
    bridge = two_bridges[0]
    other = bridge.root / "other.pem"
    other.write_bytes(key_pem(Ed25519PrivateKey.generate()))
    other.chmod(0o600)
    ran = run_words([str(c_only)], ["bridge", "inbox", "read"], bridge_env(other, bridge.socket))
    assert ran.returncode == 1
    assert ran.stderr == b"lnk: the bridge refused the call\n"


# --- the proof, byte for byte -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("words", "audience", "action", "args"),
    [
        (["inbox", "read"], "inbox", "inbox.read", {"after_id": 0, "limit": 50}),
        (["inbox", "ack", "007"], "inbox", "inbox.ack", {"through_id": 7}),
        (
            ["inbox", "send", "bob", 'hi "you"\n\tü 🙂'],
            "inbox",
            "inbox.send",
            {"to": "bob", "message": 'hi "you"\n\tü 🙂'},
        ),
        (
            ["store", "lease", "acquire"],
            "store",
            "lease.acquire",
            {"holder": "harness", "ttl_s": 60},
        ),
        (["store", "lease", "release", "--token=-3"], "store", "lease.release", {"token": -3}),
        (
            ["store", "read", "c-2", "--limit", "5", "--from", "-1"],
            "store",
            "read",
            {"conversation": "c-2", "from_seq": -1, "limit": 5},
        ),
    ],
)
def test_the_proof_is_the_python_proof_byte_for_byte(
    c_only: Path,
    fake: tuple[FakeBridge, Path, Ed25519PrivateKey],
    words: list[str],
    audience: str,
    action: str,
    args: dict[str, Any],
) -> None:
    bridge, key_file, key = fake
    bridge.serve(answer_frame({"ok": True, "result": None}))
    ran = run_words([str(c_only)], ["bridge", *words], bridge_env(key_file, bridge.path))
    bridge.wait()
    assert ran.returncode == 0, ran.stderr
    (sent,) = bridge.calls
    again = sign_call(
        key,
        agent=AGENT,
        audience=audience,
        action=action,
        body=encode_body(args),
        now=sent["created"],
        nonce=base64.b64decode(sent["nonce"]),
    )
    assert json.dumps(sent, separators=(",", ":")) == json.dumps(again, separators=(",", ":"))
    assert sent["expires"] - sent["created"] == 60


def test_every_call_has_a_fresh_nonce(
    c_only: Path, fake: tuple[FakeBridge, Path, Ed25519PrivateKey]
) -> None:
    """A replayed nonce is refused by the bridge: the client must never repeat one."""
    bridge, key_file, _ = fake
    for _ in range(3):
        bridge.serve(answer_frame({"ok": True, "result": 1}))
        assert (
            run_words(
                [str(c_only)], ["bridge", "inbox", "read"], bridge_env(key_file, bridge.path)
            ).returncode
            == 0
        )
        bridge.wait()
    assert len({c["nonce"] for c in bridge.calls}) == 3


# --- events: json.loads, written back as encode_body writes them ------------------------------


EVENTS = [
    '{"b": 1, "a": [1.5, 2e3, -0, 1E400, -1e400, 0.1, 1e-7, 123456789012345678901234567890]}',
    " [ ] ",
    '"\\u00fc\\u00e9\\n\\u0001\\u007f\\u2028 ü"',
    '{"k": 1, "k": 2, "j": {"z": null, "y": true, "x": false}}',
    "NaN",
    "[-Infinity]",
    "-0",
    "-12.5",
    "1.0",
    "-0.0",
    "5e-324",
    "1.7976931348623157e308",
    "1e16",
    "1234567890123456.0",
    "0.0001",
    "0.00001",
    '{"\\ud83d\\ude00": "x", "a": "\\u0000", "\\u00e9": 1, "e": 2}',
    '"\\/ slash"',
    "12.50E+2",
    "[" * 200 + '{"deep": 1}' + "]" * 200,  # past a frame's 32 levels: an agent's own data
]


def _sent_events(
    c_only: Path, fake: tuple[FakeBridge, Path, Ed25519PrivateKey], events: list[str]
) -> bytes:
    bridge, key_file, _ = fake
    bridge.serve(answer_frame({"ok": True, "result": {}}))
    words = ["bridge", "store", "append", "c", *events, "--expected-seq", "0", "--token", "1"]
    ran = run_words([str(c_only)], words, bridge_env(key_file, bridge.path))
    assert ran.returncode == 0, ran.stderr
    bridge.wait()
    return base64.b64decode(bridge.calls[-1]["body"])


def _python_body(events: list[str]) -> bytes:
    call = {"conversation": "c", "expected_seq": 0}
    return encode_body({**call, "token": 1, "events": [json.loads(e) for e in events]})


def test_events_are_sent_as_python_writes_them(
    c_only: Path, fake: tuple[FakeBridge, Path, Ed25519PrivateKey]
) -> None:
    assert _sent_events(c_only, fake, EVENTS) == _python_body(EVENTS)


@FAST
@given(st.lists(st.floats(allow_nan=False) | st.integers(), min_size=1, max_size=8))
# Where printf's correctly rounded shortest digits are another double's, and the digits one
# unit away are this one's (hypothesis found the first; the C took 17 digits for them).
@example([2**-24, 5.684341886080802e-14, -6.617444900424222e-24])
def test_any_number_is_sent_as_python_writes_it(
    c_only: Path, fake: tuple[FakeBridge, Path, Ed25519PrivateKey], numbers: list[float | int]
) -> None:
    # each in a list: argparse reads a word like -1e-05 as an option, not as an event
    texts = [json.dumps(n) for n in numbers] + [repr(n).replace("inf", "Infinity") for n in numbers]
    events = [f"[{text}]" for text in texts]
    assert _sent_events(c_only, fake, events) == _python_body(events)


@pytest.mark.parametrize(
    "event", ["not json", '{"a":}', "[1,]", "01", "'single'", '"\\ud800 lone"', '"a\x01b"', ""]
)
def test_an_event_that_is_not_json_is_a_usage_error_and_nothing_is_sent(
    c_only: Path, fake: tuple[FakeBridge, Path, Ed25519PrivateKey], event: str, py: Any
) -> None:
    bridge, key_file, _ = fake
    words = ["bridge", "store", "append", "c", event, "--expected-seq", "0", "--token", "1"]
    ran = run_words([str(c_only)], words, bridge_env(key_file, bridge.path))
    assert ran.returncode == 2, ran.stderr
    assert ran.stderr.startswith(b"lnk: event ") and b"is not JSON: " in ran.stderr
    assert bridge.calls == []
    assert py(words, bridge_env(key_file, bridge.path))[0] != 0 and bridge.calls == []  # Python too


# --- answers: printed as bridge_commands prints them ------------------------------------------


ANSWERS: list[bytes] = [
    answer_frame(
        {"ok": True, "result": {"events": [{"seq": 1, "event": {"a": [1.5, -0.0, 1e100]}}]}}
    ),
    answer_frame({"ok": True, "result": {"e": [], "o": {}, "n": None, "t": True, "big": 2**70}}),
    answer_frame({"ok": True, "result": 'ünï\n\t\u0001\u007f\u2028 "q" \\ 🙂'}),
    answer_frame({"ok": True}),  # no result: None
    answer_frame({"ok": True, "result": [[[]], [{}], [1, [2, [3]]]]}),
    answer_frame({"ok": True, "result": json.loads("[" * 200 + "{}" + "]" * 200)}),
    answer_frame({"ok": False, "error": "at seq 2\x1b[31m\ttabbed\r"}),
    answer_frame({"ok": False, "error": 5}),
    answer_frame({"ok": "yes", "result": 1}),  # only true is ok
    answer_frame([1, 2]),  # not an object
    b'\x00\x00\x00\x05{"a":',  # cut short
    b"\x00\x00\x00\x03abc",  # not JSON
    b"\x00\x00",  # a header cut short
    (MAX_FRAME + 1).to_bytes(4, "big"),  # past the limit
    b"",  # closed without an answer
]


@pytest.mark.parametrize("answer", ANSWERS)
def test_each_answer_is_printed_and_ends_as_python_ends(
    c_only: Path, fake: tuple[FakeBridge, Path, Ed25519PrivateKey], answer: bytes, py: Any
) -> None:
    bridge, key_file, _ = fake
    env = bridge_env(key_file, bridge.path)
    bridge.serve(answer)
    c = c_answer(c_only, ["bridge", "inbox", "read"], env)
    bridge.wait()
    bridge.serve(answer)
    p = py(["bridge", "inbox", "read"], env)
    bridge.wait()
    assert c[:2] == p[:2]
    if c[0] == 0 or b"cannot reach" not in p[2]:
        assert c[2] == p[2]
    else:  # json's own words for what is wrong differ; the rest is the same
        prefix = p[2].split(b": ", 2)
        assert c[2].startswith(b": ".join(prefix[:2]))


def test_a_reader_gone_is_a_quiet_failure_as_in_python(
    c_only: Path, fake: tuple[FakeBridge, Path, Ed25519PrivateKey]
) -> None:
    """`lnk bridge ... | head -0`: SIGPIPE is not a death; status 1, nothing said (reported)."""
    bridge, key_file, _ = fake
    bridge.serve(answer_frame({"ok": True, "result": {"messages": []}}))
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        ran = subprocess.run(
            [str(c_only), "bridge", "inbox", "read"],
            env=bridge_env(key_file, bridge.path),
            stdin=subprocess.DEVNULL,
            stdout=write_end,
            stderr=subprocess.PIPE,
            timeout=TIMEOUT_S,
            check=False,
        )
    finally:
        os.close(write_end)
    bridge.wait()
    assert (ran.returncode, ran.stderr) == (1, b"")


def test_no_bridge_is_the_python_message(c_only: Path, fake: Any, tmp_path: Path, py: Any) -> None:
    _, key_file, _ = fake
    for bridge in (tmp_path / "none.sock", "127.0.0.1:9", "localhost:3129", "127.0.0.1:70000"):
        c = c_answer(c_only, ["bridge", "inbox", "read"], bridge_env(key_file, bridge))
        assert c == py(["bridge", "inbox", "read"], bridge_env(key_file, bridge)), bridge
        assert c[0] == 1


def test_outside_an_agent_it_says_so_as_python_does(c_only: Path, fake: Any, py: Any) -> None:
    bridge, key_file, _ = fake
    env = {k: v for k, v in bridge_env(key_file, bridge.path).items() if k != "LNK_AGENT"}
    c = c_answer(c_only, ["bridge", "inbox", "read"], env)
    assert c == py(["bridge", "inbox", "read"], env)
    assert c[0] == 2 and bridge.calls == []


# --- forms the C path leaves to the Python CLI ------------------------------------------------


NOT_PLAIN = [
    ["bridge", "inbox", "read", "--lim", "3"],  # an abbreviation argparse takes
    ["bridge", "inbox", "--help"],
    ["bridge", "store", "append", "c", "--token", "1", "e", "--expected-seq", "0"],  # split
    ["bridge", "inbox", "ack", "+5"],  # int() reads it; the C path takes decimal digits only
]


@pytest.mark.parametrize("words", NOT_PLAIN)
def test_a_form_that_is_not_plain_is_the_python_clis(
    native_client: Path,
    c_only: Path,
    fake: tuple[FakeBridge, Path, Ed25519PrivateKey],
    words: list[str],
    py: Any,
) -> None:
    """The C path declines it (alone, it cannot answer), the Python CLI beside it answers."""
    bridge, key_file, _ = fake
    env = bridge_env(key_file, bridge.path)
    alone = c_answer(c_only, words, env)
    assert alone[0] == 1 and b"cannot run the Python CLI" in alone[2]
    assert bridge.calls == []
    bridge.serve(answer_frame({"ok": True, "result": 1}))
    with_python = c_answer(native_client, words, env)
    if bridge.calls:  # that answer was taken: another for the Python CLI
        bridge.wait()
        bridge.serve(answer_frame({"ok": True, "result": 1}))
    p = py(words, env)
    assert with_python[:2] == p[:2]


def test_where_python_is_not_granted_the_plain_forms_are_named(
    native_client: Path, tmp_path: Path
) -> None:
    """Under a finite list the Python beside the client exists but may not run (EACCES): the
    message names the forms the C client takes, with the usage status."""
    folder = tmp_path / "bin"
    folder.mkdir()
    client = Path(shutil.copy(native_client, folder / "lnk"))
    python = folder / "python3"
    python.write_bytes(b"")
    python.chmod(0o644)  # not executable: execv's EACCES, as Landlock's refusal reads
    ran = run_words([str(client)], ["bridge", "inbox", "--help"], {"PATH": "/usr/bin:/bin"})
    assert ran.returncode == 2, ran.stderr
    assert b"takes its plain forms only" in ran.stderr
    assert b"lnk bridge store append CONVERSATION EVENT... --expected-seq N --token N" in ran.stderr


def test_the_c_clients_constants_are_the_python_ones() -> None:
    from lnk_cli import bridge_commands
    from lnk_shared import proof_client, proofs

    native = Path(__file__).parents[3] / "cli/lnk_cli/native"
    text = "".join(p.read_text() for p in sorted(native.glob("lnk_client*.[ch]")))

    def define(name: str) -> str:
        found = re.search(rf"#define {name} (\S+)", text)
        assert found is not None, name
        return found[1]

    assert define("DEFAULT_KEY") == json.dumps(bridge_commands.DEFAULT_KEY)
    assert define("DEFAULT_BRIDGE") == json.dumps(bridge_commands.DEFAULT_BRIDGE)
    assert define("LOOPBACK") == json.dumps(proof_client.LOOPBACK)
    assert int(define("CALL_TIMEOUT_S")) == proof_client.CALL_TIMEOUT_S
    assert int(define("KEY_FILE_MAX_BYTES")) == proof_client.KEY_FILE_MAX_BYTES
    assert int(define("PROOF_LIFETIME_S")) == proofs.DEFAULT_MAX_LIFETIME_S
    assert int(define("NONCE_BYTES")) == proofs.NONCE_BYTES
    assert int(define("PROOF_VERSION")) == proofs.PROOF_VERSION
    assert proofs.MAGIC == b"lnk-agent-proof\x00"  # the C client's PROOF_MAGIC, spelled out
    assert define("PROOF_MAGIC") == '"lnk-agent-proof\\0"'
