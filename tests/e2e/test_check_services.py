"""`lnk sandbox check` against a `[[services]]` rule, on a private box whose proxy speaks to
the test internet's Bot API shape: a method the rule does not list, a CONNECT to the rule's
host and a request with a key of the sandbox's own are each refused, and nothing reaches the
service (its own record); with the proxy's test-only `unsafe_skip_service_method_check` the
method probe is reported `leaked` (and the service's record shows it arrived), the others
still refused."""

from __future__ import annotations

import json
import secrets
import subprocess
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import install_prefix
import pytest
from as_user import as_user
from net import TestInternet

RunningBox = Any  # tests/e2e/conftest.py

pytestmark = [pytest.mark.needs_root, pytest.mark.e2e]

LNK = str(install_prefix.LNK)
CHECK_TIMEOUT_S = 240
IDENT = "service:telegram:api.telegram.org"


@pytest.fixture(scope="module")
def internet() -> Iterator[Any]:
    with TestInternet() as net:
        yield net


def _box(
    private_box: Callable[..., AbstractContextManager[Any]], internet: Any, extra: str = ""
) -> AbstractContextManager[Any]:
    proxy_config = (
        f'unsafe_public_networks = ["{internet.public_subnet}"]\n'
        f'unsafe_dns_table = "{internet.dns_file}"\n'
        f'unsafe_service_ca = "{internet.ca_file}"\n{extra}'
    )
    return private_box(proxy_config=proxy_config)


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


def _check(running_box: RunningBox, box: Any) -> tuple[int, dict[str, str], str]:
    value = f"{secrets.randbelow(10**9) + 10**9}:AA{secrets.token_urlsafe(26)[:33]}"
    kept = _lnk(running_box, box, "secret", "set", "bot", stdin=value + "\n")
    assert kept.returncode == 0, kept.stderr
    done = _lnk(
        running_box,
        box,
        "sandbox",
        "check",
        "--json",
        "--service=telegram:bot:getMe,sendMessage",
        timeout=CHECK_TIMEOUT_S,
    )
    try:
        doc = json.loads(done.stdout)
    except ValueError:
        pytest.fail(f"no JSON report (exit {done.returncode}): {done.stderr}")
    assert value.split(":")[1] not in done.stdout + done.stderr
    verdicts = {p["id"]: p["verdict"] for p in doc["probes"] if p["id"].startswith(IDENT)}
    return done.returncode, verdicts, done.stderr


def test_check_tries_each_service_attack_and_each_is_refused_with_nothing_upstream(
    running_box: RunningBox, private_box: Any, internet: Any
) -> None:
    with _box(private_box, internet) as box:
        before, accepted = len(internet.requests(internet.other)), internet.accepted(internet.other)
        code, verdicts, stderr = _check(running_box, box)
    assert verdicts == {
        f"{IDENT}:method": "refused",
        f"{IDENT}:connect": "refused",
        f"{IDENT}:own-key": "refused",
    }, stderr
    assert code == 0, stderr
    assert len(internet.requests(internet.other)) == before  # the service's own record
    assert internet.accepted(internet.other) == accepted


def test_the_unsafe_switch_makes_check_report_the_method_probe_leaked(
    running_box: RunningBox, private_box: Any, internet: Any
) -> None:
    with _box(private_box, internet, "unsafe_skip_service_method_check = true") as box:
        before = len(internet.requests(internet.other))
        code, verdicts, stderr = _check(running_box, box)
    assert verdicts == {
        f"{IDENT}:method": "leaked",
        f"{IDENT}:connect": "refused",
        f"{IDENT}:own-key": "refused",
    }, stderr
    assert code != 0
    arrived = internet.requests(internet.other)[before:]
    assert [r["path"].rpartition("/")[2] for r in arrived] == ["getUpdates"]
