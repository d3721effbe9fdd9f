"""Which variables a sandbox may be given: every refused class with another spelling of it, the
box's own names, the forms a name and a value may take, and the limits."""

from __future__ import annotations

import pytest

from lnk_shared.env_names import (
    MAX_ENV_ENTRIES,
    MAX_ENV_NAME_CHARS,
    MAX_ENV_TOTAL_BYTES,
    MAX_ENV_VALUE_BYTES,
    REFUSED_NAMES,
    check_env_entries,
    env_flags,
    env_name_problem,
    env_value_problem,
    refusal_reason,
    split_env_flag,
)
from lnk_shared.errors import UsageError


@pytest.mark.parametrize(
    ("name", "because"),
    [
        # glibc's UNSECURE_ENVVARS, each of them, and LD_ names it does not list
        ("LD_PRELOAD", "loader"),
        ("LD_LIBRARY_PATH", "loader"),
        ("LD_AUDIT", "loader"),
        ("LD_DEBUG_OUTPUT", "loader"),
        ("LD_BIND_NOW", "loader"),
        ("LD_", "loader"),
        ("LD_ASSUME_KERNEL", "loader"),
        ("GCONV_PATH", "iconv"),
        ("GETCONF_DIR", "getconf"),
        ("GLIBC_TUNABLES", "malloc"),
        ("HOSTALIASES", "resolve"),
        ("LOCALDOMAIN", "resolve"),
        ("RES_OPTIONS", "resolver"),
        ("RESOLV_HOST_CONF", "resolver"),
        ("LOCPATH", "locale"),
        ("NLSPATH", "catalogues"),
        ("TZDIR", "time zone"),
        ("MALLOC_TRACE", "malloc"),
        ("NIS_PATH", "NIS"),
        ("TMPDIR", "/tmp"),
        # shells
        ("BASH_ENV", "bash sources"),
        ("ENV", "source"),
        ("BASH_FUNC_ls%%", "exported function"),
        ("BASH_FUNC_echo()", "exported function"),
        ("SHELLOPTS", "bash options"),
        ("BASHOPTS", "bash options"),
        ("PS4", "command substitution"),
        ("PROMPT_COMMAND", "prompt"),
        ("IFS", "splits"),
        ("CDPATH", "cd"),
        ("GLOBIGNORE", "patterns"),
        # the box's own
        ("HOME", "box sets"),
        ("PATH", "box sets"),
        ("USER", "box sets"),
        ("LOGNAME", "box sets"),
        ("SHELL", "box sets"),
        ("BROWSER", "box sets"),
        ("HTTP_PROXY", "proxy"),
        ("https_proxy", "proxy"),
        ("Https_Proxy", "proxy"),
        ("ALL_PROXY", "proxy"),
        ("no_proxy", "proxy"),
        ("GRPC_PROXY", "proxy"),
        ("FTP_PROXY", "proxy"),
        ("NODE_USE_ENV_PROXY", "Node"),
        ("JAVA_TOOL_OPTIONS", "Java"),
        ("GIT_SSH_COMMAND", "git"),
        ("GIT_SSH", "git"),
        ("GIT_PROXY_COMMAND", "git"),
        ("TELEGRAM_BOT_TOKEN", "placeholder"),
        ("LNK_SANDBOX_ID", "box's own"),
        ("LNK_SECRET_BOT", "box's own"),
        ("LNK_RUN_DIR", "box's own"),
    ],
)
def test_a_name_that_changes_what_runs_or_is_the_boxs_is_refused(name: str, because: str) -> None:
    why = refusal_reason(name)
    assert why is not None, name
    assert because in why


@pytest.mark.parametrize(
    "name",
    [
        "ANTHROPIC_API_KEY",
        "OPENAI_API_KEY",
        "PYTHONPATH",
        "NODE_PATH",
        "NODE_OPTIONS",
        "PERL5LIB",
        "GOPATH",
        "CI",
        "DEBUG",
        "ld_preload",  # not the loader's: it reads LD_PRELOAD only
        "XLD_PRELOAD",
        "MY_ENV",
        "ENVIRONMENT",
        "PROXY",  # not a *_PROXY name
        "LANG",
        "TERM",
        "_",
    ],
)
def test_an_ordinary_name_is_allowed(name: str) -> None:
    assert refusal_reason(name) is None


def test_every_named_refusal_says_why() -> None:
    assert REFUSED_NAMES
    for name, why in REFUSED_NAMES.items():
        assert env_name_problem(name) is None, name
        assert len(why) > 20, name


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("", "empty"),
        ("1ABC", "not starting with a digit"),
        ("A-B", "letters, digits and _"),
        ("A B", "letters, digits and _"),
        ("A=B", "letters, digits and _"),
        ("A\x00B", "letters, digits and _"),
        ("A\nB", "letters, digits and _"),
        ("NAMÉ", "letters, digits and _"),
        ("A" * (MAX_ENV_NAME_CHARS + 1), "longer"),
    ],
)
def test_a_name_of_another_form_is_refused(name: str, problem: str) -> None:
    said = env_name_problem(name)
    assert said is not None and problem in said


def test_a_name_at_the_limit_is_allowed() -> None:
    assert env_name_problem("A" * MAX_ENV_NAME_CHARS) is None


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("a\x00b", "NUL"),
        ("x" * (MAX_ENV_VALUE_BYTES + 1), "longer"),
        ("é" * (MAX_ENV_VALUE_BYTES // 2 + 1), "longer"),  # counted in bytes, not characters
    ],
)
def test_a_value_that_no_environment_holds_is_refused_without_quoting_it(
    value: str, problem: str
) -> None:
    said = env_value_problem(value)
    assert said is not None and problem in said
    assert value[:8] not in said


@pytest.mark.parametrize("value", ["", "sk-ant-123", "a=b=c", "spaces and\nlines", "x" * 1024])
def test_a_plain_value_is_allowed(value: str) -> None:
    assert env_value_problem(value) is None


@pytest.mark.parametrize(
    ("text", "split"),
    [
        ("KEY", ("KEY", None)),
        ("KEY=", ("KEY", "")),
        ("KEY=v", ("KEY", "v")),
        ("KEY=a=b", ("KEY", "a=b")),
        ("=v", ("", "v")),
    ],
)
def test_an_env_flag_splits_at_its_first_equals(text: str, split: tuple[str, str | None]) -> None:
    assert split_env_flag(text) == split


def test_a_bare_name_takes_the_callers_value_and_others_are_kept() -> None:
    environ = {"KEY": "from-caller", "OTHER": "never sent"}
    assert env_flags(["KEY", "B=given"], environ) == ["KEY=from-caller", "B=given"]


def test_a_bare_name_the_caller_lacks_is_a_usage_error_naming_it() -> None:
    with pytest.raises(UsageError, match="--env MISSING: not set in your environment"):
        env_flags(["MISSING"], {})


def test_the_limits_on_entries_hold() -> None:
    check_env_entries({f"V{i}": "" for i in range(MAX_ENV_ENTRIES)})
    with pytest.raises(ValueError, match="more than"):
        check_env_entries({f"V{i}": "" for i in range(MAX_ENV_ENTRIES + 1)})
    big = MAX_ENV_VALUE_BYTES - 8
    count = MAX_ENV_TOTAL_BYTES // big + 1
    with pytest.raises(ValueError, match="bytes together"):
        check_env_entries({f"V{i}": "x" * big for i in range(count)})
