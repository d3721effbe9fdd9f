"""`lnk agent create|start|stop|list|remove|send`: your agents, kept by the controller.

An agent's folder is `~/Link/Agents/NAME/` (made here, as you, mode 0700); its key pair is made
by the controller, which keeps the private key (never shown) and registers the public key.
`lnk agent start NAME -- PROGRAM` runs PROGRAM (its harness) in a sandbox of the agent's spec,
with the agent's folder as its home, its private key readable at /run/lnk-agent/key.pem by it
alone, and its store bridge on 127.0.0.1:3129 inside. `lnk agent send NAME MESSAGE` queues a
message in the agent's inbox (the store bridge's way in), which the agent reads inside its
sandbox with `lnk bridge inbox read`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from lnk_cli.exit_statuses import RUN_EPILOG
from lnk_shared.display import shown
from lnk_shared.errors import EXIT_OK, UsageError

__all__ = ["register"]

AGENTS_FOLDER = Path("Link") / "Agents"  # under the owner's home: each agent's own folder


def register(groups: Any) -> None:
    agent = groups.add_parser("agent", help="create, list, remove your agents; send them messages")
    commands = agent.add_subparsers(dest="command", metavar="COMMAND", parser_class=type(agent))
    agent.set_defaults(handler=lambda _a: (agent.print_help(sys.stderr), 2)[1])

    create = commands.add_parser("create", help="a new agent with its own key pair")
    create.add_argument("name")
    create.add_argument("--spec", required=True, help="the spec its sandbox runs with")
    create.set_defaults(handler=cmd_create)

    listing = commands.add_parser("list", help="your agents")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(handler=cmd_list)

    start = commands.add_parser(
        "start",
        help="run the agent's harness in a sandbox of its spec, as the agent",
        usage="lnk agent start NAME [--yes] [--env NAME[=VALUE]]... [-- PROGRAM [ARGS...]]",
        epilog=RUN_EPILOG,
    )
    start.add_argument("name")
    start.add_argument("--yes", action="store_true", help="approve a new or changed spec")
    start.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME[=VALUE]",
        help="a variable for this start only (never kept: put lasting ones in the spec's [env])",
    )
    start.add_argument("program", nargs=argparse.REMAINDER, help="-- PROGRAM [ARGS...]")
    start.set_defaults(handler=cmd_start)

    stop = commands.add_parser("stop", help="stop the agent's sandbox")
    stop.add_argument("name")
    stop.set_defaults(handler=cmd_stop)

    remove = commands.add_parser(
        "remove",
        help="forget an agent: its key, its conversations and its lease (its folder stays)",
        description="Forget the agent: delete its key pair, and remove its conversations, "
        "inbox and lease from the store bridge, so a new agent of the same name starts empty. "
        "Its folder ~/Link/Agents/NAME is yours and stays.",
    )
    remove.add_argument("name")
    remove.add_argument(
        "--keep-store",
        action="store_true",
        help="keep its conversations and lease for the next agent you create with this name",
    )
    remove.set_defaults(handler=cmd_remove)

    send = commands.add_parser("send", help="queue a message in an agent's inbox")
    send.add_argument("name")
    send.add_argument("message")
    send.set_defaults(handler=cmd_send)


def _agent_name(args: argparse.Namespace) -> str:
    from lnk_shared.api_client import path_segment

    return path_segment(str(args.name), "agent (its name, from `lnk agent list`)")


def _call(method: str, url: str, body: dict[str, Any] | None = None) -> Any:
    from lnk_shared.controller_api import call

    return call(method, url, body)


def cmd_create(args: argparse.Namespace) -> int:
    spec = Path(args.spec)
    try:
        is_file = spec.is_file()
    except OSError as exc:  # a name too long, a loop of links: still the caller's to fix
        raise UsageError(f"--spec {shown(args.spec)}: {exc.strerror}") from None
    if not is_file:
        raise UsageError(f"--spec {shown(args.spec)}: no such file")
    folder = Path.home() / AGENTS_FOLDER / args.name
    agent = _call("POST", "/v1/agents", {"name": args.name, "spec": str(spec.resolve())})
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)  # as you: never a root-made folder
    name, where = shown(agent["name"]), shown(str(folder))
    print(f"agent {name} created ({agent['agent_id']}); its folder is {where}")
    return EXIT_OK


def cmd_list(args: argparse.Namespace) -> int:
    agents = _call("GET", "/v1/agents")
    if args.json:
        print(json.dumps(agents, indent=2))
        return EXIT_OK
    if not agents:
        print("no agents (lnk agent create NAME --spec S)")
        return EXIT_OK
    from lnk_cli.tables import table

    body = []
    for agent in agents:
        state = f"running as uid {agent['host_uid']}" if agent["running"] else "stopped"
        body.append([shown(agent["name"]), state, shown(agent["spec"])])
    for line in table(["NAME", "STATE", "SPEC"], body):
        print(line)
    return EXIT_OK


DEFAULT_PROGRAM = ["/bin/sh"]  # a harness names itself: `lnk agent start NAME -- PROGRAM`


def cmd_start(args: argparse.Namespace) -> int:
    from lnk_cli.launch_client import run_in_sandbox
    from lnk_shared.spec_flags import add_spec_arguments

    agents = {a["name"]: a for a in _call("GET", "/v1/agents")}
    if args.name not in agents:
        raise UsageError(f"you have no agent named {args.name!r}")
    # The agent's spec, read as `lnk sandbox run --spec` reads one, and nothing else.
    parser = argparse.ArgumentParser(add_help=False)
    add_spec_arguments(parser)
    flags = parser.parse_args(["--spec", agents[args.name]["spec"]])
    yes, env, program = start_options(list(args.program))
    # `--env` holds for this start only, as `lnk sandbox run --env` does: the box keeps no
    # value of it (an agent that needs a variable at every start has it in its spec's [env]).
    flags.env = list(args.env) + env
    flags.yes = args.yes or yes
    return run_in_sandbox(flags, program or DEFAULT_PROGRAM, agent=args.name)


def start_words(words: list[str]) -> tuple[bool, list[str]]:
    """(--yes, the program) from what argparse leaves after NAME (`start_options`)."""
    yes, _, program = start_options(words)
    return yes, program


def start_options(words: list[str]) -> tuple[bool, list[str], list[str]]:
    """(--yes, the --env entries, the program) from what argparse leaves after NAME: options
    come before `--` or, without one, before the first word that is not an option (`bot1
    --yes` approves and runs the default program; it never runs a program named `--yes`)."""
    cut = words.index("--") if "--" in words else None
    if cut is None:
        cut = next((i for i, w in enumerate(words) if not w.startswith("-")), len(words))
        before, program = words[:cut], words[cut:]
    else:
        before, program = words[:cut], words[cut + 1 :]
    yes, env = False, []
    options = iter(before)
    for option in options:
        if option == "--yes":
            yes = True
        elif option.startswith("--env="):
            env.append(option.removeprefix("--env="))
        elif option == "--env":
            env.append(next(options, ""))
        else:
            raise UsageError(
                f"lnk agent start: unknown option {shown(option)} before the program "
                "(lnk agent start NAME [--yes] [--env NAME[=VALUE]]... [-- PROGRAM [ARGS...]])"
            )
    return yes, env, program


def cmd_stop(args: argparse.Namespace) -> int:
    """Stop the agent's sandbox; an agent already stopped is no error (as an ended sandbox's
    `lnk sandbox stop`): what is asked for holds."""
    name = _agent_name(args)
    running = any(a["name"] == args.name and a["running"] for a in _call("GET", "/v1/agents"))
    _call("POST", f"/v1/agents/{name}/stop")
    print(
        f"agent {shown(args.name)} {'stopped' if running else 'was not running: nothing to stop'}"
    )
    return EXIT_OK


def cmd_remove(args: argparse.Namespace) -> int:
    _call(
        "DELETE",
        f"/v1/agents/{_agent_name(args)}" + ("?keep_store=true" if args.keep_store else ""),
    )
    store = "kept" if args.keep_store else "removed"
    print(
        f"agent {shown(args.name)} removed, its conversations and lease {store} "
        f"(its folder ~/{shown(str(AGENTS_FOLDER / args.name))} is kept)"
    )
    return EXIT_OK


def cmd_send(args: argparse.Namespace) -> int:
    sent = _call("POST", f"/v1/agents/{_agent_name(args)}/send", {"message": args.message})
    print(f"queued for {shown(args.name)} (message {sent['id']})")
    return EXIT_OK
