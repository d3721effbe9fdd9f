"""The controller's management API (FastAPI on a unix socket): list, show, stop, pause, resume
sandboxes, extend leases; remembered specs in `specs_api`.

Who calls is the kernel's answer (SO_PEERCRED: `lnk_controller.api_caller`), checked to be the
account its uid's records belong to before any route runs. A caller sees and acts on its own
sandboxes only; root sees all, but a sandbox's command (its argument vector, which may hold
what its owner typed) only its owner sees: `SandboxPublic.command` is null for anyone else.
Unknown or foreign sandboxes get the same 404, so ids of others are not confirmed.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import Engine

from lnk_controller.accounts import Accounts
from lnk_controller.agents import AgentRegistry
from lnk_controller.agents_api import add_agent_routes
from lnk_controller.api_caller import Caller, PeerCredProtocol
from lnk_controller.cgroups import freeze
from lnk_controller.cleanup import clean_sandbox
from lnk_controller.config import ControllerConfig
from lnk_controller.models import SandboxRow
from lnk_controller.proxy_link import set_flag
from lnk_controller.remembered import RememberedSpecs
from lnk_controller.retention import prune
from lnk_controller.sandbox_store import SandboxPublic, SandboxStore
from lnk_controller.secret_grants import secret_changed
from lnk_controller.secret_store import SecretStore
from lnk_controller.secrets_api import add_secret_routes
from lnk_controller.specs_api import add_spec_routes
from lnk_shared.api_errors import error_answer
from lnk_shared.errors import LnkError

__all__ = ["PeerCredProtocol", "make_app"]

WIRE_CHUNK = 256 * 1024  # bytes of the wire's log per answer; a follower asks again


class LeaseRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    seconds: int = Field(ge=1)


def make_app(
    cfg: ControllerConfig,
    store: SandboxStore,
    remembered: RememberedSpecs,
    agents: AgentRegistry | None = None,
    accounts: Accounts | None = None,
    *,
    retrying: Callable[[str], str | None] = lambda _id: None,
    engine: Engine | None = None,
    secrets: SecretStore | None = None,
) -> FastAPI:
    """`retrying(id)`: why a sandbox's clean-up is being retried (the reaper's), or None."""
    app = FastAPI(title="lnk controller", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.accounts = accounts
    if agents is not None:
        add_agent_routes(app, cfg, agents, store)
    if secrets is not None:
        add_secret_routes(app, cfg, secrets, partial(secret_changed, cfg, store, secrets))

    @app.exception_handler(LnkError)
    def refused(_request: Request, exc: LnkError) -> JSONResponse:
        # What went wrong, said to the caller (a freeze that did not take, a cleanup with
        # something left, a name it may not have), instead of a bare 500; with the error's
        # class and exit statuses, so the CLI exits as the error would have here.
        status, body = error_answer(exc)
        return JSONResponse(status_code=status, content=body)

    def own(sandbox_id: str, uid: int) -> SandboxRow:
        row = store.get(sandbox_id)
        if row is None or uid not in (0, row.owner_uid):
            raise HTTPException(status_code=404, detail="no such sandbox")
        return row

    def out(row: SandboxRow, viewer: int) -> SandboxPublic:
        why = retrying(row.id) if row.state != "ended" else None
        return SandboxPublic.of(row, viewer=viewer, retrying=why)

    @app.get("/v1/sandboxes")
    def list_sandboxes(uid: Caller, all: bool = False) -> list[SandboxPublic]:
        rows = store.find(owner_uid=None if uid == 0 else uid, live_only=not all)
        return [out(r, uid) for r in rows]

    @app.get("/v1/sandboxes/{sandbox_id}")
    def show(sandbox_id: str, uid: Caller) -> SandboxPublic:
        return out(own(sandbox_id, uid), uid)

    @app.post("/v1/sandboxes/{sandbox_id}/stop")
    def stop(sandbox_id: str, uid: Caller) -> SandboxPublic:
        row = own(sandbox_id, uid)
        store.set(sandbox_id, stop_requested=True)
        set_flag(cfg, sandbox_id, "stop", True)  # the proxy ends tunnels in flight
        clean_sandbox(sandbox_id, store, cfg)
        return out(store.get(sandbox_id) or row, uid)

    @app.post("/v1/sandboxes/{sandbox_id}/pause")
    def pause(sandbox_id: str, uid: Caller) -> SandboxPublic:
        row = own(sandbox_id, uid)
        if row.state != "running":
            raise HTTPException(status_code=409, detail=f"the sandbox is {row.state}")
        store.set(sandbox_id, paused=True)
        set_flag(cfg, sandbox_id, "pause", True)
        freeze(sandbox_id, True)
        return out(store.get(sandbox_id) or row, uid)

    @app.post("/v1/sandboxes/{sandbox_id}/resume")
    def resume(sandbox_id: str, uid: Caller) -> SandboxPublic:
        row = own(sandbox_id, uid)
        if row.state != "running":
            raise HTTPException(status_code=409, detail=f"the sandbox is {row.state}")
        freeze(sandbox_id, False)
        set_flag(cfg, sandbox_id, "pause", False)
        store.set(sandbox_id, paused=False)
        return out(store.get(sandbox_id) or row, uid)

    @app.post("/v1/sandboxes/{sandbox_id}/lease")
    def lease(sandbox_id: str, body: LeaseRequest, uid: Caller) -> SandboxPublic:
        row = own(sandbox_id, uid)
        if row.state != "running":
            raise HTTPException(status_code=409, detail=f"the sandbox is {row.state}")
        if body.seconds > cfg.max_lease_seconds:
            raise HTTPException(
                status_code=422, detail=f"a lease is at most {cfg.max_lease_seconds} seconds"
            )
        store.extend_lease(sandbox_id, body.seconds)
        return out(store.get(sandbox_id) or row, uid)

    @app.get("/v1/sandboxes/{sandbox_id}/wire")
    def wire(sandbox_id: str, uid: Caller, offset: int = 0) -> dict[str, Any]:
        """The wire's log from byte `offset`: whole lines only, at most WIRE_CHUNK bytes."""
        row = own(sandbox_id, uid)
        if offset < 0:
            raise HTTPException(status_code=422, detail="offset must not be negative")
        path = cfg.wire_dir / f"{row.id}.log"
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return {"lines": [], "offset": offset, "ended": row.state == "ended"}
        try:
            data = os.pread(fd, WIRE_CHUNK, offset)
        finally:
            os.close(fd)
        whole = data[: data.rfind(b"\n") + 1]
        lines = [line.decode("ascii", "replace") for line in whole.splitlines()]
        return {"lines": lines, "offset": offset + len(whole), "ended": row.state == "ended"}

    @app.post("/v1/box/prune")
    def prune_now(uid: Caller) -> dict[str, int]:
        """`lnk box prune`: root only, the box's retention applied now."""
        if uid != 0 or engine is None:
            raise HTTPException(status_code=403, detail="only root prunes the box's history")
        done = prune(
            engine,
            cfg.wire_dir,
            now=datetime.now(UTC),
            keep_days=cfg.ended_keep_days,
            keep_count=cfg.ended_keep_count,
        )
        return {"records": done.records, "logs": done.logs}

    add_spec_routes(app, remembered)
    return app
