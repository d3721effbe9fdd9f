"""caller_env.py: the check's bait variable, its probe, and how the outside judges what came
back."""

from __future__ import annotations

import os

import pytest

from lnk_cli.check.caller_env import (
    BAIT_NAME_PREFIX,
    CallerEnvBait,
    caller_env_probes,
    in_environment,
)
from lnk_cli.check.verdicts import Outside, judge_probe
from lnk_shared.env_names import refusal_reason


def test_the_bait_is_a_name_no_env_flag_can_give() -> None:
    bait = CallerEnvBait.make()
    assert bait.name.startswith(BAIT_NAME_PREFIX)
    assert refusal_reason(bait.name) is not None  # so only a leak can put it inside
    assert bait.request_env() == {bait.name: bait.value}
    assert CallerEnvBait.make() != bait


def test_the_bait_is_in_the_checks_environment_only_while_it_runs() -> None:
    bait = CallerEnvBait.make()
    with in_environment(bait):
        assert os.environ[bait.name] == bait.value
    assert bait.name not in os.environ


@pytest.mark.parametrize(
    ("data", "verdict"),
    [
        ("PATH=/usr/bin\nHOME=/home/lnk-sbx-1", "refused"),
        ("{name}={value}", "leaked"),
        ("SOMETHING_ELSE={value}", "leaked"),  # its value under any name
    ],
)
def test_the_secret_found_inside_is_leaked(data: str, verdict: str) -> None:
    bait = CallerEnvBait.make()
    (probe,) = caller_env_probes(bait)
    assert probe.step is not None and probe.step["id"] == probe.id == "caller-env"
    said = data.format(name=bait.name, value=bait.value)
    result = {"outcome": "through", "detail": "read its own environment", "data": said}
    assert judge_probe(probe, result, Outside()).verdict == verdict
