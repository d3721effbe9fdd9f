"""The store bridge: signed appends against unsigned ones through the same code path, one run.

    sudo /opt/lnk/venv/bin/python bench/bridge.py [--seconds 5] [--rounds 2]

Starts `lnk_bridge_store`'s server from this checkout in a forked child (a temp SQLite store,
WAL, synchronous FULL, as the service runs it) with one agent's socket, and calls it from this
process over that real unix socket, one connection, one append at a time (one ~200-byte event,
expected seq and fencing token as a harness sends them):

- signed: each call signed here with the agent's Ed25519 key (`lnk_shared.proof_client`); the
  server verifies it completely (`lnk_shared.proofs.verify_call`: fields, window, peer uid,
  signature, the nonce's UNIQUE insert);
- unsigned: the same frame shape with a zero signature, sent to a server whose `verify` only
  reads the fields (no signature check, no nonce recorded); everything else (frame read,
  body parsing, the append's transaction, the reply) is the same code.

Rounds alternate signed and unsigned (the machine is shared and noisy); each prints appends/s
and p50/p99 latency, then the medians and the ratio signed/unsigned. Everything is removed at
the end.
"""

from __future__ import annotations

import argparse
import base64
import os
import shutil
import signal
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

CHECKOUT = Path(__file__).resolve().parent.parent
for sub in ("shared", "services/bridge-store"):
    sys.path.insert(0, str(CHECKOUT / sub))

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: E402
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat  # noqa: E402

from lnk_bridge_store.config import StoreConfig  # noqa: E402
from lnk_bridge_store.db import open_store  # noqa: E402
from lnk_bridge_store.server import BridgeServer  # noqa: E402
from lnk_bridge_store.store import Store  # noqa: E402
from lnk_shared.proof_client import ProofSigner, encode_body  # noqa: E402
from lnk_shared.proofs import (  # noqa: E402
    AgentKey,
    CallContext,
    VerifiedCall,
    enroll_public_key,
    parse_proof,
)
from lnk_shared.unix import recv_frame, send_frame  # noqa: E402

AGENT = "bench"
EVENT = {"role": "assistant", "text": "x" * 160}


class UnsignedServer(BridgeServer):
    """The same server, its proof check reduced to reading the fields."""

    def verify(self, untrusted: dict[str, Any], context: CallContext) -> VerifiedCall:
        proof = parse_proof(untrusted)
        return VerifiedCall(agent=proof.agent, action=proof.action, body=proof.body)


def serve(root: Path, signed: bool, key: Ed25519PrivateKey) -> tuple[int, Path]:
    """Fork a child serving one agent's socket; (pid, socket path)."""
    config = StoreConfig(
        config_dir=root / "etc",
        state_dir=root / "state",
        run_dir=root / "run",
        database_url=f"sqlite:///{root}/state/{os.urandom(4).hex()}.db",  # a fresh store each
    )
    raw = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    path = config.bridge_dir / "agents" / AGENT / "bridge.sock"
    path.unlink(missing_ok=True)
    pid = os.fork()
    if pid == 0:
        try:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # before any thread
            engine = open_store(config.database_url)
            server = (BridgeServer if signed else UnsignedServer)(config, Store(engine, "bench"))
            server.open_agent(AgentKey(AGENT, enroll_public_key(raw), os.getuid()))
            signal.sigwait({signal.SIGTERM})
        finally:
            os._exit(0)
    deadline = time.monotonic() + 20
    while not _listening(path):  # bound is not yet listening: ask, not look
        if time.monotonic() > deadline:
            raise SystemExit("the bridge did not start")
        time.sleep(0.01)
    return pid, path


def _listening(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


def unsigned_frame(action: str, body: bytes) -> dict[str, Any]:
    now = int(time.time())
    return {
        "v": 1,
        "agent": AGENT,
        "audience": "store",
        "action": action,
        "created": now,
        "expires": now + 60,
        "nonce": base64.b64encode(os.urandom(16)).decode(),
        "body": base64.b64encode(body).decode(),
        "signature": base64.b64encode(bytes(64)).decode(),
    }


def measure(path: Path, make: Callable[[str, bytes], dict[str, Any]], seconds: float) -> dict:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(str(path))

        def call(action: str, args: dict[str, Any]) -> Any:
            send_frame(sock, make(action, encode_body(args)))
            reply, _ = recv_frame(sock)
            if not reply.get("ok"):
                raise SystemExit(f"the bridge refused a bench call: {reply}")
            return reply["result"]

        token = call("lease.acquire", {"holder": "bench", "ttl_s": 3600})["token"]
        conversation = f"c{os.urandom(4).hex()}"
        last, latencies = 0, []
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            args = {"conversation": conversation, "expected_seq": last, "token": token}
            started = time.perf_counter()
            last = call("append", {**args, "events": [EVENT]})["last_seq"]
            latencies.append(time.perf_counter() - started)
    latencies.sort()
    return {
        "rate": len(latencies) / sum(latencies),
        "p50_ms": latencies[len(latencies) // 2] * 1000,
        "p99_ms": latencies[int(len(latencies) * 0.99)] * 1000,
        "n": len(latencies),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=2)
    options = parser.parse_args()
    key = Ed25519PrivateKey.generate()
    signer = ProofSigner(AGENT, key, "store")
    root = Path(tempfile.mkdtemp(prefix="lnkbench", dir="/tmp"))
    results: dict[str, list[dict]] = {"signed": [], "unsigned": []}
    try:
        for _ in range(options.rounds):
            for kind in ("signed", "unsigned"):
                pid, path = serve(root, kind == "signed", key)
                try:
                    make = signer.sign if kind == "signed" else unsigned_frame
                    result = measure(path, make, options.seconds)
                finally:
                    os.kill(pid, signal.SIGTERM)
                    os.waitpid(pid, 0)
                results[kind].append(result)
                print(
                    f"{kind:<9} {result['rate']:8.0f} appends/s  p50 {result['p50_ms']:6.2f} ms"
                    f"  p99 {result['p99_ms']:6.2f} ms  ({result['n']} appends)"
                )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    med = {
        kind: {m: statistics.median(r[m] for r in runs) for m in ("rate", "p50_ms", "p99_ms")}
        for kind, runs in results.items()
    }
    print(
        f"median    signed {med['signed']['rate']:.0f}/s p99 {med['signed']['p99_ms']:.2f} ms; "
        f"unsigned {med['unsigned']['rate']:.0f}/s p99 {med['unsigned']['p99_ms']:.2f} ms"
    )
    rate = med["signed"]["rate"] / med["unsigned"]["rate"]
    p99 = med["signed"]["p99_ms"] / med["unsigned"]["p99_ms"]
    print(f"ratio     signed/unsigned appends/s = {rate:.2f}; p99 signed/unsigned = {p99:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
