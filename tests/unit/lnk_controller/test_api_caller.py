"""Who calls the API is the kernel's answer only: a request that did not come through
`PeerCredProtocol` has no caller (403), whatever its client field says; a uid the accounts
refuse never reaches a route."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi import FastAPI, HTTPException
from starlette.requests import Request

from lnk_controller.api_caller import PEER_MARK, caller_uid


class _Accounts:
    def __init__(self, refused: int | None = None) -> None:
        self.refused = refused
        self.checked: list[int] = []

    def check(self, uid: int) -> None:
        self.checked.append(uid)
        if uid == self.refused:
            raise HTTPException(status_code=403, detail="not this account")


def _request(client: Any, accounts: _Accounts | None = None) -> Request:
    app = FastAPI()
    app.state.accounts = accounts
    return Request({"type": "http", "client": client, "app": app, "headers": []})


@pytest.mark.parametrize(
    "client",
    [None, ("127.0.0.1", 1000), ("peercred-not", 0), ("", 0)],
    ids=["none", "tcp-peer", "another-mark", "empty-mark"],
)
def test_a_request_without_the_kernels_mark_has_no_caller(client: Any) -> None:
    with pytest.raises(HTTPException) as caught:
        caller_uid(_request(client))
    assert caught.value.status_code == 403


def test_the_kernels_uid_is_the_caller_once_its_account_is_checked() -> None:
    accounts = _Accounts()
    assert caller_uid(_request((PEER_MARK, 1234), accounts)) == 1234
    assert accounts.checked == [1234]


def test_a_uid_its_accounts_refuse_never_reaches_a_route() -> None:
    with pytest.raises(HTTPException):
        caller_uid(_request((PEER_MARK, 99), _Accounts(refused=99)))
