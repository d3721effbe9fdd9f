"""`lnk sandbox check` against a local `[[models]]` rule, with a runtime of Ollama's shape on this
machine's loopback (`ollama_shaped`): the runtime's admin API (`POST /api/pull`) asked of the
rule's port is refused and never reaches the runtime (its own record); the rule's inference is
reported allowed; a `[localhost]` grant of the runtime's own port is reported as the seed's
other door (its whole API: a known gap). With the proxy's test-only
`unsafe_skip_model_route_check` the admin probe is reported `leaked`, and the runtime's record
shows the pull arrived."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ollama_shaped import OllamaShaped

sys.path.insert(0, str(Path(__file__).parent))  # pytest's importlib mode adds no test dir
from test_check import _check, _verdicts

RunningBox = Any  # tests/e2e/conftest.py
pytestmark = [pytest.mark.needs_root, pytest.mark.e2e]

IDENT = "model:ollama:11500"


@pytest.fixture(scope="module")
def runtime() -> Iterator[OllamaShaped]:
    with OllamaShaped() as served:
        yield served


def _pulls(runtime: OllamaShaped) -> int:
    return sum(1 for s in runtime.seen() if s.path == "/api/pull")


def _model_verdicts(box: RunningBox, runtime: OllamaShaped, private: Any) -> dict[str, str]:
    rule = f"--model=ollama=llama3.2:3b;upstream=http://127.0.0.1:{runtime.port};port=11500"
    code, doc, stderr = _check(box, rule, f"--port={runtime.port}", private=private)
    verdicts = {k: v for k, v in _verdicts(doc).items() if k.startswith(IDENT)}
    assert "Traceback" not in stderr
    return {**verdicts, "exit": "ok" if code == 0 else "failed"}


def test_check_refuses_the_admin_api_reports_the_rule_and_the_localhost_door(
    running_box: RunningBox, runtime: OllamaShaped
) -> None:
    before = _pulls(runtime)
    verdicts = _model_verdicts(running_box, runtime, None)
    assert verdicts == {
        f"{IDENT}:admin": "refused",
        f"{IDENT}:inference": "allowed",
        f"{IDENT}:localhost-port": "known gap",
        "exit": "ok",
    }
    assert _pulls(runtime) == before  # the runtime's own record: the pull never arrived


def test_the_unsafe_switch_makes_check_report_the_admin_probe_leaked(
    running_box: RunningBox, private_box: Any, runtime: OllamaShaped
) -> None:
    with private_box(proxy_config="unsafe_skip_model_route_check = true") as box:
        before = _pulls(runtime)
        verdicts = _model_verdicts(running_box, runtime, box)
    assert verdicts[f"{IDENT}:admin"] == "leaked"
    assert verdicts["exit"] == "failed"
    assert _pulls(runtime) == before + 1  # it reached the runtime
