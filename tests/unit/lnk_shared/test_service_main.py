"""A service's `main` refuses to run as root or as a sandbox's uid before it runs anything, runs
as a system user, and makes the box's errors its exit status; the controller alone runs as
root. The identities are real: a forked child drops to each uid before it calls `main`."""

from __future__ import annotations

import os

import pytest

from lnk_shared.errors import EXIT_USAGE, ConfigError, StateError
from lnk_shared.service_identity import MIN_SANDBOX_UID
from lnk_shared.service_main import service_main

SYSTEM_UID = 65534  # nobody: a system user, as a service's own is
RAN = 42  # the child's exit status when `run` ran


def main_as(uid: int | None, *, own_user: bool = True) -> int:
    """`service_main`'s status in a child running as `uid` (None: as this process): RAN when
    its `run` ran and returned."""

    def run() -> None:
        os._exit(RAN)

    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            if uid is not None:
                os.setgroups([])
                os.setresgid(SYSTEM_UID, SYSTEM_UID, SYSTEM_UID)
                os.setresuid(uid, uid, uid)
            os.close(2)  # the refusal's words are checked below, in this process
            os._exit(service_main("lnk-test", "lnk_test", run, own_user=own_user))
        except BaseException:
            os._exit(99)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@pytest.mark.needs_root
def test_root_is_refused_and_nothing_runs() -> None:
    assert main_as(None) == EXIT_USAGE


@pytest.mark.needs_root
@pytest.mark.parametrize("uid", [MIN_SANDBOX_UID, MIN_SANDBOX_UID + 12_345])
def test_a_sandbox_uid_is_refused_and_nothing_runs(uid: int) -> None:
    assert main_as(uid) == EXIT_USAGE


@pytest.mark.needs_root
def test_a_system_user_runs_the_service() -> None:
    assert main_as(SYSTEM_UID) == RAN


@pytest.mark.needs_root
def test_the_controller_runs_as_root() -> None:
    assert main_as(None, own_user=False) == RAN


@pytest.mark.needs_root
def test_the_refusal_names_the_service_and_why(capsys: pytest.CaptureFixture[str]) -> None:
    ran = []
    assert service_main("lnk-test", "lnk_test", lambda: ran.append(1)) == EXIT_USAGE
    assert ran == []
    assert capsys.readouterr().err == "lnk-test: lnk_test runs as its own system user, not root\n"


@pytest.mark.parametrize(
    ("error", "status"), [(ConfigError("x.toml: invalid config"), 2), (StateError("gone"), 1)]
)
def test_a_box_error_is_said_once_and_is_the_exit_status(
    error: Exception, status: int, capsys: pytest.CaptureFixture[str]
) -> None:
    def run() -> None:
        raise error

    assert service_main("lnk-test", "lnk_test", run, own_user=False) == status
    assert capsys.readouterr().err == f"lnk-test: {error}\n"


def test_an_error_outside_the_box_s_is_not_swallowed() -> None:
    def run() -> None:
        raise ZeroDivisionError

    with pytest.raises(ZeroDivisionError):
        service_main("lnk-test", "lnk_test", run, own_user=False)
