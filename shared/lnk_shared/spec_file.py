"""Reading a spec's TOML file strictly: every section and key known, every value of its type.

Errors name the file, the line, the key and what was expected. The file is hostile input: it is
size-limited, must be UTF-8, and any parser failure (deep nesting included) becomes a SpecError.
"""

from __future__ import annotations

import os
import re
import stat
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lnk_shared.errors import SpecError
from lnk_shared.limit_requests import LIMIT_KEYS
from lnk_shared.spec import ANY, Origin, SpecBuilder
from lnk_shared.spec_models import MODEL_KEYS, parse_model_table
from lnk_shared.spec_services import SERVICE_KEYS, parse_service_table
from lnk_shared.spec_size import MAX_SPEC_BYTES, spec_too_large

__all__ = [
    "ARRAY_SECTIONS",
    "MAX_SPEC_BYTES",
    "SECTIONS",
    "load_spec_file",
    "parse_spec_text",
    "read_spec_text",
]


# section -> key -> (expected, what the key takes)
SECTIONS: dict[str, dict[str, str]] = {
    "folders": {"read": "a list of paths", "write": "a list of paths"},
    "internet": {"hosts": 'a list of host names, "*.name" or "*"'},
    "network": {"mode": '"host"'},
    "lan": {"hosts": 'a list of private names, addresses, ranges or "*"'},
    "browser": {"hosts": "a list of host names"},
    "localhost": {"ports": "a list of port numbers"},
    "commands": {"allow": 'a list of program names or paths, or "*"'},
    "store": {"driver": 'a driver name, e.g. "sqlite"'},
    "limits": LIMIT_KEYS,  # less than the box allows (lnk_shared.limit_requests)
}
# Sections that are arrays of tables, each table checked by its own module.
ARRAY_SECTIONS: dict[str, dict[str, str]] = {
    "services": SERVICE_KEYS,  # [[services]] (lnk_shared.spec_services)
    "models": MODEL_KEYS,  # [[models]] (lnk_shared.spec_models)
}

_HEADER = re.compile(r"^\s*\[\[?\s*([A-Za-z0-9_\-\"'. ]+?)\s*\]")  # [table] or [[array]]
_KEY = re.compile(r"^\s*([A-Za-z0-9_\-\"'.]+?)\s*=")
# Python 3.11's TOMLDecodeError has no `lineno`; its message ends with where it stopped.
_DECODE_WHERE = re.compile(r" \(at (?:line (\d+), column \d+|end of document)\)$")


class _Locator:
    """Finds the line of a section or key in the text, for error messages (best effort)."""

    def __init__(self, text: str) -> None:
        self._lines: dict[tuple[str, str | None], int] = {}
        section = ""
        for number, line in enumerate(text.splitlines(), start=1):
            if match := _HEADER.match(line):
                section = _plain(match.group(1))
                head, _, tail = section.partition(".")
                self._lines.setdefault((head, None), number)
                if tail:  # [a.b] is key b of section a
                    self._lines.setdefault((head, tail.split(".")[0]), number)
            elif match := _KEY.match(line):
                key = _plain(match.group(1))
                if "." in key and not section:
                    head, _, tail = key.partition(".")
                    self._lines.setdefault((head, None), number)
                    self._lines.setdefault((head, tail.split(".")[0]), number)
                else:
                    self._lines.setdefault((section, key.split(".")[0]), number)
                    if not section:
                        self._lines.setdefault((key, None), number)

    def line(self, section: str, key: str | None = None) -> int | None:
        return self._lines.get((section, key)) or self._lines.get((section, None))


def _plain(name: str) -> str:
    return ".".join(part.strip().strip("\"'") for part in name.split("."))


