"""The API client's pure halves: a caller's word as one path segment, a refusal as one line."""

from __future__ import annotations

import pytest

from lnk_shared.api_client import path_segment, refusal_text
from lnk_shared.errors import UsageError


@pytest.mark.parametrize(
    ("word", "segment"),
    [
        ("sbx-1a2b", "sbx-1a2b"),
        ("../../v1/box/prune", "..%2F..%2Fv1%2Fbox%2Fprune"),  # never another route
        ("a?all=true", "a%3Fall%3Dtrue"),  # never a query
        ("a#b", "a%23b"),
        ("bad name", "bad%20name"),
        ("\x1b[2J\u202e", "%1B%5B2J%E2%80%AE"),  # http.client would refuse it raw
        ("%2F", "%252F"),  # already quoted stays the caller's literal
    ],
)
def test_a_word_is_one_quoted_segment(word: str, segment: str) -> None:
    assert path_segment(word, "sandbox") == segment


def test_an_empty_word_is_refused_naming_what_to_give() -> None:
    with pytest.raises(UsageError, match="name the sandbox"):
        path_segment("", "sandbox")


@pytest.mark.parametrize(
    ("detail", "text"),
    [
        (
            [
                {
                    "type": "greater_than_equal",
                    "loc": ["body", "seconds"],
                    "msg": "Input should be greater than or equal to 1",
                    "input": 0,
                    "ctx": {"ge": 1},
                }
            ],
            "seconds: Input should be greater than or equal to 1",
        ),
        (
            [{"loc": ["query", "all"], "msg": "bad"}, {"loc": ["body"], "msg": "missing"}],
            "all: bad; the request: missing",
        ),
        ([{"loc": ["body", "limits", 0, "memory"]}], "limits.0.memory: is not valid"),
        ("no such agent", "no such agent"),
        (None, "None"),
        (["a", "b"], "['a', 'b']"),
    ],
)
def test_a_refusal_is_one_line(detail: object, text: str) -> None:
    assert refusal_text(detail) == text
