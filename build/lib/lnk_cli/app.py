"""Placeholder until the CLI lands."""

from __future__ import annotations


def run(argv: list[str]) -> int:
    print("lnk 0.1.0")
    return 0
