"""The key files: written whole and root's, a duplicate fingerprint refused, revoked by
fingerprint; a folder someone but root could change is refused. Real files, as root."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from lnk_shared.errors import UsageError
from lnk_ssh_gate.authorized_keys import (
    KeyRefused,
    PublicKey,
    forced_command,
    key_line,
    parse_public_key,
)
from lnk_ssh_gate.gate_paths import UnsafeFolderRefused, check_root_owned_path
from lnk_ssh_gate.key_store import KeyStore

pytestmark = pytest.mark.needs_root

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGwmZ4ouJ/3sZ7ofhcS5d+CrYRW4INQHfrOQn+BdXpp9 a@b"
USER = "root"  # a user that exists everywhere; the store does not care who it is


@pytest.fixture
def root_dir() -> Iterator[Path]:
    """A root-owned 0755 folder outside /tmp (which others may write)."""
    path = Path(f"/run/lnk-unit-keys-{secrets.token_hex(4)}")
    path.mkdir(mode=0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _line(spec: str = "/srv/s.toml") -> tuple[PublicKey, str]:
    key = parse_public_key(KEY)
    return key, key_line(key, forced_command("/opt/lnk/venv/bin/lnk", spec, "/srv/w"))


def test_a_line_is_written_root_owned_0644_and_listed(root_dir: Path) -> None:
    store = KeyStore(root_dir / "keys")
    key, line = _line()
    path, _ = store.add(USER, key, line)
    info = path.stat()
    assert (info.st_uid, info.st_gid, info.st_mode & 0o777) == (0, 0, 0o644)
    assert (root_dir / "keys").stat().st_mode & 0o777 == 0o755
    assert path.read_text() == f"{line}\n"
    (listed,) = store.listing()
    assert (listed.user, listed.line.fingerprint, listed.line.ours) == (USER, key.fingerprint, True)
    assert [p.name for p in (root_dir / "keys").iterdir()] == [USER]  # no temp file left


def test_a_fingerprint_already_present_is_refused(root_dir: Path) -> None:
    store = KeyStore(root_dir / "keys")
    key, line = _line()
    store.add(USER, key, line)
    _, other_line = _line("/srv/other.toml")
    with pytest.raises(KeyRefused, match="already in"):
        store.add(USER, key, other_line)
    assert (root_dir / "keys" / USER).read_text() == f"{line}\n"


def test_the_same_line_again_changes_nothing_and_is_no_refusal(root_dir: Path) -> None:
    store = KeyStore(root_dir / "keys")
    key, line = _line()
    assert store.add(USER, key, line)[1] is True
    before = (root_dir / "keys" / USER).stat()
    path, added = store.add(USER, key, line)
    assert added is False
    assert path.read_text() == f"{line}\n"  # one line, not two
    assert path.stat().st_mtime_ns == before.st_mtime_ns  # not even rewritten
    assert store.already(USER, key, line) is True


def test_revoke_takes_the_key_out_and_an_unknown_one_is_an_error(root_dir: Path) -> None:
    store = KeyStore(root_dir / "keys")
    key, line = _line()
    store.add(USER, key, line)
    with pytest.raises(UsageError, match="no key"):
        store.revoke("SHA256:nothere")
    assert store.revoke(key.fingerprint) == [USER]
    assert (root_dir / "keys" / USER).read_text() == ""
    assert store.listing() == []


def test_a_user_name_that_is_a_path_is_refused(root_dir: Path) -> None:
    store = KeyStore(root_dir / "keys")
    with pytest.raises(UsageError, match="not a user name"):
        store.path_for("../etc/passwd")


def test_a_keys_folder_others_may_write_is_refused(root_dir: Path) -> None:
    keys = root_dir / "keys"
    keys.mkdir(mode=0o755)
    os.chmod(keys, 0o777)
    key, line = _line()
    with pytest.raises(UnsafeFolderRefused, match="writable by others"):
        KeyStore(keys).add(USER, key, line)
    assert list(keys.iterdir()) == []


def test_a_keys_folder_owned_by_a_user_or_through_a_link_is_refused(root_dir: Path) -> None:
    owned = root_dir / "owned"
    owned.mkdir(mode=0o755)
    os.chown(owned, 65534, 65534)
    with pytest.raises(UnsafeFolderRefused, match="not root"):
        check_root_owned_path(owned / "keys", "the keys' folder")
    (root_dir / "link").symlink_to(root_dir)
    with pytest.raises(UnsafeFolderRefused, match="is a link"):
        check_root_owned_path(root_dir / "link" / "keys", "the keys' folder")


def test_tmp_is_not_a_place_for_keys(tmp_path: Path) -> None:
    with pytest.raises(UnsafeFolderRefused):
        check_root_owned_path(tmp_path, "the keys' folder")


def test_the_written_file_is_what_ssh_keygen_reads(root_dir: Path) -> None:
    store = KeyStore(root_dir / "keys")
    key, line = _line()
    path, _ = store.add(USER, key, line)
    out = subprocess.run(
        ["ssh-keygen", "-lf", str(path)], capture_output=True, text=True, check=True
    ).stdout
    assert key.fingerprint in out


def test_bind_rewrites_only_the_users_unbound_lines(root_dir: Path) -> None:
    store = KeyStore(root_dir / "keys")
    key, line = _line()
    path, _ = store.add(USER, key, line)
    other = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKd6Tgm3MkB7k5cZ6HqxH1b7Yv8KF4Yb0p8JX3C4k4Qn o@p"
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"{other}\n")  # an admin's own line: kept as it is
    assert store.bind(USER, "0:1:2:3") == [key.fingerprint]
    first, second = path.read_text().splitlines()
    assert first.endswith(f'--account 0:1:2:3" {KEY}')
    assert second == other
    assert store.bind(USER, "0:9:9:9") == []  # a bound line is never bound again
    assert path.read_text().splitlines()[0] == first
