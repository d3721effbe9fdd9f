"""The probe steps for a model rule's body bound and a local runtime's listings (`lnk sandbox
check`: lnk_cli/check/plan_models.py and plan_hosted.py build them and judge what comes back).

- `model_body`: one request through the proxy to the rule's port inside the sandbox, whose
  body the probe makes here (a plan is one argv string, far below the 2 MiB such a body
  takes): `shape` "deep" nests `count` arrays in a field of the request, "wide" puts `count`
  numbers in one array, and `pad` bytes of one string make it large enough to be scanned. The
  rest of the request is the plan's (verb, path, headers, model).
- `model_nesting`: the cost of the proxy's nesting count (the class `_json_scan.nesting_within`
  closed): `repeats` pairs of requests, interleaved, of a body of `runs` arrays each nested
  `depth` deep (just within the bound the proxy scans to) and of a flat one of the same size
  (runs `flat` deep), each timed from its first byte sent to its answer; both are refused
  (a key given twice in their first message, after a number no double holds: every reader of
  the proxy's stops there at once), so only the count before the parse differs. The times
  come back as `data`; the judge outside compares the least of each.
- `model_listing`: a GET of a listing route through the proxy; the answer's body (at most
  LISTING_LIMIT bytes) comes back as `data`, to be read outside against the rule.

Part of the probe program (`probes.py`, which merges `STEPS` into its own table), run INSIDE
the sandbox with the box's Python (standard library only). It reports what it saw and decides
nothing: a 403 is "stopped", any other answer "through"; the verdict is made outside.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Callable
from typing import Any

from lnk_inside.probes_caps import proxy_address

__all__ = ["LISTING_LIMIT", "STEPS", "make_body", "make_nesting_bodies"]

LISTING_LIMIT = 256 * 1024  # bytes of a listing's answer sent back: thousands of models
HEAD_LIMIT = 64 * 1024  # an answer's head, at most
# The proxy reads a body of megabytes whole before it judges it, and on a loaded box the
# parse the switch lets through takes a second or more: a longer bound than a refusal's.
BODY_TIMEOUT_S = 30.0
MAX_COUNT = 8 * 1024 * 1024  # a plan cannot make the probe build more than ~16 MiB
MAX_REPEATS = 8  # pairs of nesting requests, at most
# Every reader of the proxy's stops here: the C pass at the key given twice, msgspec and the
# stdlib reader at the number (past a double), a local rule's reader at the key.
_REFUSED_FIRST = b'{"a":1e400,"a":1}'


def make_body(shape: str, count: int, model: str, pad: int = 0) -> bytes:
    """A request naming `model` whose `messages` holds `count` nested arrays ("deep") or
    `count` numbers ("wide"), and a string of `pad` bytes (`lnk_check_pad`: the proxy scans
    only a body past 2**20 bytes): valid JSON either way, so only the bound can refuse it
    before a parse."""
    if not 0 < count <= MAX_COUNT or not 0 <= pad <= MAX_COUNT:
        raise ValueError(f"count {count} or pad {pad} out of range")
    head = b'{"model":' + json.dumps(model).encode()
    if pad:
        head += b',"lnk_check_pad":"' + b"x" * pad + b'"'
    if shape == "deep":
        return head + b',"messages":' + b"[" * count + b"]" * count + b"}"
    if shape == "wide":
        return head + b',"messages":[' + b"0," * (count - 1) + b"0]}"
    raise ValueError(f"unknown shape {shape!r}")


def make_nesting_bodies(runs: int, depth: int, flat: int, model: str) -> tuple[bytes, bytes]:
    """(the deep body, the flat one): `runs` arrays nested `depth` deep after the refused first
    message, and as many `flat` deep as fill the same bytes (to within one run)."""
    if not (runs > 0 and 0 < flat < depth and runs * (2 * depth + 1) <= MAX_COUNT):
        raise ValueError(f"runs {runs}, depth {depth} or flat {flat} out of range")
    head = b'{"model":' + json.dumps(model).encode() + b',"messages":[' + _REFUSED_FIRST
    deep = head + (b"," + b"[" * depth + b"]" * depth) * runs + b"]}"
    shallow_runs = (len(deep) - len(head) - 2) // (2 * flat + 1)
    shallow = head + (b"," + b"[" * flat + b"]" * flat) * shallow_runs + b"]}"
    return deep, shallow


def _exchange(step: dict[str, Any], verb: str, body: bytes, limit: int) -> tuple[str, bytes]:
    """(status code or "none", the answer's body up to `limit`) of one request via the proxy."""
    address = proxy_address()
    if address is None:
        return "no proxy", b""
    target, path = step["target"], step["path"]
    extra = "".join(f"{line}\r\n" for line in step.get("headers", []))
    if body:
        extra += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    head = (
        f"{verb} http://{target}{path} HTTP/1.1\r\nHost: {target}\r\n{extra}"
        "Connection: close\r\n\r\n"
    ).encode()
    answer = b""
    with socket.create_connection(address, timeout=BODY_TIMEOUT_S) as s:
        # Refused before the whole body was read: the answer says why.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            s.sendall(head + body)
        while len(answer) < HEAD_LIMIT + limit:
            try:
                chunk = s.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not chunk:
                break
            answer += chunk
    status, _, rest = answer.partition(b"\r\n\r\n")
    parts = status.split(b"\r\n", 1)[0].split()
    code = parts[1].decode("latin-1") if len(parts) > 1 and parts[1].isdigit() else "none"
    return code, rest[:limit]


def _outcome(code: str, body: bytes, data: object) -> dict[str, Any]:
    detail = f"{code} {body[:200].decode('latin-1').strip()}".strip()
    if code == "no proxy":
        return {"outcome": "stopped", "detail": "no proxy in this sandbox (HTTP_PROXY unset)"}
    if code == "none":
        detail = "no answer (not the proxy's refusal)"
    return {"outcome": "stopped" if code == "403" else "through", "detail": detail, "data": data}


def _model_body(step: dict[str, Any]) -> dict[str, Any]:
    body = make_body(step["shape"], int(step["count"]), step["model"], int(step.get("pad", 0)))
    code, said = _exchange(step, step.get("verb", "POST"), body, 200)
    return _outcome(code, said, code)


def _model_nesting(step: dict[str, Any]) -> dict[str, Any]:
    deep, flat = make_nesting_bodies(
        int(step["runs"]), int(step["depth"]), int(step["flat"]), step["model"]
    )
    times: dict[str, list[float]] = {"deep": [], "flat": []}
    codes = []
    code, said = "none", b""
    for turn in range(max(1, min(int(step.get("repeats", 3)), MAX_REPEATS))):
        order = (
            (("deep", deep), ("flat", flat)) if turn % 2 == 0 else (("flat", flat), ("deep", deep))
        )
        for name, body in order:
            start = time.monotonic()
            code, said = _exchange(step, step.get("verb", "POST"), body, 200)
            times[name].append(time.monotonic() - start)
            codes.append(code)
    if code == "no proxy":
        return _outcome(code, said, None)
    refused = all(c == "403" for c in codes)
    least = f"least of {len(times['deep'])}: deep {min(times['deep']):.3f} s"
    least += f", flat {min(times['flat']):.3f} s"
    said_text = said[:200].decode("latin-1").strip()
    detail = f"{'403' if refused else ','.join(codes)} {said_text} ({least})"
    return {"outcome": "stopped" if refused else "through", "detail": detail, "data": times}


def _model_listing(step: dict[str, Any]) -> dict[str, Any]:
    code, said = _exchange(step, "GET", b"", LISTING_LIMIT)
    return _outcome(code, said, said.decode("utf-8", "replace"))


STEPS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "model_body": _model_body,
    "model_listing": _model_listing,
    "model_nesting": _model_nesting,
}
