"""A/B of the proxy's strict JSON reader (`lnk_proxy.strict_json.read`, the hosted rules'
bodies) against another source tree's, in one run, rounds interleaved, the lowest of each.

    PYTHONPATH=shared /opt/lnk/venv/bin/python bench/strict_json_ab.py --baseline OLD_SOURCES

OLD_SOURCES is a tree holding `services/proxy` (`git archive 90fa756 services/proxy | tar -x
-C /tmp/old`). This checkout's C pass (`lnk_proxy._json_scan`) must be built in place first
(`setup.py build_ext --inplace`), else the new tree reads every body as before the pass.
Bodies: prose (a comma every ~70 bytes) at 0.9 MiB (under MAX_VALUES bytes: no structure scan)
and 4 MiB (scanned), and a 2**20-value array (refused by the scan, read whole by a tree without
it). Prints ms and new/old per body.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import sys
import time
from pathlib import Path
from types import ModuleType

ROUNDS = 60
LINE = "The quick brown fox jumps over the lazy dog, then rests for a while. "


def _load(proxy_sources: Path) -> ModuleType:
    sys.path.insert(0, str(proxy_sources))
    for name in [k for k in sys.modules if k.startswith("lnk_proxy")]:
        del sys.modules[name]
    try:
        return importlib.import_module("lnk_proxy.strict_json")
    finally:
        sys.path.pop(0)


def _prose(mib: float) -> bytes:
    text = LINE * int(mib * 2**20 / len(LINE))
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": text}]}).encode()


def _once(module: ModuleType, body: bytes) -> float:
    start = time.perf_counter()
    with contextlib.suppress(module.BodyRefused):
        module.read(body)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    args = parser.parse_args()
    here = Path(__file__).resolve().parent.parent / "services" / "proxy"
    old, new = _load(args.baseline / "services" / "proxy"), _load(here)
    for label, module in (("old", old), ("new", new)):  # the C pass, where a tree has one
        print(f"{label}: {module.__file__}, C pass {getattr(module, '_json_scan', None)}")
    bodies = {
        "prose 0.9 MiB": _prose(0.9),
        "prose 4 MiB": _prose(4),
        "2**20 values": b'{"a":[' + b",".join([b"0"] * 2**20) + b"]}",
    }
    for label, body in bodies.items():
        best = {"old": float("inf"), "new": float("inf")}
        for _ in range(args.rounds):
            best["old"] = min(best["old"], _once(old, body))
            best["new"] = min(best["new"], _once(new, body))
        ratio = best["new"] / best["old"]
        print(
            f"{label:14} old {best['old'] * 1e3:8.2f} ms  new {best['new'] * 1e3:8.2f} ms  "
            f"new/old {ratio:.2f}"
        )


if __name__ == "__main__":
    main()
