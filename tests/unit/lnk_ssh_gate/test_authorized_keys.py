"""The authorized_keys generator's judgements, one refusal per case (no I/O)."""

from __future__ import annotations

import pytest

from lnk_ssh_gate.authorized_keys import (
    FolderRefused,
    KeyRefused,
    bound_line,
    check_folder,
    command_account,
    forced_command,
    key_line,
    parse_gate_line,
    parse_public_key,
)
from lnk_ssh_gate.gate_paths import GatePathRefused

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGwmZ4ouJ/3sZ7ofhcS5d+CrYRW4INQHfrOQn+BdXpp9"
FINGERPRINT = "SHA256:gJQdL4E294rLaMsM6ZFhRAG2qaBkaa3PHf79/eTQf8o"  # what ssh-keygen -l printed
LNK = "/opt/lnk/venv/bin/lnk"


def test_a_bare_key_with_a_comment_is_taken_and_fingerprinted_as_ssh_keygen_does() -> None:
    key = parse_public_key(f"{KEY} alice@laptop\n")
    assert (key.key_type, key.comment, key.fingerprint) == (
        "ssh-ed25519",
        "alice@laptop",
        FINGERPRINT,
    )


def test_the_line_restricts_and_forces_the_command() -> None:
    command = forced_command(LNK, "/srv/specs/a.toml", "/srv/work/a")
    line = key_line(parse_public_key(f"{KEY} alice@laptop"), command)
    assert line == (
        f'restrict,pty,command="{LNK} sandbox enter --spec /srv/specs/a.toml --folder /srv/work/a"'
        f" {KEY} alice@laptop"
    )
    assert parse_gate_line(line) is not None
    assert parse_gate_line(line).fingerprint == FINGERPRINT  # type: ignore[union-attr]


def test_the_account_is_baked_into_the_command() -> None:
    command = forced_command(LNK, "/srv/s.toml", "/srv/w", None, "1000:64768:1192:720500964")
    assert command.endswith(" --account 1000:64768:1192:720500964")
    line = key_line(parse_public_key(KEY), command)
    assert parse_gate_line(line) is not None


@pytest.mark.parametrize("account", ["", "1000", '1:2:3:4"', "1:2:3:4 --spec /etc/shadow"])
def test_an_account_that_is_not_a_token_is_refused(account: str) -> None:
    with pytest.raises(KeyRefused, match="uid:device:inode:generation"):
        forced_command(LNK, "/srv/s.toml", "/srv/w", None, account)


def test_the_run_dir_is_baked_into_the_command() -> None:
    command = forced_command(LNK, "/srv/s.toml", "/srv/w", "/run/lnk-test-1")
    assert command.endswith(" --run-dir /run/lnk-test-1")


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (f'command="/bin/sh" {KEY}', "carries options"),
        (f"no-pty,restrict {KEY}", "carries options"),
        (f"{KEY} a\n{KEY} b\n", "several keys"),
        (f"{KEY}\r\n", "carriage return"),
        (f"{KEY} a\rb", "carriage return"),
        (f"{KEY} a\x00b", "NUL"),
        ("ssh-dss AAAAB3NzaC1kc3M=", "not a key type"),
        ("ssh-ed25519", "base64 part is missing"),
        ("ssh-ed25519 not*base64", "does not decode"),
        ("ssh-rsa AAAAC3NzaC1lZDI1NTE5AAAAIGwmZ4ouJ/3sZ7ofhcS5d+CrYRW4INQHfrOQn+BdXpp9", "not a"),
        (f'{KEY} a"b', "comment"),
        (f"{KEY} a\x1bb", "comment"),
        ("", "empty"),
        ("x" * 20_000, "over"),
    ],
    ids=[
        "command-option",
        "other-options",
        "several-keys",
        "crlf",
        "cr-in-comment",
        "nul",
        "dsa",
        "no-base64",
        "bad-base64",
        "type-mismatch",
        "quote-in-comment",
        "escape-in-comment",
        "empty",
        "too-big",
    ],
)
def test_a_key_is_refused(text: str, why: str) -> None:
    with pytest.raises(KeyRefused, match=why):
        parse_public_key(text)


