"""The remembered specs' part of the controller's API: `lnk spec list` and `lnk spec forget`.

A caller lists and forgets its own approvals only (SO_PEERCRED says who calls). Each approval
comes with the grants document it approved, so flag-only approvals, named by the hash of what
they open, can be told apart; that document holds what a spec opens, never a value of its
`[env]` (not a grant).
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI, HTTPException

from lnk_controller.api_caller import Caller
from lnk_controller.remembered import RememberedSpecs, is_flags_key

__all__ = ["add_spec_routes"]


def add_spec_routes(app: FastAPI, remembered: RememberedSpecs) -> None:
    """GET and DELETE /v1/specs."""

    @app.get("/v1/specs")
    def specs(uid: Caller) -> list[dict[str, Any]]:
        # `grants`: what each opens (the owner's own approval: no value of [env] is in it), so
        # the flag-only ones, named by their hash, can be told apart.
        return [
            {
                "spec": r.spec_key,
                "hash": r.grants_hash,
                "approved_at": r.approved_at.isoformat(),
                "grants": json.loads(r.grants_json),
            }
            for r in remembered.list_for(uid)
        ]

    @app.delete("/v1/specs")
    def forget(uid: Caller, spec: str | None = None, all: bool = False) -> dict[str, int]:
        """One spec's approval (`<flags>`: every flag-only one; `<flags>:HASH` one of them), or
        with `all` every approval of the caller's."""
        if all == (spec is not None):
            raise HTTPException(status_code=422, detail="give either spec or all")
        if all:
            return {"forgotten": remembered.forget_all(uid)}
        assert spec is not None
        try:
            if is_flags_key(spec):
                return {"forgotten": remembered.forget_flags(uid, spec)}
            return {"forgotten": int(remembered.forget(uid, spec))}
        except ValueError as exc:
            raise HTTPException(status_code=422, detail=str(exc)) from None
