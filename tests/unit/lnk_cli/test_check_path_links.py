"""The check's PATH-link probe: what it makes (a 0777 folder with the link, under a 0700 one of
its own) and how the controller's answer is judged; removed after, whatever the answer."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from lnk_cli.check import path_links
from lnk_cli.check.launch import CheckRun, Interrupts, RemoteError
from lnk_shared.errors import EXIT_REFUSED


def _asked(monkeypatch: pytest.MonkeyPatch, answer: Exception | None) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []

    def fake(args: Any, plan: str, interrupts: Any, **kw: Any) -> CheckRun:
        shared = kw["path_env"].split(":")[0]
        link = os.path.join(shared, args.command[0])
        seen.append(
            {
                "command": args.command,
                "mode": stat.S_IMODE(os.stat(shared).st_mode),
                "parent": stat.S_IMODE(os.stat(os.path.dirname(shared)).st_mode),
                "target": os.readlink(link),
                "plan": plan,
            }
        )
        if answer is not None:
            raise answer
        return CheckRun()

    monkeypatch.setattr(path_links, "run_probes", fake)
    return seen


@pytest.mark.parametrize(
    ("answer", "verdict"),
    [
        (
            RemoteError("refused [link-owner]: ... which every user may change", EXIT_REFUSED),
            "refused",
        ),
        (None, "leaked"),  # the controller built the sandbox
    ],
)
def test_the_probe_asks_for_a_name_through_a_shared_folder_and_judges_the_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, answer: Exception | None, verdict: str
) -> None:
    seen = _asked(monkeypatch, answer)
    (finding,) = path_links.path_link_findings(str(tmp_path), Interrupts())
    assert (finding.id, finding.verdict) == (path_links.PROBE_ID, verdict)
    (asked,) = seen
    assert asked["command"] == ["lnk-check-tool"] and asked["target"] == "/usr/bin/true"
    assert (asked["mode"], asked["parent"], asked["plan"]) == (0o777, 0o700, "[]")
    assert list(tmp_path.iterdir()) == []  # removed after


def test_another_failure_of_the_controller_is_not_a_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _asked(monkeypatch, RemoteError("the box's state", 1))
    with pytest.raises(RemoteError):
        path_links.path_link_findings(str(tmp_path), Interrupts())
    assert list(tmp_path.iterdir()) == []
