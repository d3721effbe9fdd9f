"""Records belong to an account, not a uid: the proof (name, home folder's device, inode and
generation) recorded at first use, a recycled uid's old records forgotten before it is served."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from lnk_controller import accounts
from lnk_controller.accounts import AccountProof, Accounts, judge_account, prove_account
from lnk_controller.db import open_database
from lnk_shared.errors import StateError

ALICE = AccountProof("alice", "/home/alice", 64768, 1192, 720500964)


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    engine = open_database(tmp_path / "state" / "controller.db")
    yield engine
    engine.dispose()


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


class Recorder:
    def __init__(self, fail: int = 0) -> None:
        self.forgotten: list[int] = []
        self.fail = fail

    def __call__(self, uid: int) -> None:
        if self.fail:
            self.fail -= 1
            raise StateError("the store bridge does not answer")
        self.forgotten.append(uid)


def test_first_use_records_and_the_same_account_forgets_nothing(engine: Engine) -> None:
    forget = Recorder()
    table = Accounts(engine, forget=forget, prove=lambda _uid: ALICE)
    table.check(1000)
    table.check(1000)
    assert table.recorded(1000) == ALICE
    assert forget.forgotten == []


def test_a_recycled_uid_is_forgotten_once_then_recorded(engine: Engine) -> None:
    now = {1000: ALICE}
    forget = Recorder()
    Accounts(engine, forget=forget, prove=now.get).check(1000)
    bob = AccountProof("bob", "/home/bob", 64768, 1192, 7)
    now[1000] = bob
    table = Accounts(engine, forget=forget, prove=now.get)  # a restarted controller too
    table.check(1000)
    table.check(1000)
    assert forget.forgotten == [1000]
    assert table.recorded(1000) == bob


def test_a_forget_that_fails_keeps_the_old_proof_and_is_tried_again(engine: Engine) -> None:
    now = {1000: ALICE}
    forget = Recorder(fail=1)
    table = Accounts(engine, forget=forget, prove=now.get)
    table.check(1000)
    now[1000] = AccountProof("bob", "/home/bob", 1, 2, 3)
    with pytest.raises(StateError, match="does not answer"):
        table.check(1000)
    assert table.recorded(1000) == ALICE  # the new account is not served next to the old's
    table.check(1000)
    assert forget.forgotten == [1000]


def test_root_and_exempt_uids_are_not_checked(engine: Engine) -> None:
    def prove(uid: int) -> AccountProof:
        raise AssertionError(f"uid {uid} was looked up")

    table = Accounts(engine, forget=Recorder(), prove=prove, exempt=lambda uid: uid >= 100_000)
    table.check(0)
    table.check(100_001)


def test_a_uid_without_an_account_is_refused(engine: Engine) -> None:
    table = Accounts(engine, forget=Recorder(), prove=lambda _uid: None)
    with pytest.raises(StateError, match="no account"):
        table.check(4242)
    assert table.recorded(4242) is None


def test_all_is_exported() -> None:
    assert sorted(accounts.__all__) == sorted(set(accounts.__all__))
    for name in accounts.__all__:
        assert hasattr(accounts, name)
