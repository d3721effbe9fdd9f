"""A spec's [limits] and the limit flags: read for form (a number, a size), a flag after the
file replaces its key, a bad value names where it came from; limits are not grants (the grants'
hash does not change)."""

from __future__ import annotations

import argparse

import pytest

from lnk_shared.errors import SpecError
from lnk_shared.limit_requests import MIB, limit_value, parse_size
from lnk_shared.spec import SpecBuilder
from lnk_shared.spec_file import parse_spec_text
from lnk_shared.spec_flags import (
    FLAG_NAMES,
    add_spec_arguments,
    flags_document,
    namespace_from_document,
    spec_from_arguments,
)


def _flags(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_spec_arguments(parser)
    return parser.parse_args(list(argv))


def test_the_spec_file_asks_for_limits() -> None:
    builder = parse_spec_text(
        '[limits]\nprocesses = 64\nmemory = "512M"\ncpu = 50\nopen_files = 256\n',
        source="/s.toml",
        base="/",
    )
    assert builder.build().limits == (
        ("cpu", 50),
        ("memory", 512 * MIB),
        ("open_files", 256),
        ("processes", 64),
    )


def test_a_flag_after_the_file_replaces_its_key() -> None:
    builder = parse_spec_text('[limits]\nmemory = "1G"\n', source="/s.toml", base="/")
    spec = spec_from_arguments(_flags("--memory", "256M", "--processes", "32"), builder=builder)
    assert dict(spec.limits) == {"memory": 256 * MIB, "processes": 32}


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("[limits]\nprocesses = -1\n", "limits.processes"),
        ('[limits]\nprocesses = "many"\n', "limits.processes"),
        ("[limits]\nprocesses = true\n", "limits.processes"),
        ('[limits]\nmemory = "1.5G"\n', "limits.memory"),
        ("[limits]\nswap = 1\n", "limits.swap"),
    ],
)
def test_bad_limits_name_their_key(text: str, said: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_spec_text(text, source="/s.toml", base="/")
    assert said in str(caught.value)


def test_a_bad_flag_names_the_flag() -> None:
    with pytest.raises(SpecError, match="--memory"):
        spec_from_arguments(_flags("--memory", "lots"), builder=SpecBuilder())


def test_limit_flags_travel_in_the_flags_document() -> None:
    doc = flags_document(_flags("--cpu", "25"))
    assert doc["cpu"] == ["25"] and set(doc) == set(FLAG_NAMES)
    assert namespace_from_document(doc).cpu == ["25"]
    assert namespace_from_document({}).memory == []  # an older client sends none
    with pytest.raises(ValueError, match="memory"):
        namespace_from_document({"memory": "1G"})


@pytest.mark.parametrize(
    ("key", "value", "number"),
    [("memory", "2G", 2048 * MIB), ("memory", 64, 64 * MIB), ("processes", "12", 12)],
)
def test_limit_values(key: str, value: object, number: int) -> None:
    assert limit_value(key, value) == number


def test_sizes() -> None:
    assert parse_size("512MiB") == parse_size("512m") == 512 * MIB
    with pytest.raises(ValueError, match="512M"):
        parse_size("12T")
