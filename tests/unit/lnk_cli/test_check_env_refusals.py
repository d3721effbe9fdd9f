"""env_refusals.py: each name is asked of the controller as its own launch; a refusal is
refused, a sandbox built is leaked, any other failure is the check's error."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from lnk_cli.check import env_refusals
from lnk_cli.check.launch import Interrupts, RemoteError
from lnk_shared.errors import EXIT_REFUSED, EXIT_USAGE


def _args() -> argparse.Namespace:
    return argparse.Namespace(spec=None, env=["KEPT=1"], write=[])


def _findings(monkeypatch: pytest.MonkeyPatch, answer: Any) -> tuple[list[Any], list[Any]]:
    asked: list[Any] = []

    def run_probes(args: argparse.Namespace, plan: str, _interrupts: Interrupts) -> None:
        asked.append((list(args.env), plan))
        answer()

    monkeypatch.setattr(env_refusals, "run_probes", run_probes)
    return env_refusals.env_refusal_findings(_args(), Interrupts()), asked


def _refuse() -> None:
    raise RemoteError("refused [environment]: --env LD_PRELOAD: ...", EXIT_REFUSED)


def test_each_name_is_its_own_launch_beside_the_callers_env(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    findings, asked = _findings(monkeypatch, _refuse)
    assert [f.verdict for f in findings] == ["refused"] * len(env_refusals.TRIED_NAMES)
    assert [f.id for f in findings] == [f"env-name:{n}" for n, _ in env_refusals.TRIED_NAMES]
    for (env, plan), (name, _) in zip(asked, env_refusals.TRIED_NAMES, strict=True):
        assert plan == "[]" and env[0] == "KEPT=1"
        assert env[1].startswith(f"{name}=/nonexistent/")


def test_a_sandbox_built_is_leaked(monkeypatch: pytest.MonkeyPatch) -> None:
    findings, _ = _findings(monkeypatch, lambda: None)
    assert {f.verdict for f in findings} == {"leaked"}


def test_another_failure_is_not_a_verdict(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail() -> None:
        raise RemoteError("bad launch request", EXIT_USAGE)

    with pytest.raises(RemoteError):
        _findings(monkeypatch, fail)