@pytest.mark.parametrize(
    ("spec", "folder", "why"),
    [
        ("specs/a.toml", "/srv/w", "absolute"),
        ("/srv/s.toml", "work", "absolute"),
        ("/srv/../etc/s.toml", "/srv/w", r"\.\."),
        ("/srv/s.toml", "/srv/w/../../home/u", r"\.\."),
        ("/srv//s.toml", "/srv/w", "normalized"),
        ("/srv/./s.toml", "/srv/w", "normalized"),
        ("/srv/s.toml", "/srv/w/", "normalized"),
        ('/srv/s".toml', "/srv/w", "double quote"),
        ("/srv/s.toml", "/srv/w\\x", "backslash"),
        ("/srv/s .toml", "/srv/w", "whitespace"),
        ("/srv/s.toml", "/srv/w\tx", "whitespace"),
        ("/srv/$HOME.toml", "/srv/w", "dollar"),
        ("/srv/s.toml", "/srv/`id`", "backtick"),
        ("/srv/s.toml;id", "/srv/w", "semicolon"),
        ("/srv/s.toml", "/srv/w\nid", "line break"),
        ("/srv/s.toml", "/srv/w\rx", "carriage return"),
        ("/srv/s.toml", "/srv/w|id", "only letters"),
        ("/srv/s.toml", "/srv/w&", "only letters"),
        ("/srv/s.toml", "/srv/w'", "only letters"),
        ("/srv/s.toml", "/srv/é", "only letters"),
    ],
)
def test_a_spec_or_folder_is_refused(spec: str, folder: str, why: str) -> None:
    with pytest.raises(GatePathRefused, match=why):
        forced_command(LNK, spec, folder)


def test_a_run_dir_is_checked_like_the_others() -> None:
    with pytest.raises(GatePathRefused, match="semicolon"):
        forced_command(LNK, "/srv/s.toml", "/srv/w", "/run/lnk;id")


PROTECTED = [
    ("/home/alice", "alice's home"),
    ("/etc", "the machine's settings"),
    ("/run/lnk", "the box's own folder"),
    ("/var/lib/lnk", "the box's own folder"),
    ("/etc/ssh/authorized_keys", "the keys' folder"),
    ("/srv/specs/a.toml", "the spec"),
]


@pytest.mark.parametrize(
    ("folder", "why"),
    [
        ("/home/alice", "is /home/alice"),
        ("/home/alice/project", "sits inside /home/alice"),
        ("/home", "holds /home/alice"),
        ("/", "holds"),
        ("/etc", "is /etc"),
        ("/etc/myapp", "sits inside /etc"),
        ("/run/lnk", "is /run/lnk"),
        ("/run/lnk/sandboxes", "sits inside /run/lnk"),
        ("/var/lib/lnk/x", "sits inside /var/lib/lnk"),
        ("/var/lib", "holds /var/lib/lnk"),
        ("/srv/specs", "holds /srv/specs/a.toml"),
    ],
)
def test_a_session_folder_is_refused(folder: str, why: str) -> None:
    with pytest.raises(FolderRefused, match=why):
        check_folder(folder, PROTECTED)


@pytest.mark.parametrize("folder", ["/srv/work/alice", "/home/bob/share", "/home/alicex"])
def test_a_folder_beside_the_protected_ones_is_taken(folder: str) -> None:
    check_folder(folder, PROTECTED)


def test_lines_not_written_by_the_gate_are_listed_as_such() -> None:
    plain = parse_gate_line(f"{KEY} someone")
    assert plain is not None
    assert (plain.ours, plain.fingerprint) == (False, FINGERPRINT)
    assert parse_gate_line("# a comment") is None
    assert parse_gate_line("   ") is None


ACCOUNT = "1000:64768:1192:720500964"


@pytest.mark.parametrize("run_dir", [None, "/run/lnk-box"])
def test_an_unbound_line_of_the_gate_is_bound_to_an_account(run_dir: str | None) -> None:
    key = parse_public_key(f"{KEY} alice@laptop")
    old = key_line(key, forced_command(LNK, "/srv/s.toml", "/srv/w", run_dir))
    parsed = parse_gate_line(old)
    assert parsed is not None and parsed.ours and not parsed.bound
    new = bound_line(old, ACCOUNT)
    assert new == key_line(key, forced_command(LNK, "/srv/s.toml", "/srv/w", run_dir, ACCOUNT))
    again = parse_gate_line(new)
    assert again is not None and again.bound and again.fingerprint == FINGERPRINT
    assert command_account(again.command) == ACCOUNT


@pytest.mark.parametrize(
    "line",
    [
        # already bound: never rebound to another account
        f'restrict,pty,command="{LNK} sandbox enter --spec /srv/s.toml --folder /srv/w '
        f'--account 1:2:3:4" {KEY}',
        # not the gate's command: not the gate's to rewrite
        f'restrict,pty,command="/bin/sh -c id" {KEY}',
        f'restrict,pty,command="{LNK} sandbox run --spec /srv/s.toml --folder /srv/w" {KEY}',
        f'restrict,pty,command="{LNK} sandbox enter --folder /srv/w --spec /srv/s.toml" {KEY}',
        f'restrict,pty,command="{LNK} sandbox enter --spec /srv/s.toml --folder /srv/w x y" {KEY}',
        KEY,  # a bare key an admin added: no gate at all
        "# a comment",
        "",
    ],
)
def test_other_lines_are_not_bound(line: str) -> None:
    assert bound_line(line, ACCOUNT) is None


def test_a_path_that_would_not_be_written_today_is_not_bound() -> None:
    line = f'restrict,pty,command="{LNK} sandbox enter --spec s.toml --folder /srv/w" {KEY}'
    with pytest.raises(GatePathRefused):
        bound_line(line, ACCOUNT)
