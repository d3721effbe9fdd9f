"""The harness recipes of examples/ at work: the real Claude Code and Codex CLI executables (from
npm, installed into the test environment by scripts/install-harnesses) run as agents with
`lnk agent start`, a non-root owner's, each with the spec its recipe gives, and answer one
prompt from a test upstream speaking their provider's API (tests/e2e/model_api_server.py, in a
test-internet namespace, reached only through the sandbox's proxy).

Each test asserts the answer came back, that the upstream recorded the harness's requests (so
the answer was not made up inside), that the proxy's wire log judged them, and that nothing
else reached the upstream. The recipes' specs are used as written, with only the provider's
host replaced by the test upstream's (a test cannot reach the real one)."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import install_prefix
import pytest
from as_user import as_user
from conftest import _private_box
from net import WWW, TestInternet

RunningBox = Any  # tests/e2e/conftest.py

pytestmark = [pytest.mark.needs_root, pytest.mark.e2e]

LNK = str(install_prefix.LNK)
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SERVER = Path(__file__).with_name("model_api_server.py")
# scripts/test installs them beside the test environment's venv (scripts/install-harnesses).
HARNESSES = Path(sys.prefix).parent / "harnesses" / "node_modules"
CLAUDE = HARNESSES / "@anthropic-ai" / "claude-code-linux-x64" / "claude"
CODEX = HARNESSES / "@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex"
API_PORT = 8080
READY_TIMEOUT_S = 10.0
HARNESS_TIMEOUT_S = 120  # a 370 MB executable's first start on a loaded 2-core machine
ANSWER = "lnk-harness-answer-7f3c"  # model_api_server.ANSWER
API_KEY = "sk-lnk-test-key"  # the test upstream takes any key
CLAUDE_STATE = "claude-config"  # CLAUDE_CONFIG_DIR, the recipe's (not the protected ~/.claude)
CODEX_STATE = "codex-home"  # CODEX_HOME, the recipe's (not the protected ~/.codex)


@pytest.fixture(scope="module")
def internet() -> Iterator[Any]:
    with TestInternet() as net:
        yield net


@pytest.fixture(scope="module")
def model_api(internet: Any) -> Iterator[Path]:
    """The test upstream on www's address, port API_PORT; its request record."""
    log = internet.tmp / "model-api.jsonl"
    log.touch()
    errors = internet.tmp / "model-api.err"
    argv = ["ip", "netns", "exec", internet.www.netns, sys.executable, "-I", str(SERVER)]
    with errors.open("wb") as err:
        server = subprocess.Popen(
            [*argv, internet.www.address, str(API_PORT), str(log)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=err,
        )
    assert server.stdout is not None
    try:
        ready, _, _ = select.select([server.stdout], [], [], READY_TIMEOUT_S)
        assert ready and server.stdout.readline() == b"ready\n", errors.read_text()
        yield log
    finally:
        server.kill()
        server.wait()
        server.stdout.close()


@pytest.fixture(scope="module")
def netbox(running_box: RunningBox, internet: Any) -> Iterator[Any]:
    """One box for the module's agents (each test's agent has its own name)."""
    proxy_config = (
        f'unsafe_public_networks = ["{internet.public_subnet}"]\n'
        f'unsafe_dns_table = "{internet.dns_file}"'
    )
    with _private_box(proxy_config=proxy_config) as box:
        yield box


def _env(running_box: RunningBox, box: Any) -> dict[str, str]:
    lnk_dirs = {k: v for k, v in box.env.items() if k.startswith("LNK_")}
    return {**running_box.owner_env(), **lnk_dirs}


def _lnk(
    running_box: RunningBox, box: Any, *args: str, timeout: float = 90
) -> subprocess.CompletedProcess[str]:
    owner = running_box.owner
    return subprocess.run(
        as_user(owner.uid, owner.gid, LNK, *args),
        env=_env(running_box, box),
        cwd=str(owner.home),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _recipe_spec(running_box: RunningBox, recipe: str, provider_host: str, binary: Path) -> Path:
    """The recipe's spec as written, its provider's host pointed at the test upstream and its
    harness named by the path the test environment installed it at (a user's own install is
    found on PATH)."""
    text = (EXAMPLES / recipe / "agent.toml").read_text()
    spec = tomllib.loads(text)
    assert provider_host in spec["internet"]["hosts"], "the recipe names its provider"
    assert binary.name in spec["commands"]["allow"], "the recipe grants its harness"
    text = text.replace(f'"{provider_host}"', f'"{WWW}:{API_PORT}"')
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


def _agent_home(running_box: RunningBox, name: str) -> Path:
    return Path(running_box.owner.home) / "Link" / "Agents" / name


def _run_agent(
    running_box: RunningBox,
    box: Any,
    name: str,
    spec: Path,
    env: dict[str, str],
    argv: list[str],
    state: str,
) -> subprocess.CompletedProcess[str]:
    """Create agent `name`, make its harness's state folder in its home as the owner would
    (the README's step: a harness's usual `~/.claude` or `~/.codex` is a protected name at the
    top of the agent's folder, so the recipe points the harness at a folder of another name),
    and run `argv` in it with `env` (`--env NAME=VALUE`, for this start only)."""
    created = _lnk(running_box, box, "agent", "create", name, "--spec", str(spec))
    assert created.returncode == 0, created.stderr
    owner = running_box.owner
    folder = _agent_home(running_box, name) / state
    folder.mkdir()
    os.chown(folder, owner.uid, owner.gid)
    return _lnk(
        running_box,
        box,
        "agent",
        "start",
        name,
        "--yes",
        *(f"--env={k}={v}" for k, v in env.items()),
        "--",
        *argv,
        timeout=HARNESS_TIMEOUT_S,
    )


def test_claude_code_answers_a_prompt_as_an_agent(
    running_box: RunningBox, netbox: Any, model_api: Path
) -> None:
    assert CLAUDE.exists(), f"{CLAUDE} is missing: scripts/test runs scripts/install-harnesses"
    spec = _recipe_spec(running_box, "claude-code", "api.anthropic.com", CLAUDE)
    before = len(model_api.read_text().splitlines())
    done = _run_agent(
        running_box,
        netbox,
        "claude",
        spec,
        {
            "ANTHROPIC_BASE_URL": f"http://{WWW}:{API_PORT}",
            "ANTHROPIC_API_KEY": API_KEY,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "CLAUDE_CONFIG_DIR": str(_agent_home(running_box, "claude") / CLAUDE_STATE),
        },
        [
            str(CLAUDE),
            "-p",
            "Answer with the test word.",
        ],
        CLAUDE_STATE,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert ANSWER in done.stdout, done.stdout + done.stderr
    assert any((_agent_home(running_box, "claude") / CLAUDE_STATE).iterdir()), "state kept"
    arrived = _requests(model_api, before)
    assert any(r["path"].startswith("/v1/messages") and r["stream"] for r in arrived), arrived
    assert all(r["path"].startswith("/v1/") for r in arrived), arrived
    assert f"{WWW}" in _wire(netbox)


def test_codex_cli_answers_a_prompt_as_an_agent(
    running_box: RunningBox, netbox: Any, model_api: Path
) -> None:
    assert CODEX.exists(), f"{CODEX} is missing: scripts/test runs scripts/install-harnesses"
    spec = _recipe_spec(running_box, "codex", "api.openai.com", CODEX)
    before = len(model_api.read_text().splitlines())
    provider = (
        f'model_providers.lnk={{name="lnk",base_url="http://{WWW}:{API_PORT}/v1",'
        'env_key="OPENAI_API_KEY",wire_api="responses",supports_websockets=false}'
    )
    done = _run_agent(
        running_box,
        netbox,
        "codex",
        spec,
        {
            "OPENAI_API_KEY": API_KEY,
            "CODEX_HOME": str(_agent_home(running_box, "codex") / CODEX_STATE),
        },
        [
            str(CODEX),
            "exec",
            "--skip-git-repo-check",
            "--sandbox",
            "danger-full-access",
            "-c",
            "model=gpt-test",
            "-c",
            "model_provider=lnk",
            "-c",
            provider,
            "Answer with the test word.",
        ],
        CODEX_STATE,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert ANSWER in done.stdout, done.stdout + done.stderr
    assert any((_agent_home(running_box, "codex") / CODEX_STATE).iterdir()), "state kept"
    arrived = _requests(model_api, before)
    assert any(r["path"] == "/v1/responses" for r in arrived), arrived
    assert f"{WWW}" in _wire(netbox)
