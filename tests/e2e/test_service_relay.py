"""A service rule at work, on a private box with real users and real bwrap: the sandbox holds
a placeholder, the proxy adds the owner's secret upstream over TLS (the test internet's Bot
API shape at api.telegram.org, its CA trusted only through `unsafe_service_ca`), and the
secret never appears inside the sandbox, in the answer it gets, in the wire log, the box's
state folder (database included) or `lnk sandbox list --json`. Each refusal is asserted twice:
the proxy's 403 and the upstream's own record that nothing arrived. A secret removed while the
sandbox runs refuses its next request; one missing at launch refuses the launch."""

from __future__ import annotations

import json
import secrets
import subprocess
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any

import pytest
from as_owner import LNK, lnk_argv, owner_env, run_as_owner
from internet_box import proxy_config
from net import TELEGRAM, WWW

RunningBox = Any  # tests/e2e/conftest.py

pytestmark = [pytest.mark.needs_root, pytest.mark.e2e]

EXIT_REFUSED = 126  # lnk_shared.errors.EXIT_RUN_REFUSED: a run refused
RULE = "telegram:bot:getMe,sendMessage"
PLACEHOLDER = "0:lnk-secret-bot"
CURL = "curl -sS --max-time 20"


@pytest.fixture
def netbox(running_box: RunningBox, private_box: Any, internet: Any) -> Iterator[Any]:
    services = proxy_config(internet, f'unsafe_service_ca = "{internet.ca_file}"')
    with private_box(proxy_config=services) as box:
        yield box


def _token() -> str:
    """A value shaped as a real bot token (digits, ':', 35 URL-safe characters)."""
    return f"{secrets.randbelow(10**9) + 10**9}:AA{secrets.token_urlsafe(26)[:33]}"


