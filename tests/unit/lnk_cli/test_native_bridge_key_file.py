"""The agent's key file in the C `lnk bridge` client (lnk_cli/native/lnk_client_proof.c): one the
Python client refuses (a mode others may read, not a regular file, too large, encrypted, not PEM,
not Ed25519, missing, another user's, through a link of one's own) is refused here too, before
anything is sent; the modes the box writes are taken.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest
from bridge_clients import (
    FakeBridge,
    answer_frame,
    bridge_env,
    c_answer,
    key_pem,
    run_words,
)
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.rsa import generate_private_key
from cryptography.hazmat.primitives.serialization import (
    BestAvailableEncryption,
    Encoding,
    NoEncryption,
    PrivateFormat,
)

from lnk_shared.proof_client import KEY_FILE_MAX_BYTES


def _make_key(path: Path, how: str) -> None:
    key = Ed25519PrivateKey.generate()
    if how == "fifo":
        os.mkfifo(path, 0o600)
    elif how == "folder":
        path.mkdir(mode=0o700)
    elif how == "too large":
        path.write_bytes(key_pem(key) + b"#" * KEY_FILE_MAX_BYTES)
    elif how == "encrypted":
        path.write_bytes(
            key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, BestAvailableEncryption(b"pw"))
        )
    elif how == "not PEM":
        path.write_bytes(b"just some text\n")
    elif how == "RSA":
        rsa = generate_private_key(public_exponent=65537, key_size=1024)
        path.write_bytes(rsa.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
    else:
        path.write_bytes(key_pem(key))
    if how.startswith("mode "):
        path.chmod(int(how.removeprefix("mode "), 8))
    elif how not in ("fifo", "folder"):
        path.chmod(0o600)
    if how == "another user's":
        os.chown(path, 65534, 65534)


SAME_MESSAGE = ["mode 0644", "mode 0640", "mode 0604", "mode 0610", "fifo", "folder", "too large"]


ANOTHER_USER = ["another user's"] if os.geteuid() == 0 else []


@pytest.mark.parametrize(
    "how", [*SAME_MESSAGE, *ANOTHER_USER, "encrypted", "not PEM", "RSA", "missing"]
)
def test_a_key_file_python_refuses_is_refused_and_nothing_is_sent(
    c_only: Path,
    fake: tuple[FakeBridge, Path, Ed25519PrivateKey],
    tmp_path: Path,
    how: str,
    py: Any,
) -> None:
    bridge, _, _ = fake
    key_file = tmp_path / "bad.pem"
    if how != "missing":
        _make_key(key_file, how)
    env = bridge_env(key_file, bridge.path)
    c = c_answer(c_only, ["bridge", "inbox", "read"], env)
    p = py(["bridge", "inbox", "read"], env)
    assert c[0] == p[0] == 1, (c, p)
    assert bridge.calls == []  # refused before any connection
    if how in (*SAME_MESSAGE, *ANOTHER_USER, "missing"):
        assert c[2] == p[2]
    else:  # cryptography's words differ from the C client's; both name the file
        assert c[2].startswith(f"lnk: cannot read the agent's key {key_file}: ".encode())
        assert str(key_file).encode() in p[2]


def test_a_link_to_another_users_key_is_refused(
    c_only: Path, fake: tuple[FakeBridge, Path, Ed25519PrivateKey], tmp_path: Path
) -> None:
    """The owner is judged on the file opened, through any link: a link of one's own to
    another user's key does not make it one's own."""
    if os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    bridge, _, _ = fake
    theirs = tmp_path / "theirs.pem"
    _make_key(theirs, "another user's")
    mine = tmp_path / "mine.pem"
    mine.symlink_to(theirs)
    c = run_words([str(c_only)], ["bridge", "inbox", "read"], bridge_env(mine, bridge.path))
    assert c.returncode == 1 and b"is owned by uid 65534" in c.stderr
    assert bridge.calls == []


@pytest.mark.parametrize("mode", [0o400, 0o600])
def test_the_modes_the_box_writes_are_taken(
    c_only: Path, fake: tuple[FakeBridge, Path, Ed25519PrivateKey], mode: int
) -> None:
    bridge, key_file, _ = fake
    key_file.chmod(mode)
    bridge.serve(answer_frame({"ok": True, "result": {"messages": []}}))
    ran = run_words([str(c_only)], ["bridge", "inbox", "read"], bridge_env(key_file, bridge.path))
    assert ran.returncode == 0, ran.stderr
    assert stat.S_IMODE(key_file.stat().st_mode) == mode
