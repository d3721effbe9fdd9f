"""The proof an account is the one something was recorded for: its name and its home folder's
device, inode and generation; a recycled uid, a home made again in a freed inode, tell apart."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lnk_shared import accounts
from lnk_shared.accounts import (
    AccountProof,
    home_token,
    judge_account,
    parse_home_token,
    prove_account,
)

ALICE = AccountProof("alice", "/home/alice", 64768, 1192, 720500964)


@pytest.mark.parametrize(
    ("recorded", "now", "verdict"),
    [
        (None, ALICE, "first use"),
        (ALICE, ALICE, "same"),
        # userdel -r; useradd -u N bob: another name
        (ALICE, AccountProof("bob", "/home/bob", 64768, 2001, 5), "recycled"),
        # the same name again, its home made anew in the freed inode: another generation
        (ALICE, AccountProof("alice", "/home/alice", 64768, 1192, 99), "recycled"),
        # the same name, a home made anew elsewhere on the disk
        (ALICE, AccountProof("alice", "/home/alice", 64768, 1500, 720500964), "recycled"),
        # the same name, a home on another device
        (ALICE, AccountProof("alice", "/home/alice", 1, 1192, 720500964), "recycled"),
        # the same name and folder, but the account now says another home
        (ALICE, AccountProof("alice", "/srv/alice", 64768, 1192, 720500964), "recycled"),
        # the same name, no home any more (useradd -M)
        (ALICE, AccountProof("alice", "/home/alice", 0, 0, 0), "recycled"),
        # a renamed account reads as another person (and starts empty)
        (ALICE, AccountProof("alice2", "/home/alice", 64768, 1192, 720500964), "recycled"),
        # a file system that keeps no generation: not compared
        (AccountProof("alice", "/home/alice", 64768, 1192, 0), ALICE, "same"),
        (ALICE, AccountProof("alice", "/home/alice", 64768, 1192, 0), "same"),
        # no home then, no home now, same name: the same account
        (
            AccountProof("svc", "/nonexistent", 0, 0, 0),
            AccountProof("svc", "/nonexistent", 0, 0, 0),
            "same",
        ),
    ],
)
def test_judge_account(recorded: AccountProof | None, now: AccountProof, verdict: str) -> None:
    assert judge_account(recorded, now) == verdict


def test_a_folder_made_again_in_the_same_inode_has_another_generation(tmp_path: Path) -> None:
    """What the proof rests on, on this machine's file system: the inode number is reused,
    the generation is not."""
    seen: set[tuple[int, int]] = set()
    for _ in range(4):
        folder = tmp_path / "home"
        folder.mkdir()
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            seen.add((os.fstat(fd).st_ino, accounts._generation(fd)))
        finally:
            os.close(fd)
        folder.rmdir()
    generations = {g for _, g in seen}
    if generations == {accounts.UNKNOWN_GENERATION}:
        pytest.skip("this file system keeps no inode generation")
    assert len(generations) == 4


def test_prove_account_reads_the_passwd_entry_and_the_home() -> None:
    proof = prove_account(0)
    assert proof is not None
    info = os.stat(proof.home)
    assert (proof.name, proof.home_dev, proof.home_ino) == ("root", info.st_dev, info.st_ino)
    assert prove_account(2**32 - 3) is None  # no account


def test_a_home_token_reads_back_and_nothing_else_does() -> None:
    assert parse_home_token(home_token(1000, ALICE)) == (1000, 64768, 1192, 720500964)
    for bad in ["", "1:2:3", "1:2:3:4:5", "a:2:3:4", "1:2:3:4 --spec /x", '1:2:3:4"', "-1:2:3:4"]:
        with pytest.raises(ValueError, match="uid:device:inode:generation"):
            parse_home_token(bad)


def test_all_is_exported() -> None:
    assert sorted(accounts.__all__) == sorted(set(accounts.__all__))
    for name in accounts.__all__:
        assert hasattr(accounts, name)
