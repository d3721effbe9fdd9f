"""A spec's `[limits]` and the limit flags: what a launch asks for, checked for form here (a
number, a size); whether the box allows it is the controller's (lnk_controller.limits), which
grants less and refuses more. Asking for less never widens anything: limits are not grants and
are not in the grants' hash.

    [limits]
    processes = 64        # --processes 64   processes and threads at once
    memory = "512M"       # --memory 512M    its tmpfs folders included
    cpu = 50              # --cpu 50         percent of one core
    open_files = 256      # --open-files 256 per process
"""

from __future__ import annotations

import re

__all__ = ["LIMIT_KEYS", "MIB", "limit_value", "parse_size"]

MIB = 1024 * 1024
# key -> what it takes, for messages
LIMIT_KEYS: dict[str, str] = {
    "processes": "a number of processes",
    "memory": 'a size such as "512M" or "2G"',
    "cpu": "a percent of one core",
    "open_files": "a number of open files",
}
MAX_COUNT = 2**31 - 1  # every limit the kernel takes fits in this
_SIZE = re.compile(r"^([0-9]{1,9})([KMG]i?B?|B)?$", re.IGNORECASE)
_UNITS = {"": MIB, "b": 1, "k": 1024, "m": MIB, "g": 1024 * MIB}


def parse_size(text: str) -> int:
    """`512M`, `2G`, `512MiB`, `1048576B`, `512` (MiB): bytes; ValueError naming the form."""
    match = _SIZE.match(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a size: write it as 512M, 2G or 512MiB")
    unit = (match.group(2) or "")[:1].lower()
    return int(match.group(1)) * _UNITS[unit]


def limit_value(key: str, value: object) -> int:
    """The limit `key` asks for, as a number (memory in bytes); ValueError saying the form.
    A flag's value is text: a number in text is a number."""
    if key not in LIMIT_KEYS:
        raise ValueError(f"unknown limit; [limits] takes: {', '.join(LIMIT_KEYS)}")
    if key == "memory":
        if isinstance(value, str):
            return parse_size(value)
        if type(value) is int and value > 0:
            return value * MIB  # a bare number is MiB, as in controller.toml
        raise ValueError(f"expected {LIMIT_KEYS[key]}, got {value!r}")
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if type(value) is not int or not 1 <= value <= MAX_COUNT:
        raise ValueError(f"expected {LIMIT_KEYS[key]} from 1 to {MAX_COUNT}, got {value!r}")
    return value
