"""The proxy's environment for common clients: a table of what each client reads."""

from __future__ import annotations

import pytest

from lnk_controller.client_proxy_env import proxy_env

PORT = 3128
URL = f"http://127.0.0.1:{PORT}"
JAVA = (
    f"-Dhttp.proxyHost=127.0.0.1 -Dhttp.proxyPort={PORT} -Dhttps.proxyHost=127.0.0.1 "
    f"-Dhttps.proxyPort={PORT} -Dhttp.nonProxyHosts=localhost|127.*|[::1]"
)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("HTTP_PROXY", URL),
        ("https_proxy", URL),
        ("ALL_PROXY", URL),
        ("GRPC_PROXY", URL),
        ("NODE_USE_ENV_PROXY", "1"),  # Node >= 22.21 / 24.5: fetch and http(s) read the rest
        ("NO_PROXY", "localhost,127.0.0.1,::1"),  # its relays: [localhost] ports, the bridge
        ("no_proxy", "localhost,127.0.0.1,::1"),
        ("JAVA_TOOL_OPTIONS", JAVA),  # Java reads no proxy variable
    ],
)
def test_each_client_is_pointed_at_the_relay(name: str, value: str) -> None:
    assert proxy_env(PORT)[name] == value


def test_the_relays_port_is_the_one_given() -> None:
    env = proxy_env(3130)
    assert env["HTTPS_PROXY"] == "http://127.0.0.1:3130"
    assert "-Dhttps.proxyPort=3130" in env["JAVA_TOOL_OPTIONS"]


@pytest.mark.parametrize(
    ("caller", "expected"),
    [
        ({}, JAVA),
        ({"JAVA_TOOL_OPTIONS": "  "}, JAVA),
        ({"JAVA_TOOL_OPTIONS": "-Xmx256m"}, f"-Xmx256m {JAVA}"),
        # the caller's own proxy options come first: Java keeps the last -D, the box's
        ({"JAVA_TOOL_OPTIONS": "-Dhttps.proxyHost=evil"}, f"-Dhttps.proxyHost=evil {JAVA}"),
    ],
)
def test_a_callers_java_options_are_kept_before_the_boxs(
    caller: dict[str, str], expected: str
) -> None:
    assert proxy_env(PORT, caller)["JAVA_TOOL_OPTIONS"] == expected


def test_no_caller_value_overrides_a_proxy_variable() -> None:
    caller = {"HTTP_PROXY": "http://elsewhere:1", "NO_PROXY": "*"}
    env = {**caller, **proxy_env(PORT, caller)}  # as launch.py spreads them
    assert env["HTTP_PROXY"] == URL and env["NO_PROXY"] == "localhost,127.0.0.1,::1"
