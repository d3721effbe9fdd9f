"""Records belong to an account, not a uid: the proof (`lnk_shared.accounts`) recorded at first
use, a recycled uid's old records forgotten before it is served."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from lnk_controller import accounts
from lnk_controller.accounts import Accounts
from lnk_controller.db import open_database
from lnk_shared.accounts import AccountProof
from lnk_shared.errors import StateError

ALICE = AccountProof("alice", "/home/alice", 64768, 1192, 720500964)


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    engine = open_database(tmp_path / "state" / "controller.db")
    yield engine
    engine.dispose()


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
