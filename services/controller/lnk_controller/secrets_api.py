"""The secrets' part of the controller's API: `lnk secret set|list|remove`. A caller acts on its
own secrets only (SO_PEERCRED says who calls); no route returns a value.

The value comes in a request body, parsed here by hand rather than by a pydantic model: a
model's validation error echoes the input it refused, and this input is a secret. Every refusal
says what was wrong without quoting the body.

Security limitations: this does NOT stop root from setting or removing any uid's secrets by
running as that uid; it does refuse the sandboxes' own uids, which have no account and keep no
secrets.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from starlette.concurrency import run_in_threadpool

from lnk_controller.api_caller import Caller
from lnk_controller.config import ControllerConfig
from lnk_controller.secret_store import SecretStore
from lnk_shared.errors import UsageError
from lnk_shared.secret_names import MAX_SECRET_BYTES

__all__ = ["MAX_BODY_BYTES", "add_secret_routes", "parse_secret_body"]

# The JSON of the largest value: each byte escaped at most as \uXXXX, plus the object around it.
MAX_BODY_BYTES = MAX_SECRET_BYTES * 6 + 64


def parse_secret_body(body: bytes) -> bytes:
    """Pure: the value of a `{"value": "..."}` body; UsageError (never quoting it) otherwise."""
    if len(body) > MAX_BODY_BYTES:
        raise UsageError(f"the request is larger than {MAX_BODY_BYTES} bytes")
    try:
        doc = json.loads(body)
    except ValueError:
        raise UsageError('the request is not a JSON document {"value": "..."}') from None
    if not isinstance(doc, dict) or set(doc) != {"value"} or not isinstance(doc["value"], str):
        raise UsageError('the request must be exactly {"value": "..."}, a string value')
    try:
        return doc["value"].encode("ascii")
    except UnicodeEncodeError:
        raise UsageError(
            "the secret's value holds a non-ASCII character: a token or key is visible ASCII only"
        ) from None


def add_secret_routes(
    app: FastAPI,
    cfg: ControllerConfig,
    secrets: SecretStore,
    changed: Callable[[int, str], object] = lambda _uid, _name: None,
) -> None:
    """`changed(owner_uid, name)` after a secret is set or removed: running sandboxes whose
    rules name it get the new value, or lose it (`secret_grants.secret_changed`)."""

    def owner(uid: int) -> int:
        if cfg.uid_first <= uid <= cfg.uid_last:
            raise HTTPException(status_code=403, detail="a sandbox keeps no secrets")
        return uid

    def refused(exc: UsageError) -> HTTPException:
        return HTTPException(status_code=422, detail=str(exc))

    @app.put("/v1/secrets/{name}")
    async def set_secret(name: str, request: Request, uid: Caller) -> dict[str, Any]:
        owner(uid)
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_BODY_BYTES:
                raise HTTPException(
                    status_code=413, detail=f"the request is larger than {MAX_BODY_BYTES} bytes"
                )
        try:
            value = parse_secret_body(bytes(body))
            new = await run_in_threadpool(secrets.set, uid, name, value)
        except UsageError as exc:
            raise refused(exc) from None
        finally:
            body[:] = b"\0" * len(body)
        await run_in_threadpool(changed, uid, name)
        return {"name": name, "new": new}

    @app.get("/v1/secrets")
    def list_secrets(uid: Caller) -> list[dict[str, str]]:
        owner(uid)
        return [
            {
                "name": s.name,
                "created_at": s.created_at.isoformat(),
                "updated_at": s.updated_at.isoformat(),
            }
            for s in secrets.list_for(uid)
        ]

    @app.delete("/v1/secrets/{name}")
    def remove_secret(name: str, uid: Caller) -> dict[str, Any]:
        owner(uid)
        try:
            removed = secrets.remove(uid, name)
        except UsageError as exc:
            raise refused(exc) from None
        if not removed:
            raise HTTPException(status_code=404, detail=f"you keep no secret named {name!r}")
        changed(uid, name)  # before the answer: a running sandbox's next request is refused
        return {"name": name, "removed": True}
