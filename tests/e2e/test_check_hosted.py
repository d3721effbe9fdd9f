"""`lnk sandbox check` against a hosted `[[models]]` rule, on a private box whose proxy speaks to
the test internet's Anthropic-shaped API: a server tool, a URL fetch, the owner's files, a
CONNECT to the provider and a request with a key of the sandbox's own are each refused, and
nothing reaches the provider (its own record); with the proxy's test-only
`unsafe_keep_server_tools` the server-tool probe is reported `leaked`, the others still
refused."""

from __future__ import annotations

import json
import secrets
import subprocess
from typing import Any

import install_prefix
import pytest
from as_user import as_user
from net import TestInternet

RunningBox = Any  # tests/e2e/conftest.py

pytestmark = [pytest.mark.needs_root, pytest.mark.e2e]

LNK = str(install_prefix.LNK)
CHECK_TIMEOUT_S = 240
IDENT = "model:anthropic:4001"


def _lnk(
    running_box: RunningBox, box: Any, *args: str, stdin: str = "", timeout: float = 90
) -> subprocess.CompletedProcess[str]:
    owner = running_box.owner
    env = {**running_box.owner_env(), **{k: v for k, v in box.env.items() if k.startswith("LNK_")}}
    return subprocess.run(
        as_user(owner.uid, owner.gid, LNK, *args),
        env=env,
        cwd=str(owner.home),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.mark.parametrize("unsafe", [False, True], ids=["safe", "unsafe_keep_server_tools"])
def test_check_tries_each_hosted_model_attack_with_nothing_reaching_the_provider(
    running_box: RunningBox, private_box: Any, unsafe: bool
) -> None:
    with TestInternet() as internet:
        proxy_config = (
            f'unsafe_public_networks = ["{internet.public_subnet}"]\n'
            f'unsafe_dns_table = "{internet.dns_file}"\n'
            f'unsafe_service_ca = "{internet.ca_file}"\n'
            + ("unsafe_keep_server_tools = true\n" if unsafe else "")
        )
        key = "sk-ant-api03-" + secrets.token_urlsafe(30)
        with private_box(proxy_config=proxy_config) as box:
            kept = _lnk(running_box, box, "secret", "set", "claude", stdin=key + "\n")
            assert kept.returncode == 0, kept.stderr
            done = _lnk(
                running_box,
                box,
                "sandbox",
                "check",
                "--json",
                "--model=anthropic=claude-x;secret=claude",
                timeout=CHECK_TIMEOUT_S,
            )
        try:
            doc = json.loads(done.stdout)
        except ValueError:
            pytest.fail(f"no JSON report (exit {done.returncode}): {done.stderr}")
        verdicts = {p["id"]: p["verdict"] for p in doc["probes"] if p["id"].startswith(IDENT)}
        arrived = internet.model_requests()
    assert key not in done.stdout + done.stderr
    assert verdicts == {
        f"{IDENT}:server-tool": "leaked" if unsafe else "refused",
        f"{IDENT}:url-fetch": "refused",
        f"{IDENT}:route": "refused",
        f"{IDENT}:connect": "refused",
        f"{IDENT}:own-key": "refused",
    }, done.stderr
    assert (done.returncode != 0) is unsafe, done.stderr
    assert arrived == []  # the provider's own record: no probe ever reached it
