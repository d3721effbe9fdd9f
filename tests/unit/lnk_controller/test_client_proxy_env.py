"""The proxy's environment for common clients: a table of what each client reads."""

from __future__ import annotations

import shlex

import pytest

from lnk_controller.client_proxy_env import git_ssh_command, proxy_env

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


CONNECTOR = "/opt/lnk/venv/bin/lnk-connect"


def test_git_over_ssh_goes_through_the_boxs_connector_only_when_given() -> None:
    assert "GIT_SSH_COMMAND" not in proxy_env(PORT)
    command = proxy_env(PORT, connector=CONNECTOR, owner_home="/home/alice")["GIT_SSH_COMMAND"]
    assert shlex.split(command) == [
        "ssh",
        "-o",
        f"ProxyCommand={CONNECTOR} %h %p",
        "-o",
        "StrictHostKeyChecking=yes",  # never a prompt, never trust on first use
        "-o",
        "UserKnownHostsFile=~/.ssh/known_hosts /home/alice/.ssh/known_hosts",
        "-o",
        "IdentityFile=/home/alice/.ssh/id_ed25519",
        "-o",
        "IdentityFile=/home/alice/.ssh/id_ecdsa",
        "-o",
        "IdentityFile=/home/alice/.ssh/id_rsa",
    ]


@pytest.mark.parametrize(
    "home",
    [None, "/home/a b", "/home/x'y", "/home/$(id)", "relative", "/home/a\nb"],
)
def test_an_owner_home_ssh_could_not_read_plainly_is_left_out(home: str | None) -> None:
    words = shlex.split(git_ssh_command(CONNECTOR, home))
    assert words == [
        "ssh",
        "-o",
        f"ProxyCommand={CONNECTOR} %h %p",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "UserKnownHostsFile=~/.ssh/known_hosts",
    ]


def test_a_connector_path_is_quoted_for_both_shells() -> None:
    odd = "/opt/l nk/bin/lnk-connect"
    proxy = shlex.split(git_ssh_command(odd, None))[2]  # what git's sh hands ssh
    assert proxy == "ProxyCommand='/opt/l nk/bin/lnk-connect' %h %p"  # what ssh's shell reads
    assert shlex.split(proxy.removeprefix("ProxyCommand="))[0] == odd
