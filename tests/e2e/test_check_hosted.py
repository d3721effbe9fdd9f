"""`lnk sandbox check` against a hosted `[[models]]` rule under `[internet] *`, on a private box
whose proxy speaks to the test internet's Anthropic-shaped API: a server tool, a URL fetch, the
owner's files, a CONNECT to the provider by name, by its address and by another name for it,
and a request with a key of the sandbox's own are each refused, and nothing reaches the
provider (its own record); with the proxy's test-only `unsafe_keep_server_tools` the
server-tool probe is reported `leaked`, with `unsafe_hosted_tunnel_by_address` the other-name
probe (and the provider's host accepts its tunnel), with `unsafe_unbounded_model_bodies` the
over-deep and over-wide body probes (parsed, then refused for another reason: still nothing
reaches the provider), with `unsafe_per_level_nesting` the nesting's cost probe (many runs
nested just within the bound, refused seconds after a flat body of the same size), with
`unsafe_naive_content_screen` the fast form's probes (escaped keys, a type given twice, bad
UTF-8: let by the naive screen, then refused for the model, not for what they spell), the others
still refused.

The check looks the provider up as the caller, with this machine's resolver: the check runs in
a mount namespace of its own whose /etc/hosts names the test internet's host as the provider
and as `other.test-public.example` (what the proxy's test table says of them)."""

from __future__ import annotations

import json
import secrets
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import install_prefix
import pytest
from as_user import as_user
from net import ANTHROPIC, OTHER, TestInternet

RunningBox = Any  # tests/e2e/conftest.py

pytestmark = [pytest.mark.needs_root, pytest.mark.e2e]

LNK = str(install_prefix.LNK)
CHECK_TIMEOUT_S = 240
IDENT = "model:anthropic:4001"


