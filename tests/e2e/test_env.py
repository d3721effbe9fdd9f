"""Environment variables as a box user passes them: `--env NAME` (their own value), `--env
NAME=VALUE` and a spec's `[env]` reach the program; the value is nowhere the box keeps or shows
anything (its database, `lnk sandbox list --all --json`, `show`, its logs, the wire's logs); the
caller's other variables do not reach the sandbox; a name that changes what a granted program
runs is refused before anything starts, and nothing of it is made."""

from __future__ import annotations

import json
import secrets
import subprocess
from pathlib import Path

import pytest
from as_user import as_user
from conftest import LNK, RunningBox

pytestmark = pytest.mark.needs_root


def _lnk(
    box: RunningBox, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`lnk ARGS` as the owner, with `env` added to the owner's own environment."""
    return subprocess.run(
        as_user(box.owner.uid, box.owner.gid, str(LNK), *args),
        env={**box.owner_env(), **(env or {})},
        cwd=str(box.owner.home),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _found_under(folder: Path, needle: str) -> list[str]:
    """Every file under `folder` (the box's state: database and its journal, logs, wire logs)
    whose bytes hold `needle`."""
    data = needle.encode()
    return [str(p) for p in folder.rglob("*") if p.is_file() and data in p.read_bytes()]


def _spec(box: RunningBox, name: str, text: str) -> Path:
    path = box.owner.home / name
    path.write_text(text)
    subprocess.run(["chown", f"{box.owner.uid}:{box.owner.gid}", str(path)], check=True)
    return path


def _sandbox_ids(box: RunningBox) -> set[str]:
    listed = _lnk(box, "sandbox", "list", "--all", "--json")
    assert listed.returncode == 0, listed.stderr
    return {row["id"] for row in json.loads(listed.stdout)}


def test_a_key_passed_with_env_reaches_the_program_and_nowhere_the_box_keeps(
    running_box: RunningBox,
) -> None:
    box = running_box
    key = "sk-e2e-" + secrets.token_hex(16)
    plain = "flag-" + secrets.token_hex(8)
    in_spec = "spec-" + secrets.token_hex(8)
    unnamed = "unnamed-" + secrets.token_hex(8)
    spec = _spec(box, "env-spec.toml", f'[env]\nFROM_SPEC = "{in_spec}"\n')
    ran = _lnk(
        box,
        "sandbox",
        "run",
        "--yes",
        "--spec",
        str(spec),
        "--env",
        "E2E_API_KEY",
        "--env",
        f"E2E_PLAIN={plain}",
        "--internet-host",
        "nothing.invalid",  # a proxy, so the wire's log and the proxy's variables exist too
        "--",
        "/usr/bin/env",
        env={"E2E_API_KEY": key, "E2E_UNNAMED": unnamed},
    )
    assert ran.returncode == 0, ran.stderr
    inside = dict(line.split("=", 1) for line in ran.stdout.splitlines() if "=" in line)
    assert inside["E2E_API_KEY"] == key
    assert inside["E2E_PLAIN"] == plain
    assert inside["FROM_SPEC"] == in_spec
    assert unnamed not in ran.stdout  # the caller's other variables stay outside
    assert inside["HTTPS_PROXY"].startswith("http://127.0.0.1:")  # the box's own, after
    assert inside["HOME"].startswith("/home/lnk-sbx-")
    assert key not in ran.stderr

    listed = _lnk(box, "sandbox", "list", "--all", "--json")
    assert listed.returncode == 0, listed.stderr
    (row,) = [r for r in json.loads(listed.stdout) if r["command"] == ["/usr/bin/env"]][-1:]
    shown = _lnk(box, "sandbox", "show", row["id"], "--json")
    assert shown.returncode == 0, shown.stderr
    for value in (key, plain, in_spec):
        assert value not in listed.stdout
        assert value not in shown.stdout
        assert _found_under(box.state_dir, value) == []  # database, logs, wire logs
    assert (box.state_dir / "controller.db").exists()


def test_a_key_reaches_an_agent_started_with_env(running_box: RunningBox) -> None:
    box = running_box
    name = "envagent" + secrets.token_hex(2)
    key = "sk-agent-" + secrets.token_hex(16)
    spec = _spec(box, "env-agent.toml", '[env]\nAGENT_MODE = "plain"\n')
    made = _lnk(box, "agent", "create", name, "--spec", str(spec))
    assert made.returncode == 0, made.stderr
    try:
        ran = _lnk(
            box,
            "agent",
            "start",
            name,
            "--yes",
            "--env",
            "E2E_AGENT_KEY",
            "--",
            "/usr/bin/env",
            env={"E2E_AGENT_KEY": key},
        )
        assert ran.returncode == 0, ran.stderr
        assert f"E2E_AGENT_KEY={key}" in ran.stdout.splitlines()
        assert "AGENT_MODE=plain" in ran.stdout.splitlines()
        assert _found_under(box.state_dir, key) == []
    finally:
        _lnk(box, "agent", "remove", name)


@pytest.mark.parametrize(
    ("how", "entry"),
    [
        (["--env", "LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libdl.so.2"], "--env LD_PRELOAD"),
        (["--env", "PATH"], "--env PATH"),  # the caller's own PATH over the box's
        (["--env", "https_proxy=http://203.0.113.9:3128"], "--env https_proxy"),
        (["--spec-text", '[env]\nBASH_ENV = "/tmp/run-me"\n'], "[env] BASH_ENV"),
        (["--spec-text", '[env]\n"BASH_FUNC_touch%%" = "() { id; }"\n'], "[env] BASH_FUNC"),
    ],
)
def test_a_name_that_changes_what_runs_is_refused_before_anything_starts(
    running_box: RunningBox, how: list[str], entry: str
) -> None:
    box = running_box
    marker = box.owner.home / "project" / "out" / ("env-" + secrets.token_hex(4))
    if how[0] == "--spec-text":
        how = ["--spec", str(_spec(box, "env-refused.toml", how[1]))]
    before = _sandbox_ids(box)
    ran = _lnk(
        box,
        "sandbox",
        "run",
        "--yes",
        "--write",
        str(marker.parent),
        *how,
        "--",
        "/usr/bin/touch",
        str(marker),
    )
    assert ran.returncode == 126, (ran.stdout, ran.stderr)  # a run's "refused" (README)
    assert "refused [environment]" in ran.stderr and entry in ran.stderr
    assert "203.0.113.9" not in ran.stderr and "/tmp/run-me" not in ran.stderr
    assert "Traceback" not in ran.stderr
    assert not marker.exists()  # nothing ran
    assert _sandbox_ids(box) == before  # nothing was made: no record, no user


def test_env_without_a_value_the_caller_lacks_is_a_usage_error(running_box: RunningBox) -> None:
    ran = _lnk(running_box, "sandbox", "run", "--yes", "--env", "E2E_NOT_SET", "--", "/bin/true")
    assert ran.returncode == 125, ran.stderr  # a run's own usage error (README)
    assert "--env E2E_NOT_SET: not set in your environment" in ran.stderr
