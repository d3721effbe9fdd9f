"""The spec's command-line flags, shared by every command that makes a sandbox.

Each flag is the equivalent of a spec section; flags and `--spec FILE` merge into one spec
through the same checks (`SpecBuilder`).
"""

from __future__ import annotations

import os

# typing.TYPE_CHECKING without importing typing, which `lnk sandbox run` never needs.
TYPE_CHECKING = False

if TYPE_CHECKING:  # the spec model is imported when a spec is built, not to add the flags
    import argparse

    from lnk_shared.spec import Spec, SpecBuilder

__all__ = [
    "FLAG_NAMES",
    "add_spec_arguments",
    "flags_document",
    "namespace_from_document",
    "spec_from_arguments",
]


def add_spec_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("what the sandbox opens (each flag = a spec section)")
    group.add_argument("--spec", metavar="FILE", help="a TOML spec file")
    group.add_argument(
        "--read",
        action="append",
        default=[],
        metavar="PATH",
        help="[folders] read: a folder or file, read-only",
    )
    group.add_argument(
        "--write",
        action="append",
        default=[],
        metavar="PATH",
        help="[folders] write: a folder, read-write",
    )
    group.add_argument(
        "--internet-host",
        action="append",
        default=[],
        metavar="HOST",
        help='[internet] hosts: name, "*.name", name:port, or "*"',
    )
    group.add_argument(
        "--network-mode",
        choices=["host"],
        help="[network] mode: host shares this machine's network (no proxy)",
    )
    group.add_argument(
        "--lan-host",
        action="append",
        default=[],
        metavar="HOST",
        help='[lan] hosts: private name, address, range, or "*"',
    )
    group.add_argument(
        "--browser-host",
        action="append",
        default=[],
        metavar="HOST",
        help="[browser] hosts: a host whose pages may be asked to open",
    )
    group.add_argument(
        "--port",
        action="append",
        default=[],
        metavar="PORT",
        help="[localhost] ports: a port of this machine served inside",
    )
    group.add_argument(
        "--store-driver",
        action="append",
        default=[],
        metavar="DRIVER",
        help="[store] driver: an agent's store, kept outside by the box's bridge (\"sqlite\")",
    )
    group.add_argument(
        "--service",
        action="append",
        default=[],
        metavar="KIND:SECRET[@HOST]:ALLOW,...",
        help="[[services]]: e.g. telegram:bot:getMe,sendMessage (the secret by name only)",
    )
    group.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="KIND=MODEL,...[;KEY=VALUE]",
        help="[[models]]: e.g. ollama=llama3.2:3b (its inference only; keys upstream, secret, "
        "port, env)",
    )
    group.add_argument(
        "--command",
        action="append",
        default=[],
        metavar="PROGRAM",
        help='[commands] allow: a program name or path, or "*"',
    )
    group.add_argument(
        "--with-fd",
        action="append",
        default=[],
        metavar="FD:read|write",
        help="a folder passed open on descriptor FD, judged as a spec's folders",
    )
    limits = parser.add_argument_group("limits (each = a [limits] key; less than the box allows)")
    for flag, name, metavar, what in LIMIT_FLAGS:
        limits.add_argument(
            flag, dest=name, action="append", default=[], metavar=metavar, help=what
        )


def spec_from_arguments(
    args: argparse.Namespace, *, cwd: str | None = None, builder: SpecBuilder | None = None
) -> Spec:
    """Merge `--spec FILE` (if any) with the flags into one validated spec.

    A caller that already read the spec file (the controller reads it from a descriptor the
    owner opened) passes the `builder` holding it and `args.spec` as None.
    """
    from lnk_shared.spec import Origin, SpecBuilder
    from lnk_shared.spec_file import load_spec_file

    cwd = cwd if cwd is not None else os.getcwd()
    builder = builder if builder is not None else SpecBuilder()
    if args.spec:
        load_spec_file(args.spec, builder)

    def origin(flag: str) -> Origin:
        return Origin("command line", flag)

    for text in args.read:
        builder.add_read(text, cwd, origin("--read"))
    for text in args.write:
        builder.add_write(text, cwd, origin("--write"))
    for text in args.internet_host:
        builder.add_internet(text, origin("--internet-host"))
    if args.network_mode:
        builder.set_network_mode(args.network_mode, origin("--network-mode"))
    for text in args.lan_host:
        builder.add_lan(text, origin("--lan-host"))
    for text in args.browser_host:
        builder.add_browser(text, origin("--browser-host"))
    for text in args.port:
        builder.add_port(text, origin("--port"))
    for text in args.store_driver:
        builder.set_store_driver(text, origin("--store-driver"))
    if args.service:
        from lnk_shared.spec_services import parse_service_flag

        for text in args.service:
            builder.add_service(parse_service_flag(text, origin("--service")), origin("--service"))
    if args.model:
        from lnk_shared.spec_models import parse_model_flag

        for text in args.model:
            builder.add_model(parse_model_flag(text, origin("--model")), origin("--model"))
    for text in args.command:
        builder.add_command(text, cwd, origin("--command"))
    for text in args.with_fd:
        builder.add_fd(text, origin("--with-fd"))
    for flag, name, _, _ in LIMIT_FLAGS:  # given twice, the last one holds
        for text in getattr(args, name, None) or []:
            builder.set_limit(name, text, origin(flag))
    return builder.build()


# (flag, [limits] key, metavar, help): a limit asked for, as text (lnk_shared.limit_requests)
LIMIT_FLAGS = (
    ("--processes", "processes", "N", "[limits] processes: processes and threads at once"),
    ("--memory", "memory", "SIZE", "[limits] memory: 512M, 2G (its /tmp, /dev/shm, home too)"),
    ("--cpu", "cpu", "PERCENT", "[limits] cpu: percent of one core"),
    ("--open-files", "open_files", "N", "[limits] open_files: open files per process"),
)
LIMIT_NAMES = tuple(name for _, name, _, _ in LIMIT_FLAGS)

FLAG_NAMES = (
    "read",
    "write",
    "internet_host",
    "network_mode",
    "lan_host",
    "browser_host",
    "port",
    "store_driver",
    "service",
    "model",
    "command",
    "with_fd",
    *LIMIT_NAMES,
)


def flags_document(args: argparse.Namespace) -> dict[str, object]:
    """The spec flags as a JSON-able document (what a client sends the controller)."""
    return {name: getattr(args, name) for name in FLAG_NAMES}


def namespace_from_document(doc: dict[str, object]) -> argparse.Namespace:
    """The inverse of `flags_document`, checking every value's type (the document is untrusted)."""
    values: dict[str, object] = {"spec": None}
    for name in FLAG_NAMES:
        value = doc.get(name)
        if name == "network_mode":
            if value not in (None, "host"):
                raise ValueError('network_mode must be null or "host"')
        elif value is None:
            value = []
        elif not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"{name} must be a list of strings")
        values[name] = value
    unknown = set(doc) - set(FLAG_NAMES)
    if unknown:
        raise ValueError(f"unknown spec flags: {sorted(unknown)}")
    import argparse  # here: `lnk sandbox run`'s quick path reads FLAG_NAMES without it

    return argparse.Namespace(**values)
