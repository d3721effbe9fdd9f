"""`[env]` in a spec and `--env` on the command line: names judged, values kept out of every
error, repr and the grants' hash; a spec never reads its caller's environment."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from lnk_shared.errors import EnvRefused, SpecError
from lnk_shared.spec import Spec
from lnk_shared.spec_file import load_spec_file, parse_spec_text
from lnk_shared.spec_flags import add_spec_arguments, flags_document, spec_from_arguments

KEY = "sk-test-4b1d-value-never-shown"


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_spec_arguments(parser)
    return parser.parse_args(list(argv))


def _spec_text(text: str) -> Spec:
    return parse_spec_text(text, source="/s/spec.toml", base="/s").build()


def test_a_specs_env_gives_its_plain_values() -> None:
    spec = _spec_text(f'[env]\nAPI_KEY = "{KEY}"\nPYTHONPATH = "/srv/lib"\n')
    assert spec.env == (("API_KEY", KEY), ("PYTHONPATH", "/srv/lib"))


def test_a_flag_after_the_file_replaces_its_value(tmp_path: Path) -> None:
    path = tmp_path / "spec.toml"
    path.write_text('[env]\nMODE = "file"\nKEPT = "yes"\n')
    args = _args("--spec", str(path), "--env", "MODE=flag")
    spec = spec_from_arguments(args, cwd=str(tmp_path))
    assert dict(spec.env) == {"MODE": "flag", "KEPT": "yes"}
    assert load_spec_file(path).build().env == (("KEPT", "yes"), ("MODE", "file"))


@pytest.mark.parametrize(
    ("text", "entry"),
    [
        ('[env]\nLD_PRELOAD = "/tmp/x.so"\n', "[env] LD_PRELOAD"),
        ('[env]\nBASH_ENV = "/tmp/rc"\n', "[env] BASH_ENV"),
        ('[env]\n"BASH_FUNC_ls%%" = "() { id; }"\n', "[env] BASH_FUNC_ls%%"),
        ('[env]\nhttps_proxy = "http://evil:1"\n', "[env] https_proxy"),
        ('[env]\nHOME = "/root"\n', "[env] HOME"),
    ],
)
def test_a_refused_name_in_a_spec_is_refused_naming_it_not_its_value(text: str, entry: str) -> None:
    with pytest.raises(EnvRefused) as caught:
        _spec_text(text)
    assert caught.value.entry == entry
    assert caught.value.exit_code == 3
    assert "/tmp/" not in str(caught.value) and "evil" not in str(caught.value)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("[env]\nNUMBER = 3\n", "as a string"),
        ('[env]\nLIST = ["a"]\n', "a string value"),
        ('[env]\n"1BAD" = "v"\n', "not starting with a digit"),
        ('[env]\n"A-B" = "v"\n', "letters, digits and _"),
        ('env = "x"\n', "a table"),
    ],
)
def test_a_specs_env_of_another_form_is_a_spec_error(text: str, problem: str) -> None:
    with pytest.raises(SpecError, match=problem):
        _spec_text(text)


def test_a_values_error_never_quotes_it() -> None:
    with pytest.raises(SpecError) as caught:
        _spec_text(f'[env]\nAPI_KEY = "{KEY}\\u0000"\n')
    assert "NUL" in str(caught.value) and KEY not in str(caught.value)
    assert "API_KEY" in str(caught.value)


def test_a_refused_flag_is_refused_as_a_flag() -> None:
    with pytest.raises(EnvRefused) as caught:
        spec_from_arguments(_args("--env", "LD_LIBRARY_PATH=/srv/evil"), cwd="/")
    assert caught.value.entry == "--env LD_LIBRARY_PATH"
    assert "/srv/evil" not in str(caught.value)


def test_a_bare_name_never_reads_the_environment_of_who_builds_the_spec(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The controller builds specs as root: a NAME without a value must not take root's."""
    monkeypatch.setenv("ROOTS_OWN", "not-for-the-sandbox")
    with pytest.raises(SpecError, match="came without a value"):
        spec_from_arguments(_args("--env", "ROOTS_OWN"), cwd="/")


def test_the_client_sends_the_callers_value_and_nothing_else() -> None:
    args = _args("--env", "ANTHROPIC_API_KEY", "--env", "MODE=x")
    environ = {"ANTHROPIC_API_KEY": KEY, "UNNAMED": "unnamed-stays-home"}
    doc = flags_document(args, environ)
    assert doc["env"] == [f"ANTHROPIC_API_KEY={KEY}", "MODE=x"]
    assert "unnamed-stays-home" not in repr(doc)


def test_values_are_not_in_the_specs_repr() -> None:
    with_env = _spec_text(f'[env]\nAPI_KEY = "{KEY}"\n')
    assert KEY not in repr(with_env)
    assert "API_KEY" not in repr(with_env)


def test_a_bare_name_takes_the_value_of_the_environment_the_client_gives() -> None:
    spec = spec_from_arguments(_args("--env", "MINE"), cwd="/", environ={"MINE": KEY})
    assert spec.env == (("MINE", KEY),)


def test_the_unsafe_switch_lets_a_refused_name_through_and_only_then() -> None:
    from lnk_shared.spec import Origin, SpecBuilder

    origin = Origin("command line", "--env")
    with pytest.raises(EnvRefused):
        SpecBuilder().add_env("LD_PRELOAD", "/x.so", origin)
    builder = SpecBuilder(unsafe_env_unjudged=True)
    builder.add_env("LD_PRELOAD", "/x.so", origin)
    assert builder.build().env == (("LD_PRELOAD", "/x.so"),)
    with pytest.raises(SpecError):  # its form is still checked
        builder.add_env("A-B", "v", origin)
