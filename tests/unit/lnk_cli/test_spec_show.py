"""`lnk spec show` as the calling user: what a spec opens, and the `[env]` / `--env` names it
starts the sandbox with, never their values (a value may be a key)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lnk_cli.app import build_parser
from lnk_cli.spec_show import show

SECRET_VALUE = "sk-never-shown-0123456789"


def _show(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    args = build_parser().parse_args(["spec", "show", *argv])
    assert show(args) == 0
    out, err = capsys.readouterr()
    assert SECRET_VALUE not in out + err
    return out


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    path = tmp_path / "spec.toml"
    path.write_text(f'[env]\nPYTHONPATH = "/srv/lib"\nAPI_TOKEN = "{SECRET_VALUE}"\n')
    return path


def test_the_env_names_of_a_spec_are_listed_and_their_values_are_not(
    spec: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _show(["--spec", str(spec)], capsys)
    env_lines = [line.split()[1] for line in out.splitlines() if line.split()[:1] == ["env"]]
    assert env_lines == ["API_TOKEN", "PYTHONPATH"]
    assert "/srv/lib" not in out


def test_the_env_names_of_flags_are_in_the_json_and_their_values_are_not(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MY_TEST_TOKEN", SECRET_VALUE)
    out = _show(["--env", "MY_TEST_TOKEN", "--env", f"OTHER={SECRET_VALUE}", "--json"], capsys)
    assert json.loads(out)["env_names"] == ["MY_TEST_TOKEN", "OTHER"]


def test_a_spec_without_env_lists_no_env_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "empty.toml"
    path.write_text("")
    out = _show(["--spec", str(path)], capsys)
    assert not [line for line in out.splitlines() if line.lstrip().startswith("env ")]
    assert "nothing: no folders" in out
