"""Test-wide rules: a skip is a failure under CI=true, so nothing passes by not running."""

from __future__ import annotations

import os

import pytest

IN_CI = os.environ.get("CI", "").lower() == "true"


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("needs_root") and os.geteuid() != 0:
        if IN_CI:
            pytest.fail("needs root, and CI=true forbids skipping it")
        pytest.skip("needs root")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    if IN_CI and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, which forbids skips: {report.longrepr}"