def load_spec_file(path: str | os.PathLike[str], builder: SpecBuilder | None = None) -> SpecBuilder:
    """Read the spec at `path` into `builder` (a new one when None) and return it."""
    shown = str(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError as exc:
        raise SpecError(f"cannot open the spec file: {exc.strerror}", source=shown) from None
    try:
        text = read_spec_text(fd, shown)
    finally:
        os.close(fd)
    absolute = str(Path(os.path.abspath(path)))
    if builder is None:
        builder = SpecBuilder(source=absolute)
    else:
        builder.source = absolute
    return parse_spec_text(text, source=shown, base=str(Path(absolute).parent), builder=builder)


def read_spec_text(fd: int, source: str) -> str:
    """The text of the spec open on `fd`, refused before any parsing if it is not a regular file,
    is over MAX_SPEC_BYTES (by its size, and by reading at most one byte more than the limit,
    for a file that grows meanwhile) or is not UTF-8. The client and the controller both read a
    spec through this, so neither parses what the other would refuse. Reads from offset 0."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise SpecError("the spec is not a regular file", source=source)
    if info.st_size > MAX_SPEC_BYTES:
        raise SpecError(spec_too_large(info.st_size), source=source)
    chunks: list[bytes] = []
    got = 0
    while got <= MAX_SPEC_BYTES:
        chunk = os.pread(fd, MAX_SPEC_BYTES + 1 - got, got)
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    if got > MAX_SPEC_BYTES:
        raise SpecError(spec_too_large(got), source=source)
    data = b"".join(chunks)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"the spec is not UTF-8 text (byte {exc.start})", source=source) from None


def parse_spec_text(
    text: str, *, source: str, base: str, builder: SpecBuilder | None = None
) -> SpecBuilder:
    """Parse spec text; relative paths in it are read against `base` (the spec's folder)."""
    if "\x00" in text:
        raise SpecError("the spec holds a NUL byte", source=source)
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        line = getattr(exc, "lineno", None)
        message = str(exc)
        if stop := _DECODE_WHERE.search(message):
            message = message[: stop.start()]
            if line is None:
                line = int(stop.group(1)) if stop.group(1) else max(1, len(text.splitlines()))
        raise SpecError(f"not valid TOML: {message}", source=source, line=line) from None
    except RecursionError:
        raise SpecError("not valid TOML: nested too deeply", source=source) from None
    except ValueError as exc:  # e.g. an integer past int()'s digit limit, raised by tomllib
        raise SpecError(f"not valid TOML: {exc}", source=source) from None
    builder = builder if builder is not None else SpecBuilder(source=source)
    locator = _Locator(text)
    for section, body in document.items():
        where = Origin(source, f"[{section}]", locator.line(section))
        if section == "services":
            _add_services(builder, body, where)
            continue
        if section == "models":
            _add_models(builder, body, where)
            continue
        if section not in SECTIONS:
            known = ", ".join(
                [*(f"[{name}]" for name in SECTIONS), *(f"[[{name}]]" for name in ARRAY_SECTIONS)]
            )
            raise where.error(f"unknown section; expected one of {known}")
        if not isinstance(body, dict):
            raise where.error("expected a table (a [section] header)")
        if section == "commands":
            builder.declare_commands()
        for key, value in body.items():
            origin = Origin(source, f"{section}.{key}", locator.line(section, key))
            if key not in SECTIONS[section]:
                known = ", ".join(SECTIONS[section])
                raise origin.error(f"unknown key; [{section}] takes: {known}")
            _add(builder, section=section, key=key, value=value, origin=origin, base=base)
    return builder


def _add(
    builder: SpecBuilder, *, section: str, key: str, value: Any, origin: Origin, base: str
) -> None:
    expected = SECTIONS[section][key]
    if section == "network":
        builder.set_network_mode(value, origin)
        return
    if section == "store":
        builder.set_store_driver(value, origin)
        return
    if section == "limits":
        builder.set_limit(key, value, origin)
        return
    if not isinstance(value, list):
        raise origin.error(f"expected {expected}, got {_type_name(value)}")
    add: Callable[[object], None]
    match section, key:
        case "folders", "read":
            add = lambda item: builder.add_read(item, base, origin)  # noqa: E731
        case "folders", "write":
            add = lambda item: builder.add_write(item, base, origin)  # noqa: E731
        case "internet", _:
            add = lambda item: builder.add_internet(item, origin)  # noqa: E731
        case "lan", _:
            add = lambda item: builder.add_lan(item, origin)  # noqa: E731
        case "browser", _:
            add = lambda item: builder.add_browser(item, origin)  # noqa: E731
        case "localhost", _:
            add = lambda item: _add_port(builder, item, origin, expected)  # noqa: E731
        case "commands", _:
            add = lambda item: builder.add_command(item, base, origin)  # noqa: E731
        case _:  # pragma: no cover - SECTIONS and this match are kept together
            raise origin.error("unhandled key")
    for item in value:
        if isinstance(item, list | dict):
            nested = "array" if isinstance(item, list) else "table"
            raise origin.error(f"expected {expected}, got a nested {nested}")
        add(item)


def _add_services(builder: SpecBuilder, body: object, where: Origin) -> None:
    if not isinstance(body, list):
        raise where.error("expected [[services]] tables (an array of tables), not [services]")
    for table in body:
        builder.add_service(parse_service_table(table, where), where)


def _add_models(builder: SpecBuilder, body: object, where: Origin) -> None:
    if not isinstance(body, list):
        raise where.error("expected [[models]] tables (an array of tables), not [models]")
    for table in body:
        builder.add_model(parse_model_table(table, where), where)


def _add_port(builder: SpecBuilder, item: object, origin: Origin, expected: str) -> None:
    # A flag's port is text; in a file a port is a number, and "80" is the wrong type. "*" goes on
    # to the builder, which refuses it with its own rule.
    if isinstance(item, str) and item != ANY:
        raise origin.error(f"expected {expected}, got a string {item!r}")
    builder.add_port(item, origin)


def _type_name(value: object) -> str:
    names = {list: "an array", dict: "a table", str: "a string", int: "an integer"}
    for kind, name in names.items():
        if type(value) is kind:
            return name
    return f"a {type(value).__name__}"
