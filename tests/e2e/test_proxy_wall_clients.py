"""Common clients from inside a real sandbox through the proxy, against the test internet
(`net.py`): Python's urllib, requests and pip reach an allowed host and are refused an unlisted
one, which sees nothing. The proxy's own wall: test_proxy_wall.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from internet_box import in_sandbox
from net import OTHER, WWW

RunningBox = Any  # tests/e2e/conftest.py
pytestmark = [pytest.mark.needs_root, pytest.mark.e2e]

# `internet`, `netbox` and `ca_dir`: tests/e2e/conftest.py.


# -- common clients from inside a sandbox: Python's urllib, requests, pip --------------------

# Run inside the sandbox by /usr/bin/python3. `requests` and `httpx` are not installed in
# /opt/lnk/venv nor for /usr/bin/python3: the `requests` here is the copy pip vendors
# (pip._vendor.requests), the one pip itself downloads with.
CLIENTS = """
import json, ssl, sys, urllib.error, urllib.request
from pip._vendor import requests
ca, www, other = sys.argv[1:4]
tls = ssl.create_default_context(cafile=ca)
out = {}
for scheme in ("http", "https"):
    with urllib.request.urlopen(f"{scheme}://{www}/", timeout=10, context=tls) as answer:
        out[f"urllib {scheme}"] = answer.read().decode()
    out[f"requests {scheme}"] = requests.get(f"{scheme}://{www}/", verify=ca, timeout=10).text
try:
    urllib.request.urlopen(f"http://{other}/", timeout=10)
except urllib.error.HTTPError as refused:
    out["urllib http other"] = f"{refused.code} {refused.read().decode().strip()}"
for client, call in (
    ("urllib", lambda: urllib.request.urlopen(f"https://{other}/", timeout=10, context=tls)),
    ("requests", lambda: requests.get(f"https://{other}/", verify=ca, timeout=10)),
):
    try:
        call()
        out[f"{client} https other"] = "reached"
    except Exception as refused:
        out[f"{client} https other"] = f"{type(refused).__name__}: {refused}"[:300]
print(json.dumps(out))
"""

PIP = "python3 -m pip --disable-pip-version-check --no-cache-dir"
LIST_DOWNLOADS = 'import os; print(*os.listdir("/tmp/https"), *os.listdir("/tmp/http"))'


def test_python_clients_and_pip_reach_an_allowed_host_and_never_an_unlisted_one(
    running_box: RunningBox, netbox: Any, internet: Any, ca_dir: Path
) -> None:
    """urllib, requests and pip (download over https and http, install) use the proxy from the
    environment; an unlisted host is refused to each of them and its listener sees nothing."""
    (ca_dir / "clients.py").write_text(CLIENTS)
    (ca_dir / "clients.py").chmod(0o644)
    ca = f"{ca_dir}/ca.pem"
    index = f"--index-url https://{WWW}/simple/ --cert {ca}"
    other_index = f"--index-url https://{OTHER}/simple/ --cert {ca}"
    plain_index = f"--index-url http://{WWW}/simple/ --trusted-host {WWW}"
    www_before, other_before = internet.accepted(internet.www), internet.accepted(internet.other)
    result = in_sandbox(
        running_box,
        netbox,
        ca_dir,
        f"--internet-host={WWW}",
        "--command=python3",
        script=(
            f"python3 {ca_dir}/clients.py {ca} {WWW} {OTHER} && "
            f"{PIP} download --no-deps {index} --dest /tmp/https lnk-demo >/dev/null && "
            f"{PIP} download --no-deps {plain_index} --dest /tmp/http lnk-demo >/dev/null && "
            f"{PIP} install --no-deps {index} --target /tmp/site lnk-demo >/dev/null && "
            f"python3 -c '{LIST_DOWNLOADS}' && "
            "PYTHONPATH=/tmp/site python3 -c 'import lnk_demo; print(lnk_demo.GREETING)' && "
            f"{{ {PIP} download --no-deps --retries 0 {other_index} --dest /tmp/other lnk-demo "
            ">/dev/null 2>&1; echo other-index=$?; }"
        ),
    )
    assert result.returncode == 0, (result.stdout, result.stderr)
    lines = result.stdout.splitlines()
    clients = json.loads(lines[0])
    for client in ("urllib", "requests"):
        for scheme in ("http", "https"):
            assert clients[f"{client} {scheme}"] == f"{WWW}\n", clients
        assert "403" in clients[f"{client} https other"], clients  # the CONNECT's answer
    assert clients["urllib http other"] == "403 lnk: refused (not-listed)"
    wheel = "lnk_demo-1.0-py3-none-any.whl"
    assert f"{wheel} {wheel}" in lines  # downloaded over https and over http
    assert "hello from the test internet" in lines
    assert lines[-1] not in ("other-index=0", "") and lines[-1].startswith("other-index=")
    assert internet.accepted(internet.other) == other_before
    assert internet.accepted(internet.www) > www_before