def _lnk(
    running_box: RunningBox, box: Any, *args: str, stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    return run_as_owner(running_box, [LNK, *args], box=box, input=stdin, timeout=90)


def _sandbox_argv(running_box: RunningBox, script: str, *flags: str) -> list[str]:
    commands = [f"--command={c}" for c in ("curl", "cat", "tr", "grep", "touch")]
    run = ["sandbox", "run", "--yes", *commands, f"--service={RULE}", *flags]
    return lnk_argv(running_box, *run, "--", "/bin/sh", "-c", script)


def _in_sandbox(
    running_box: RunningBox, box: Any, script: str, stdin: str = "", flags: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        _sandbox_argv(running_box, script, *flags),
        env=owner_env(running_box, box),
        cwd=str(running_box.owner.home),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


def _holding(folder: Path, needle: str) -> list[str]:
    """The files under `folder` (the box's state: its database and WAL, wire logs, service
    logs; its run folder) whose bytes hold `needle`."""
    found = []
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink():
            with suppress(OSError):
                if needle.encode() in path.read_bytes():
                    found.append(str(path))
    return found


def _wire(box: Any) -> str:
    return "".join(p.read_text() for p in (Path(box.state_dir) / "wire").rglob("*") if p.is_file())


def _set_secret(running_box: RunningBox, box: Any, value: str, name: str = "bot") -> None:
    done = _lnk(running_box, box, "secret", "set", name, stdin=value + "\n")
    assert done.returncode == 0, done.stderr


def test_the_proxy_adds_the_secret_upstream_and_it_appears_nowhere(
    running_box: RunningBox, netbox: Any, internet: Any
) -> None:
    token = _token()
    _set_secret(running_box, netbox, token)
    before = len(internet.requests(internet.other))
    script = (
        f'{CURL} "http://{TELEGRAM}/bot$TELEGRAM_BOT_TOKEN/getMe"; echo; '
        f'{CURL} -d text=hello "http://{TELEGRAM}/bot$TELEGRAM_BOT_TOKEN/sendMessage"; echo; '
        "cat /proc/self/environ | tr '\\0' '\\n'; cat /proc/1/cmdline; "
        'read probe; echo; echo found:; grep -rs -l -- "$probe" /tmp /run /etc /dev/shm ~ '
        "/proc/1/environ /proc/1/cmdline; echo end"
    )
    # The value reaches the sandbox on its stdin only (never its argv, which is recorded), for
    # its own search of the files it can read.
    ran = _in_sandbox(running_box, netbox, script, stdin=token.split(":")[1] + "\n")
    assert ran.returncode == 0, ran.stderr
    answers = [json.loads(line) for line in ran.stdout.splitlines()[:2]]
    assert [a["result"]["method"] for a in answers] == ["getMe", "sendMessage"]
    assert answers[1]["result"]["body"] == "text=hello"
    # The upstream echoed the token it got: the sandbox sees the placeholder in its place.
    assert [a["result"]["token"] for a in answers] == [PLACEHOLDER, PLACEHOLDER]
    assert f"TELEGRAM_BOT_TOKEN={PLACEHOLDER}" in ran.stdout
    # The upstream's own record: the real token arrived, at its template position only.
    arrived = internet.requests(internet.other)[before:]
    assert [r["path"] for r in arrived] == [f"/bot{token}/getMe", f"/bot{token}/sendMessage"]
    # Nowhere else: not in the sandbox (environment, files, /proc), nor its output, the wire
    # log, the state folder (the database), the sandbox list, or any error.
    secret_part = token.split(":")[1]
    assert ran.stdout.endswith("\nfound:\nend\n"), ran.stdout  # its search found no file
    assert secret_part not in ran.stdout + ran.stderr
    wire = _wire(netbox)
    assert f"http://{TELEGRAM}/bot{PLACEHOLDER}/getMe" in wire
    assert secret_part not in wire
    assert _holding(Path(netbox.state_dir), secret_part) == []
    assert _holding(Path(netbox.run_dir), secret_part) == []
    listed = _lnk(running_box, netbox, "sandbox", "list", "--all", "--json")
    assert listed.returncode == 0 and secret_part not in listed.stdout + listed.stderr


@pytest.mark.parametrize(
    ("request_args", "rule"),
    [
        (f"http://{TELEGRAM}/bot{PLACEHOLDER}/getUpdates", "service-method"),
        (f"http://{TELEGRAM}/bot{PLACEHOLDER}/setWebhook?url=http://x.example/", "service-never"),
        (f"http://{TELEGRAM}/bot{PLACEHOLDER}/../getUpdates", "service-path"),
        (f"http://{TELEGRAM}/bot123456:AAown-key-of-the-sandbox-0123456789ab/getMe", "own-key"),
        (f"-H 'Authorization: Bearer x' http://{TELEGRAM}/bot{PLACEHOLDER}/getMe", "own-key"),
        (f"https://{TELEGRAM}/bot{PLACEHOLDER}/getMe", "service-plain-http-only"),
    ],
    ids=["method", "never", "dot-segment", "own-token", "own-header", "connect"],
)
def test_a_refused_request_is_answered_by_the_proxy_and_nothing_reaches_the_service(
    running_box: RunningBox, netbox: Any, internet: Any, request_args: str, rule: str
) -> None:
    _set_secret(running_box, netbox, _token())
    before_requests = len(internet.requests(internet.other))
    before_accepted = internet.accepted(internet.other)
    script = f"{CURL} --path-as-is -o /dev/stderr -w '%{{http_code}}' {request_args}; true"
    ran = _in_sandbox(running_box, netbox, script)
    assert ran.returncode == 0, ran.stderr
    if rule == "service-plain-http-only":  # curl's CONNECT: the proxy's 403 ends it
        assert "403" in ran.stderr or ran.stdout.startswith("000"), ran
    else:
        assert ran.stdout == "403", ran
    assert rule in ran.stderr or rule in _wire(netbox)
    assert len(internet.requests(internet.other)) == before_requests
    assert internet.accepted(internet.other) == before_accepted


def test_a_secret_removed_while_the_sandbox_runs_refuses_its_next_request(
    running_box: RunningBox, netbox: Any, internet: Any
) -> None:
    token = _token()
    _set_secret(running_box, netbox, token)
    url = f"http://{TELEGRAM}/bot$TELEGRAM_BOT_TOKEN/getMe"
    script = (
        f"{CURL} -w ' %{{http_code}}\\n' \"{url}\"; read go; {CURL} -w ' %{{http_code}}' \"{url}\""
    )
    sandbox = subprocess.Popen(
        _sandbox_argv(running_box, script),
        env=owner_env(running_box, netbox),
        cwd=str(running_box.owner.home),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert sandbox.stdout is not None and sandbox.stdin is not None
        first = sandbox.stdout.readline()
        assert first.endswith(" 200\n"), first
        before = len(internet.requests(internet.other))
        removed = _lnk(running_box, netbox, "secret", "remove", "bot")
        assert removed.returncode == 0, removed.stderr
        out, err = sandbox.communicate("go\n", timeout=90)
    finally:
        if sandbox.poll() is None:
            sandbox.kill()
            sandbox.wait()
    assert out.endswith(" 403"), (out, err)
    assert "service-secret-gone" in out
    assert len(internet.requests(internet.other)) == before  # nothing went upstream
    assert token.split(":")[1] not in out + err + removed.stdout + removed.stderr


def test_a_secret_changed_while_the_sandbox_runs_is_used_from_its_next_request(
    running_box: RunningBox, netbox: Any, internet: Any
) -> None:
    """`lnk secret set` again while a sandbox runs: its next request carries the new value
    upstream, never the old one (a rotated-out key would otherwise go on being used)."""
    old, new = _token(), _token()
    _set_secret(running_box, netbox, old)
    url = f"http://{TELEGRAM}/bot$TELEGRAM_BOT_TOKEN/getMe"
    script = (
        f"{CURL} -w ' %{{http_code}}\\n' \"{url}\"; read go; {CURL} -w ' %{{http_code}}' \"{url}\""
    )
    sandbox = subprocess.Popen(
        _sandbox_argv(running_box, script),
        env=owner_env(running_box, netbox),
        cwd=str(running_box.owner.home),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert sandbox.stdout is not None and sandbox.stdin is not None
        first = sandbox.stdout.readline()
        assert first.endswith(" 200\n"), first
        before = len(internet.requests(internet.other))
        _set_secret(running_box, netbox, new)
        out, err = sandbox.communicate("go\n", timeout=90)
    finally:
        if sandbox.poll() is None:
            sandbox.kill()
            sandbox.wait()
    assert out.endswith(" 200"), (out, err)
    assert f'"token": "{PLACEHOLDER}"' in out  # scrubbed: the sandbox sees neither value
    arrived = internet.requests(internet.other)[before:]
    assert [r["path"] for r in arrived] == [f"/bot{new}/getMe"]
    for value in (old, new):
        assert value.split(":")[1] not in out + err


def test_a_sandbox_whose_secret_is_missing_is_not_started(
    running_box: RunningBox, netbox: Any
) -> None:
    marker = running_box.owner.home / ("ran-" + secrets.token_hex(3))
    ran = _in_sandbox(running_box, netbox, f"touch {marker}")
    assert ran.returncode == EXIT_REFUSED, ran.stderr
    assert "'bot'" in ran.stderr and "lnk secret set bot" in ran.stderr
    assert "Traceback" not in ran.stderr
    assert not marker.exists()


def test_a_bearer_rule_forces_its_key_in_authorization_and_scrubs_it_from_the_answer(
    running_box: RunningBox, netbox: Any, internet: Any
) -> None:
    key = "sk-" + secrets.token_urlsafe(30)
    _set_secret(running_box, netbox, _token())
    _set_secret(running_box, netbox, key, name="key")
    before = len(internet.requests(internet.www))
    url = f"http://{WWW}/headers"
    script = (
        f'{CURL} -H "Authorization: Bearer $LNK_SECRET_KEY" {url}; echo; '
        f"{CURL} -o /dev/null -w '%{{http_code}}' -H 'Authorization: Bearer mine' {url}"
    )
    flags = (f"--service=bearer:key@{WWW}:GET /headers",)
    ran = _in_sandbox(running_box, netbox, script, flags=flags)
    assert ran.returncode == 0, ran.stderr
    # The service echoed the head it got: the key in its place, scrubbed on the way back.
    assert "Authorization: Bearer lnk-secret-key" in ran.stdout
    assert ran.stdout.endswith("403")  # a key of its own: refused
    assert key not in ran.stdout + ran.stderr
    arrived = internet.requests(internet.www)[before:]
    assert [(r["path"], r["authorization"]) for r in arrived] == [("/headers", f"Bearer {key}")]
    assert key not in _wire(netbox)
    assert _holding(Path(netbox.state_dir), key) == []
