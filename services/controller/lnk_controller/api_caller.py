"""Who calls the controller's API: the kernel's answer (SO_PEERCRED), put into every request by
`PeerCredProtocol` and read by each route through `Caller`.

Nothing the caller sends can change it, and it is checked to be the account its uid's records
belong to (`lnk_controller.accounts`) before any route runs. A connection that did not come
through `PeerCredProtocol` has no caller: 403. Its own module so that each part of the API
(`api`, `agents_api`, `specs_api`, `secrets_api`) depends on it, not on another part.
"""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from uvicorn.protocols.http.h11_impl import H11Protocol

from lnk_controller.accounts import Accounts
from lnk_shared.unix import peer_cred

__all__ = ["PEER_MARK", "Caller", "PeerCredProtocol", "caller_uid"]

PEER_MARK = "peercred"  # scope["client"] = (PEER_MARK, uid) for every connection


class PeerCredProtocol(H11Protocol):
    """uvicorn's HTTP protocol, with the peer's uid (SO_PEERCRED) as the request's client."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        cred = peer_cred(sock)
        self.client = (PEER_MARK, cred.uid)


def caller_uid(request: Request) -> int:
    client = request.scope.get("client")
    if not client or client[0] != PEER_MARK:
        raise HTTPException(status_code=403, detail="unknown caller")
    uid = int(client[1])
    accounts: Accounts | None = getattr(request.app.state, "accounts", None)
    if accounts is not None:
        accounts.check(uid)
    return uid


Caller = Annotated[int, Depends(caller_uid)]
