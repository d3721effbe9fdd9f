"""The run's pure pieces: the wire log's targets as the plan names them, and the probes'
output read as hostile (anything but one results document is an incomplete check)."""

from __future__ import annotations

import pytest

from lnk_cli.check.launch import CheckRun
from lnk_cli.check.runner import _results, _target_key
from lnk_cli.check.verdicts import ProbesFailed


@pytest.mark.parametrize(
    ("target", "key"),
    [
        ("1.1.1.1:80", "1.1.1.1:80"),
        ("http://1.1.1.1:80/", "1.1.1.1:80"),
        ("http://1.1.1.1/", "1.1.1.1:80"),
        ("http://www.example/a/b?c", "www.example:80"),
        ("[::ffff:127.0.0.1]:31000", "[::ffff:127.0.0.1]:31000"),
        ("http://[::1]/", "[::1]:80"),
    ],
)
def test_wire_targets_are_keyed_as_the_plan_names_them(target: str, key: str) -> None:
    assert _target_key(target) == key


def run_with(stdout: bytes, stderr: bytes = b"", status: int = 0) -> CheckRun:
    return CheckRun("sbx", status, bytearray(stdout), bytearray(stderr))


def test_the_last_line_is_the_results_document() -> None:
    out = b'noise\n{"results": {"a": {"outcome": "stopped"}}}\n'
    assert _results(run_with(out)) == {"a": {"outcome": "stopped"}}


@pytest.mark.parametrize(
    "stdout",
    [b"", b"not json\n", b'{"results": []}\n', b'["results"]\n', b'{"other": {}}\n'],
)
def test_anything_else_is_an_incomplete_check_naming_what_the_sandbox_said(
    stdout: bytes,
) -> None:
    with pytest.raises(ProbesFailed, match=r"exit 126.*lnk-sandbox: not running \\x1b\[31m"):
        _results(run_with(stdout, b"lnk-sandbox: not running \x1b[31m\n", 126))
