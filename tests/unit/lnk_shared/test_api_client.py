"""The API client's pure halves: a caller's word as one path segment, a refusal as one line."""

from __future__ import annotations

import pytest

from lnk_shared.api_client import path_segment, refusal_text, refused_answer
from lnk_shared.errors import StateError, UsageError


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


@pytest.mark.parametrize(
    ("status", "doc", "kind", "said"),
    [
        (422, {"detail": [{"loc": ["body", "name"], "msg": "bad"}]}, UsageError, "name: bad"),
        (422, {"detail": "a lease is at most 604800 seconds"}, UsageError, "at most"),
        (400, {"detail": "bad request"}, UsageError, "bad request"),
        (413, {"detail": "too large"}, UsageError, "too large"),
        (404, {"detail": "you have no agent named 'x'"}, StateError, "no agent named"),
        (409, {"detail": "agent 'x' is running: stop it first"}, StateError, "stop it first"),
        (403, {"detail": "only root prunes"}, StateError, "only root"),
        (500, None, StateError, "refused: 500"),
        (502, {"detail": ""}, StateError, "refused: 502"),
        (409, ["not", "a", "dict"], StateError, "not"),
    ],
)
def test_a_refusal_of_the_callers_words_is_a_usage_error_else_the_boxs_state(
    status: int, doc: object, kind: type, said: str
) -> None:
    error = refused_answer(status, doc)
    assert type(error) is kind
    assert said in str(error)
    assert "\n" not in str(error)


@pytest.mark.parametrize(
    ("exit", "status", "in_a_run"),
    [(1, 1, 125), (2, 2, 125), (3, 3, 126), (7, 1, 125), ("3", 1, 125)],
)
def test_the_services_own_status_for_its_error_is_kept(
    exit: object, status: int, in_a_run: int
) -> None:
    error = refused_answer(409, {"detail": "agent name 'bad name!': use ...", "exit": exit})
    assert (error.exit_code, error.run_exit_code) == (status, in_a_run)
    assert "bad name!" in str(error)