def _lnk(
    running_box: RunningBox,
    box: Any,
    *args: str,
    stdin: str = "",
    timeout: float = 90,
    hosts: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    owner = running_box.owner
    env = {**running_box.owner_env(), **{k: v for k, v in box.env.items() if k.startswith("LNK_")}}
    argv = as_user(owner.uid, owner.gid, LNK, *args)
    if hosts is not None:  # this process's own /etc/hosts: no other process sees it
        bind = 'mount --bind "$0" /etc/hosts && exec "$@"'
        argv = [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            bind,
            str(hosts),
        ]
        argv += as_user(owner.uid, owner.gid, LNK, *args)
    return subprocess.run(
        argv,
        env=env,
        cwd=str(owner.home),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


UNSAFE = (
    "",
    "unsafe_keep_server_tools",
    "unsafe_hosted_tunnel_by_address",
    "unsafe_unbounded_model_bodies",
    "unsafe_per_level_nesting",
    "unsafe_naive_content_screen",
)
FAST_FORM = ("fast-escaped-key", "fast-twice-type", "fast-bad-utf8", "fast-deep-escaped-key")
LEAKS = {
    "unsafe_keep_server_tools": "server-tool",
    "unsafe_hosted_tunnel_by_address": "other",
    "unsafe_unbounded_model_bodies": "bodies",
    "unsafe_per_level_nesting": "nesting",
    "unsafe_naive_content_screen": "fast",
}


@pytest.mark.parametrize("unsafe", UNSAFE, ids=["safe", *UNSAFE[1:]])
def test_check_tries_each_hosted_model_attack_with_nothing_reaching_the_provider(
    running_box: RunningBox, private_box: Any, unsafe: str
) -> None:
    with TestInternet() as internet, tempfile.TemporaryDirectory(prefix="lnkhosts") as tmp:
        hosts = Path(tmp) / "hosts"
        hosts.write_text(
            f"127.0.0.1 localhost\n::1 localhost\n{internet.other.address} {ANTHROPIC} {OTHER}\n"
        )
        Path(tmp).chmod(0o755)
        hosts.chmod(0o644)
        proxy_config = (
            f'unsafe_public_networks = ["{internet.public_subnet}"]\n'
            f'unsafe_dns_table = "{internet.dns_file}"\n'
            f'unsafe_service_ca = "{internet.ca_file}"\n' + (f"{unsafe} = true\n" if unsafe else "")
        )
        key = "sk-ant-api03-" + secrets.token_urlsafe(30)
        with private_box(proxy_config=proxy_config) as box:
            kept = _lnk(running_box, box, "secret", "set", "claude", stdin=key + "\n")
            assert kept.returncode == 0, kept.stderr
            before = internet.accepted(internet.other, 443)
            done = _lnk(
                running_box,
                box,
                "sandbox",
                "check",
                "--json",
                "--internet-host=*",
                "--model=anthropic=claude-x;secret=claude",
                timeout=CHECK_TIMEOUT_S,
                hosts=hosts,
            )
            tunnels = internet.accepted(internet.other, 443) - before
            proxy_log = (Path(box.state_dir) / "logs" / "proxy.log").read_text(errors="replace")
        try:
            doc = json.loads(done.stdout)
        except ValueError:
            pytest.fail(f"no JSON report (exit {done.returncode}): {done.stderr}")
        probes = {p["id"]: p for p in doc["probes"] if p["id"].startswith(IDENT)}
        verdicts = {i: p["verdict"] for i, p in probes.items()}
        arrived = internet.model_requests()
    assert key not in done.stdout + done.stderr
    leaked = LEAKS.get(unsafe)
    assert verdicts == {
        f"{IDENT}:server-tool": "leaked" if leaked == "server-tool" else "refused",
        f"{IDENT}:url-fetch": "refused",
        f"{IDENT}:route": "refused",
        f"{IDENT}:connect": "refused",
        f"{IDENT}:own-key": "refused",
        f"{IDENT}:connect-address": "refused",
        f"{IDENT}:connect-other-name": "leaked" if leaked == "other" else "refused",
        f"{IDENT}:deep-body": "leaked" if leaked == "bodies" else "refused",
        f"{IDENT}:wide-body": "leaked" if leaked == "bodies" else "refused",
        f"{IDENT}:nesting-cost": "leaked" if leaked == "nesting" else "refused",
        **{f"{IDENT}:{n}": "leaked" if leaked == "fast" else "refused" for n in FAST_FORM},
    }, (done.stderr, {n: p["observed"] for n, p in probes.items() if ":fast-" in n})
    for name in FAST_FORM:  # named: refused for the model, not for what the spelling is
        said = probes[f"{IDENT}:{name}"]["observed"]
        assert ("refusal does not say" in said) is (leaked == "fast"), said
    naive_used = "unsafe_naive_content_screen: a hosted request's conversation forwarded"
    assert (naive_used in proxy_log) is (leaked == "fast"), proxy_log[-2000:]
    nesting = probes[f"{IDENT}:nesting-cost"]["observed"]
    assert ("level by level" in nesting) is (leaked == "nesting"), nesting
    for name in ("connect-address", "connect-other-name"):  # tried, not skipped
        assert not probes[f"{IDENT}:{name}"]["observed"].startswith("not tried"), probes
    assert internet.other.address in probes[f"{IDENT}:connect-address"]["tried"]
    assert OTHER in probes[f"{IDENT}:connect-other-name"]["tried"]
    assert (done.returncode != 0) is bool(unsafe), done.stderr
    assert arrived == []  # the provider's own record: no probe's request ever reached it
    assert tunnels == (1 if leaked == "other" else 0)  # nor a tunnel, but the leak's
    if leaked == "other":  # named: the report's line, the proxy's warning on every use
        other = probes[f"{IDENT}:connect-other-name"]
        assert "the proxy's log shows it allowed" in other["observed"], other
        assert "unsafe_hosted_tunnel_by_address: a tunnel to" in proxy_log
    else:
        assert "unsafe_hosted_tunnel_by_address" not in proxy_log
    for name in ("deep-body", "wide-body"):  # named: refused, but not by the bound
        said = probes[f"{IDENT}:{name}"]["observed"]
        assert ("does not say 'before it was parsed'" in said) is (leaked == "bodies"), said
