"""The harness recipes of examples/ at work: the real Claude Code and Codex CLI executables (from
npm, installed into the test environment by scripts/install-harnesses) run as agents with
`lnk agent start`, a non-root owner's, each with the spec its recipe gives, and answer one
prompt from a test upstream speaking their provider's API (tests/e2e/model_api_server.py, over
TLS with the test CA, at the provider's real name in a test-internet namespace), reached only
through the recipe's hosted-model rule.

The owner's key is kept with `lnk secret set` and never given to the harness: each test asserts
the answer came back, that every request the upstream recorded carried the owner's key in the
provider's one header (added by the proxy: the harness held a placeholder), and that the key is
nowhere the agent could have read or written it (its output, its home and state folder, the
wire log). The upstream refuses, as Anthropic's API does, a body field whose beta the rule
dropped. The recipes' specs are used as written, with only the harness named by the path the
test environment installed it at."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import install_prefix
import pytest
from as_owner import run_as_owner
from conftest import _private_box
from internet_box import proxy_config
from net import ANTHROPIC, OPENAI
from net_standin import extra_address, point, serve

RunningBox = Any  # tests/e2e/conftest.py

pytestmark = [pytest.mark.needs_root, pytest.mark.e2e]

LNK = str(install_prefix.LNK)
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SERVER = Path(__file__).with_name("model_api_server.py")
# scripts/test installs them beside the test environment's venv (scripts/install-harnesses).
HARNESSES = Path(sys.prefix).parent / "harnesses" / "node_modules"
CLAUDE = HARNESSES / "@anthropic-ai" / "claude-code-linux-x64" / "claude"
CODEX = HARNESSES / "@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex"
API_HOST = 4  # the stand-in's address in the test internet's public subnet (net_standin)
HARNESS_TIMEOUT_S = 120  # a 370 MB executable's first start on a loaded 2-core machine
ANSWER = "lnk-harness-answer-7f3c"  # model_api_server.ANSWER
# The stand-in "model" asks Claude Code's Bash tool to run this (model_api_server.PROBE) and
# records what comes back: the sandbox's environment and the harness's own.
PROBE = "PROBE: export -p; cat /proc/$PPID/environ"
CLAUDE_STATE = "claude-config"  # CLAUDE_CONFIG_DIR, the recipe's (not the protected ~/.claude)
CODEX_STATE = "codex-home"  # CODEX_HOME, the recipe's (not the protected ~/.codex)


@pytest.fixture(scope="module")
def model_api(internet: Any) -> Iterator[Path]:
    """The test upstream on an address of its own, answering the providers' real names over TLS
    (the test internet's certificate for them); its request record."""
    address = extra_address(internet, API_HOST)
    log = internet.tmp / "model-api.jsonl"
    log.touch()
    # net.py's certificate of the host that answers ANTHROPIC and OPENAI names them both.
    cert, key = internet.tmp / "other.pem", internet.tmp / "other.key"
    args = [address, "443", str(log), str(cert), str(key)]
    with serve(internet, SERVER, args, internet.tmp / "model-api.err"):
        point(internet, [ANTHROPIC, OPENAI], address)
        yield log


@pytest.fixture(scope="module")
def netbox(running_box: RunningBox, internet: Any) -> Iterator[Any]:
    """One box for the module's agents (each test's agent has its own name), trusting the test
    CA for the providers as a real box trusts the system's roots."""
    trusting = proxy_config(internet, f'unsafe_service_ca = "{internet.ca_file}"')
    with _private_box(proxy_config=trusting) as box:
        yield box


def _lnk(
    running_box: RunningBox, box: Any, *args: str, stdin: str = "", timeout: float = 90
) -> subprocess.CompletedProcess[str]:
    return run_as_owner(running_box, [LNK, *args], box=box, input=stdin, timeout=timeout)


def _owner_key(running_box: RunningBox, box: Any, name: str, prefix: str) -> str:
    """A fresh key, kept as the owner's secret `name` (`lnk secret set`, from stdin)."""
    key = prefix + secrets.token_urlsafe(30)
    done = _lnk(running_box, box, "secret", "set", name, stdin=key + "\n")
    assert done.returncode == 0, done.stderr
    return key


def _recipe_spec(running_box: RunningBox, recipe: str, kind: str, binary: Path) -> Path:
    """The recipe's spec as written, its harness named by the path the test environment
    installed it at (a user's own install is found on PATH)."""
    text = (EXAMPLES / recipe / "agent.toml").read_text()
    spec = tomllib.loads(text)
    assert [m["kind"] for m in spec["models"]] == [kind], "the recipe's model is its rule"
    assert "internet" not in spec, "the provider is reached through the rule only"
    assert binary.name in spec["commands"]["allow"], "the recipe grants its harness"
    text = text.replace(f'"{binary.name}"', f'"{binary}"')
    owner = running_box.owner
    path = owner.home / f"{recipe}.toml"
    path.write_text(text)
    os.chown(path, owner.uid, owner.gid)
    project = owner.home / "src" / "project"
    project.mkdir(parents=True, exist_ok=True)
    for folder in (project.parent, project):
        os.chown(folder, owner.uid, owner.gid)
    return path


def _requests(log: Path, since: int) -> list[dict[str, Any]]:
    lines = log.read_text().splitlines()[since:]
    return [json.loads(line) for line in lines]


def _wire(box: Any) -> str:
    return "".join(p.read_text() for p in (Path(box.state_dir) / "wire").rglob("*") if p.is_file())


def _judged(box: Any, target: str) -> list[str]:
    """The wire log's decisions on requests to `target` (the rule's endpoint in the sandbox)."""
    lines = [json.loads(line) for line in _wire(box).splitlines() if line.strip()]
    return [entry["decision"] for entry in lines if entry.get("target") == target]


def _agent_home(running_box: RunningBox, name: str) -> Path:
    return Path(running_box.owner.home) / "Link" / "Agents" / name


def _files_hold(folder: Path, text: str) -> list[str]:
    """The files under `folder` whose bytes hold `text`."""
    needle = text.encode()
    return [str(p) for p in folder.rglob("*") if p.is_file() and needle in p.read_bytes()]


def _run_agent(
    running_box: RunningBox,
    box: Any,
    name: str,
    spec: Path,
    state: str,
    argv: list[str],
    config: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Create agent `name`, make its harness's state folder in its home as the recipe's README
    says (a harness's usual `~/.claude` or `~/.codex` is a protected name at the top of the
    agent's folder, so the recipe points the harness at a folder of another name; `config`
    copied into it), and start `argv` in it with that folder given by `--env` as the README
    does: nothing else, the key least of all."""
    created = _lnk(running_box, box, "agent", "create", name, "--spec", str(spec))
    assert created.returncode == 0, created.stderr
    owner = running_box.owner
    folder = _agent_home(running_box, name) / state
    folder.mkdir()
    if config is not None:
        shutil.copy(config, folder / config.name)
        os.chown(folder / config.name, owner.uid, owner.gid)
    os.chown(folder, owner.uid, owner.gid)
    variable = "CLAUDE_CONFIG_DIR" if state == CLAUDE_STATE else "CODEX_HOME"
    return _lnk(
        running_box,
        box,
        "agent",
        "start",
        name,
        "--yes",
        f"--env={variable}={folder}",
        "--",
        *argv,
        timeout=HARNESS_TIMEOUT_S,
    )


def _assert_key_stayed_outside(
    running_box: RunningBox, box: Any, name: str, key: str, done: subprocess.CompletedProcess[str]
) -> None:
    assert key not in done.stdout + done.stderr
    assert not _files_hold(_agent_home(running_box, name), key), "the key reached the agent"
    assert key not in _wire(box)


def test_claude_code_answers_a_prompt_through_the_hosted_model_rule(
    running_box: RunningBox, netbox: Any, model_api: Path
) -> None:
    assert CLAUDE.exists(), f"{CLAUDE} is missing: scripts/test runs scripts/install-harnesses"
    key = _owner_key(running_box, netbox, "anthropic", "sk-ant-api03-")
    spec = _recipe_spec(running_box, "claude-code", "anthropic", CLAUDE)
    before = len(model_api.read_text().splitlines())
    done = _run_agent(
        running_box,
        netbox,
        "claude",
        spec,
        CLAUDE_STATE,
        [str(CLAUDE), "-p", "--allowedTools=Bash", "--", f"Answer with the test word.\n{PROBE}"],
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert ANSWER in done.stdout, done.stdout + done.stderr
    assert any((_agent_home(running_box, "claude") / CLAUDE_STATE).iterdir()), "state kept"
    arrived = _requests(model_api, before)
    assert any(r["path"] == "/v1/messages?beta=true" and r["stream"] for r in arrived), arrived
    assert all(r["path"].startswith("/v1/messages") for r in arrived), arrived
    # The owner's key, added by the proxy in Anthropic's one header; the placeholder replaced.
    assert {json.dumps(r["credentials"]) for r in arrived} == {json.dumps({"x-api-key": key})}
    # Only client tools reached the provider, under the betas the rule keeps.
    assert {t for r in arrived for t in r["tools"]} <= {"custom"}, arrived
    assert not any(r.get("refused") for r in arrived), arrived
    # What a prompt-injected model would have the agent send out: its whole environment and its
    # harness's. It ran (the placeholder is there) and holds no key.
    (dumped,) = [text for r in arrived for text in r["tool_results"]]
    assert 'ANTHROPIC_API_KEY="lnk-secret-anthropic"' in dumped, dumped
    assert "ANTHROPIC_API_KEY=lnk-secret-anthropic" in dumped, dumped  # /proc/PID/environ
    assert key not in dumped
    _assert_key_stayed_outside(running_box, netbox, "claude", key, done)
    # The proxy judged each at the rule's endpoint in the sandbox and named what it dropped.
    assert _judged(netbox, "http://127.0.0.1:4001/v1/messages?beta=true") == ["allowed"] * len(
        arrived
    )
    assert f"'{ANTHROPIC}'" in _wire(netbox) and "dropped anthropic-beta" in _wire(netbox)


def test_codex_cli_answers_a_prompt_through_the_hosted_model_rule(
    running_box: RunningBox, netbox: Any, model_api: Path
) -> None:
    assert CODEX.exists(), f"{CODEX} is missing: scripts/test runs scripts/install-harnesses"
    key = _owner_key(running_box, netbox, "openai", "sk-proj-")
    spec = _recipe_spec(running_box, "codex", "openai", CODEX)
    before = len(model_api.read_text().splitlines())
    done = _run_agent(
        running_box,
        netbox,
        "codex",
        spec,
        CODEX_STATE,
        [
            str(CODEX),
            "exec",
            "--skip-git-repo-check",
            "--sandbox",
            "danger-full-access",
            "Answer with the test word.",
        ],
        config=EXAMPLES / "codex" / "config.toml",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert ANSWER in done.stdout, done.stdout + done.stderr
    assert any((_agent_home(running_box, "codex") / CODEX_STATE).iterdir()), "state kept"
    arrived = _requests(model_api, before)
    assert [r["path"] for r in arrived] == ["/v1/responses"], arrived
    assert [r["credentials"] for r in arrived] == [{"authorization": f"Bearer {key}"}]
    _assert_key_stayed_outside(running_box, netbox, "codex", key, done)
    assert _judged(netbox, "http://127.0.0.1:4000/v1/responses") == ["allowed"]
    assert f"'{OPENAI}'" in _wire(netbox)
