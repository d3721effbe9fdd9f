"""`lnk bridge store append|read|lease` and `lnk bridge inbox read|ack|send`: an agent's calls
to its store bridge, from inside its sandbox, each signed with the agent's own key.

`lnk bridge inbox send NAME MESSAGE` queues MESSAGE in the inbox of the agent NAME of the same
owner (a name, never an id: the bridge adds the sender's own owner), which must be running; its
`from` is the sender's name.

Where the agent's identity is: `LNK_AGENT` (its id), `LNK_AGENT_KEY` (its private key file,
default `/run/lnk-agent/key.pem`), `LNK_BRIDGE` (its bridge: the relay `127.0.0.1:3129` inside
its sandbox by default, or a socket path). Every
answer is printed as JSON; a refusal is an error (exit 1) with the bridge's message.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from lnk_shared.errors import EXIT_OK, UsageError

__all__ = ["register"]

DEFAULT_KEY = "/run/lnk-agent/key.pem"  # where an agent's sandbox has its key, read-only
DEFAULT_BRIDGE = "127.0.0.1:3129"  # the relay to its store bridge's socket, inside


def register(groups: Any) -> None:
    bridge = groups.add_parser("bridge", help="an agent's calls to its bridges (inside)")
    kinds = bridge.add_subparsers(dest="bridge", metavar="BRIDGE", parser_class=type(bridge))
    bridge.set_defaults(handler=lambda _a: (bridge.print_help(sys.stderr), 2)[1])

    store = kinds.add_parser("store", help="conversations' events and the lease")
    ops = store.add_subparsers(dest="op", metavar="OP", parser_class=type(store))
    store.set_defaults(handler=lambda _a: (store.print_help(sys.stderr), 2)[1])
    append = ops.add_parser("append", help="append events (JSON values) after --expected-seq")
    append.add_argument("conversation")
    append.add_argument("events", nargs="+", help="each a JSON value")
    append.add_argument("--expected-seq", type=int, required=True)
    append.add_argument("--token", type=int, required=True, help="your lease's fencing token")
    append.set_defaults(handler=cmd_append)
    read = ops.add_parser("read", help="events from a sequence number on")
    read.add_argument("conversation")
    read.add_argument("--from", dest="from_seq", type=int, default=1)
    read.add_argument("--limit", type=int, default=100)
    read.set_defaults(handler=cmd_read)
    lease = ops.add_parser("lease", help="acquire, renew or release the store's lease")
    lease.add_argument("action", choices=("acquire", "renew", "release"))
    lease.add_argument("--holder", default="harness")
    lease.add_argument("--ttl", type=int, default=60)
    lease.add_argument("--token", type=int)
    lease.set_defaults(handler=cmd_lease)

    inbox = kinds.add_parser("inbox", help="messages in (from the owner, schedules, agents), out")
    inbox_ops = inbox.add_subparsers(dest="op", metavar="OP", parser_class=type(inbox))
    inbox.set_defaults(handler=lambda _a: (inbox.print_help(sys.stderr), 2)[1])
    inbox_read = inbox_ops.add_parser("read", help="messages not yet acknowledged")
    inbox_read.add_argument("--after", type=int, default=0)
    inbox_read.add_argument("--limit", type=int, default=50)
    inbox_read.set_defaults(handler=cmd_inbox_read)
    ack = inbox_ops.add_parser("ack", help="acknowledge messages up to ID")
    ack.add_argument("id", type=int)
    ack.set_defaults(handler=cmd_inbox_ack)
    send = inbox_ops.add_parser(
        "send", help="send MESSAGE to the running agent NAME of your owner (from: your name)"
    )
    send.add_argument("name", metavar="NAME", help="the agent's name (not an id)")
    send.add_argument("message", metavar="MESSAGE")
    send.set_defaults(handler=cmd_inbox_send)


def _call(audience: str, action: str, args: dict[str, Any]) -> int:
    from lnk_shared.proof_client import (
        ProofSigner,
        bridge_address,
        call_bridge,
        load_private_key,
    )

    agent = os.environ.get("LNK_AGENT")
    if not agent:
        raise UsageError("LNK_AGENT is not set: `lnk bridge` runs inside an agent's sandbox")
    key = load_private_key(Path(os.environ.get("LNK_AGENT_KEY") or DEFAULT_KEY))
    address = bridge_address(os.environ.get("LNK_BRIDGE") or DEFAULT_BRIDGE)
    result = call_bridge(address, ProofSigner(agent, key, audience), action, args)
    print(json.dumps(result, indent=2, ensure_ascii=False))
    return EXIT_OK


def cmd_append(args: argparse.Namespace) -> int:
    events = []
    for text in args.events:
        try:
            events.append(json.loads(text))
        except ValueError as exc:
            raise UsageError(f"event {text[:40]!r} is not JSON: {exc}") from None
    call = {"conversation": args.conversation, "expected_seq": args.expected_seq}
    return _call("store", "append", {**call, "token": args.token, "events": events})


def cmd_read(args: argparse.Namespace) -> int:
    call = {"conversation": args.conversation, "from_seq": args.from_seq, "limit": args.limit}
    return _call("store", "read", call)


def cmd_lease(args: argparse.Namespace) -> int:
    if args.action == "acquire":
        return _call("store", "lease.acquire", {"holder": args.holder, "ttl_s": args.ttl})
    if args.token is None:
        raise UsageError(f"lease {args.action} needs --token (the one acquire gave)")
    if args.action == "renew":
        return _call("store", "lease.renew", {"token": args.token, "ttl_s": args.ttl})
    return _call("store", "lease.release", {"token": args.token})


def cmd_inbox_read(args: argparse.Namespace) -> int:
    return _call("inbox", "inbox.read", {"after_id": args.after, "limit": args.limit})


def cmd_inbox_ack(args: argparse.Namespace) -> int:
    return _call("inbox", "inbox.ack", {"through_id": args.id})


def cmd_inbox_send(args: argparse.Namespace) -> int:
    return _call("inbox", "inbox.send", {"to": args.name, "message": args.message})
