"""`lnk sandbox check` against a local `[[models]]` rule, with a runtime of Ollama's shape on this
machine's loopback (`ollama_shaped`): the runtime's admin API (`POST /api/pull`) asked of the
rule's port is refused and never reaches the runtime (its own record); the rule's inference is
reported allowed; a `[localhost]` grant of the runtime's own port is reported as the seed's
other door (its whole API: a known gap). The runtime lists a model the rule does not allow (the
bait): every listing the sandbox asks for names only the rule's; a body nested past the proxy's
scan and one of more values than it parses are refused by the bound, and neither reaches the
runtime. With the proxy's test-only `unsafe_skip_model_route_check` the admin probe is
reported `leaked`, and the runtime's record shows the pull arrived; with
`unsafe_uncut_model_listings` each listing probe, naming the bait; with
`unsafe_unbounded_model_bodies` both body probes (and still nothing reaches the runtime); with
`unsafe_per_level_nesting` the nesting's cost probe (its deep runs refused seconds after the
flat body of the same size: counted a level a pass)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from check_run import run_check, verdicts_of
from ollama_shaped import OllamaShaped

RunningBox = Any  # tests/e2e/conftest.py
pytestmark = [pytest.mark.needs_root, pytest.mark.e2e]

CHECK_TIMEOUT_S = 60  # as test_check.py's

IDENT = "model:ollama:11500"
BAIT_MODEL = "lnk-bait-not-allowed:7b"  # listed by the runtime, not allowed by the rule
LISTINGS = ("listing:api-tags", "listing:api-ps", "listing:v1-models")
BODIES = ("deep-body", "wide-body")
NESTING = ("nesting-cost",)  # deep runs against a flat body: refused both, judged by cost


@pytest.fixture(scope="module")
def runtime() -> Iterator[OllamaShaped]:
    with OllamaShaped(("llama3.2:3b", BAIT_MODEL)) as served:
        yield served


def _pulls(runtime: OllamaShaped) -> int:
    return sum(1 for s in runtime.seen() if s.path == "/api/pull")


def _posts(runtime: OllamaShaped) -> int:
    return sum(1 for s in runtime.seen() if s.path == "/api/chat")


def _model_check(
    box: RunningBox, runtime: OllamaShaped, private: Any
) -> tuple[dict[str, str], dict[str, str]]:
    """The model rule's verdicts (and the exit), and what each probe observed."""
    rule = f"--model=ollama=llama3.2:3b;upstream=http://127.0.0.1:{runtime.port};port=11500"
    code, doc, stderr = run_check(
        box, rule, f"--port={runtime.port}", private=private, timeout=CHECK_TIMEOUT_S
    )
    verdicts = {k: v for k, v in verdicts_of(doc).items() if k.startswith(IDENT)}
    observed = {p["id"]: p["observed"] for p in doc["probes"] if p["id"].startswith(IDENT)}
    assert "Traceback" not in stderr
    return {**verdicts, "exit": "ok" if code == 0 else "failed"}, observed


def _model_verdicts(box: RunningBox, runtime: OllamaShaped, private: Any) -> dict[str, str]:
    return _model_check(box, runtime, private)[0]


def test_check_refuses_the_admin_api_reports_the_rule_and_the_localhost_door(
    running_box: RunningBox, runtime: OllamaShaped
) -> None:
    before, posts = _pulls(runtime), _posts(runtime)
    verdicts, observed = _model_check(running_box, runtime, None)
    assert verdicts == {
        **{f"{IDENT}:{name}": "refused" for name in LISTINGS + BODIES + NESTING},
        f"{IDENT}:admin": "refused",
        f"{IDENT}:inference": "allowed",
        f"{IDENT}:localhost-port": "known gap",
        "exit": "ok",
    }
    assert _pulls(runtime) == before  # the runtime's own record: the pull never arrived
    assert _posts(runtime) == posts  # nor either body
    for name in LISTINGS:  # asked and answered (cut), not refused or unreadable
        assert observed[f"{IDENT}:{name}"].startswith("200 "), observed
    print("nesting-cost observed:", observed[f"{IDENT}:nesting-cost"])  # the times, for -s


def test_the_unsafe_switch_makes_check_report_the_admin_probe_leaked(
    running_box: RunningBox, private_box: Any, runtime: OllamaShaped
) -> None:
    with private_box(proxy_config="unsafe_skip_model_route_check = true") as box:
        before = _pulls(runtime)
        verdicts = _model_verdicts(running_box, runtime, box)
    assert verdicts[f"{IDENT}:admin"] == "leaked"
    assert verdicts["exit"] == "failed"
    assert _pulls(runtime) == before + 1  # it reached the runtime


@pytest.mark.parametrize(
    ("unsafe", "leaks"),
    [
        ("unsafe_uncut_model_listings", LISTINGS),
        ("unsafe_unbounded_model_bodies", BODIES),
        ("unsafe_per_level_nesting", NESTING),
    ],
)
def test_each_unsafe_switch_makes_check_report_its_class_leaked(
    running_box: RunningBox,
    private_box: Any,
    runtime: OllamaShaped,
    unsafe: str,
    leaks: tuple[str, ...],
) -> None:
    with private_box(proxy_config=f"{unsafe} = true") as box:
        before, posts = _pulls(runtime), _posts(runtime)
        verdicts, observed = _model_check(running_box, runtime, box)
        proxy_log = (Path(box.state_dir) / "logs" / "proxy.log").read_text(errors="replace")
    assert {k: v for k, v in verdicts.items() if v == "leaked"} == {
        f"{IDENT}:{name}": "leaked" for name in leaks
    }
    assert verdicts["exit"] == "failed"
    assert f"{unsafe}:" in proxy_log  # the switch's warning
    assert _pulls(runtime) == before
    assert _posts(runtime) == posts  # the bodies never reached the runtime, even so
    for name in leaks:  # named: what got through
        said = observed[f"{IDENT}:{name}"]
        if name in LISTINGS:
            assert BAIT_MODEL in said and "does not allow" in said, said
        elif name in NESTING:
            assert "level by level" in said, said
            print("nesting-cost observed:", said)  # the times, for -s
        else:
            assert "does not say 'before it was parsed'" in said, said
