"""A run's statuses (125 lnk's, 126 refused, 127 not found; the program's own otherwise) and
every other command's (0-3), as the clients choose them from an error."""

from __future__ import annotations

import pytest

from lnk_cli.agent_commands import start_words
from lnk_cli.app import run
from lnk_cli.exit_statuses import EPILOG, RUN_EPILOG, runs_a_program
from lnk_cli.launch_dialogue import RemoteError, reported
from lnk_shared import errors

# Each error the clients meet: (its status for a command that runs nothing, for a run).
STATUSES: list[tuple[errors.LnkError, int, int]] = [
    (errors.LnkError("x"), 1, 125),
    (errors.StateError("the box is not running"), 1, 125),
    (errors.UsageError("bad flag"), 2, 125),
    (errors.SpecError("bad key", source="s.toml", line=1), 2, 125),
    (errors.ConfigError("bad config"), 2, 125),
    (errors.ProgramNotFoundError("'nosuch' is not a program found"), 2, 127),
    (errors.ProgramCannotRunError("its interpreter is missing"), 2, 126),
    (errors.NotConfirmedError("not approved"), 1, 126),
    (errors.CommandRefused("make", "written code"), 3, 126),
    (errors.LaunchRefused("landlock", "missing"), 3, 126),
    (RemoteError("from the controller", 3, 126), 3, 126),
]


@pytest.mark.parametrize(("error", "plain", "in_a_run"), STATUSES, ids=lambda v: repr(v)[:40])
def test_each_error_has_its_status_for_a_run_and_otherwise(
    error: errors.LnkError, plain: int, in_a_run: int
) -> None:
    def fails() -> int:
        raise error

    assert (error.exit_code, error.run_exit_code) == (plain, in_a_run)
    assert reported(fails) == plain
    assert reported(fails, runs=True) == in_a_run


@pytest.mark.parametrize("status", [0, 1, 2, 3, 125, 126, 127, 137])
def test_the_programs_own_status_passes_through_whatever_it_is(status: int) -> None:
    assert reported(lambda: status, runs=True) == status


@pytest.mark.parametrize(
    "fault",
    [OSError(5, "Input/output error"), BrokenPipeError(), KeyboardInterrupt(), RuntimeError("x")],
)
def test_a_fault_of_lnks_own_in_a_run_is_125_never_a_programs_1(fault: BaseException) -> None:
    def fails() -> int:
        raise fault

    assert reported(fails, runs=True) == errors.EXIT_RUN_ERROR
    assert reported(fails) == errors.EXIT_ERROR


@pytest.mark.parametrize(
    ("words", "runs"),
    [
        (["sandbox", "run", "--", "x"], True),
        (["sandbox", "enter", "--spec", "s"], True),
        (["agent", "start", "bot1"], True),
        (["sandbox", "list"], False),
        (["sandbox", "check"], False),
        (["agent", "stop", "bot1"], False),
        (["spec", "approve"], False),
        (["sandbox"], False),
        ([], False),
    ],
)
def test_the_commands_that_run_a_program(words: list[str], runs: bool) -> None:
    assert runs_a_program(words) is runs


@pytest.mark.parametrize(
    ("words", "status"),
    [
        (["sandbox", "run", "--no-such-flag", "--", "true"], 125),  # argparse's usage error
        (["sandbox", "run", "--yes"], 125),  # no program
        (["sandbox", "run", "--memory", "lots", "--", "true"], 125),
        (["agent", "start", "bot1", "--bogus"], 125),
        (["sandbox", "list", "--no-such-flag"], 2),
        (["sandbox", "lease", "x"], 2),  # --seconds missing
        (["nosuchgroup"], 2),
    ],
)
def test_a_usage_error_is_2_but_125_in_a_command_that_runs_a_program(
    words: list[str], status: int, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(words) == status
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("words", "expected"),
    [
        ([], (False, [])),
        (["--yes"], (True, [])),  # `lnk agent start bot1 --yes`: approve, run the default
        (["--", "claude", "--yes"], (False, ["claude", "--yes"])),  # the program's own --yes
        (["--yes", "--", "claude"], (True, ["claude"])),
        (["claude", "--yes"], (False, ["claude", "--yes"])),  # after the program: its own
        (["--yes", "claude"], (True, ["claude"])),
        (["--", "--yes"], (False, ["--yes"])),  # named after `--`: a program called --yes
    ],
)
def test_agent_start_reads_its_options_before_the_program(
    words: list[str], expected: tuple[bool, list[str]]
) -> None:
    assert start_words(words) == expected


@pytest.mark.parametrize("words", [["--force"], ["--yes", "-x", "--", "sh"], ["-y"]])
def test_agent_start_refuses_an_option_it_does_not_take(words: list[str]) -> None:
    with pytest.raises(errors.UsageError, match="unknown option"):
        start_words(words)


def test_help_says_every_status() -> None:
    for status in ("0", "1", "2", "3", "125", "126", "127"):
        assert f"  {status}  " in EPILOG or f"  {status}    " in EPILOG
    for status in ("125", "126", "127", "137"):
        assert status in RUN_EPILOG
