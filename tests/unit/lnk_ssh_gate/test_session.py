"""SSH_ORIGINAL_COMMAND to what runs in the sandbox, and the environment allowlist."""

from __future__ import annotations

import pytest

from lnk_ssh_gate.session import (
    MAX_COMMAND_BYTES,
    SessionCommandRefused,
    session_command,
    session_env,
)


def test_no_command_is_a_login_bash() -> None:
    assert session_command(None).argv == ("/bin/bash", "-l")


@pytest.mark.parametrize(
    "original",
    ["id -u; hostname", "", "scp -t -- /srv/w/x", "scp -f /srv/w/x", "() { :;}; id", "$(id)"],
)
def test_a_command_even_empty_is_bash_c_with_the_string_untouched(original: str) -> None:
    command = session_command(original)
    assert command.argv == ("/bin/bash", "-c", original)
    assert command.kind == "command"


@pytest.mark.parametrize("original", ["/usr/lib/openssh/sftp-server", "internal-sftp"])
def test_the_sftp_subsystem_is_the_sandboxs_sftp_server(original: str) -> None:
    assert session_command(original).argv == ("/usr/lib/openssh/sftp-server",)


def test_sftp_with_arguments_is_just_a_command() -> None:
    assert session_command("internal-sftp -d /etc").argv[:2] == ("/bin/bash", "-c")


def test_an_over_long_command_is_refused() -> None:
    with pytest.raises(SessionCommandRefused, match="over the limit"):
        session_command("x" * (MAX_COMMAND_BYTES + 1))
    assert session_command("x" * MAX_COMMAND_BYTES).kind == "command"


def test_a_command_that_is_not_utf8_is_refused() -> None:
    with pytest.raises(SessionCommandRefused, match="UTF-8"):
        session_command("echo \udcff")


def test_only_terminal_and_locale_names_pass_as_plain_values() -> None:
    env = session_env(
        {
            "TERM": "xterm-256color",
            "LANG": "C.UTF-8",
            "LC_TIME": "en_GB.UTF-8",
            "LC_EVIL": "() { :;}; touch /tmp/x",
            "SSH_AUTH_SOCK": "/tmp/ssh-x/agent.1",
            "DISPLAY": ":10",
            "SSH_CONNECTION": "127.0.0.1 1 127.0.0.1 22",
            "LD_PRELOAD": "/tmp/x.so",
            "PATH": "/tmp",
        }
    )
    assert env == {"TERM": "xterm-256color", "LANG": "C.UTF-8", "LC_TIME": "en_GB.UTF-8"}


def test_an_empty_environment_passes_nothing() -> None:
    assert session_env({}) == {}
