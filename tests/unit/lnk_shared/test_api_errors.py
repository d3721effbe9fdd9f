"""An API's error answers both ways: every error of lnk_shared.errors crosses the socket as its
own class with its own exit statuses; a service's own subclass as its base there; a body that
names no class we know (or names something that is no error class) falls back, never raises."""

from __future__ import annotations

import json

import pytest

from lnk_shared import errors
from lnk_shared.api_errors import error_answer, known_error, refused_answer
from lnk_shared.errors import (
    CommandRefused,
    LnkError,
    ProgramNotFoundError,
    RefusedError,
    SpecError,
    StateError,
    UsageError,
)


def _made(kind: type[LnkError]) -> LnkError:
    """One instance of `kind`, built as its own raiser would."""
    if issubclass(kind, RefusedError):
        return kind("/srv/x", "because")
    if issubclass(kind, SpecError):
        return kind("no such key", source="a.toml", line=3, key="k")
    return kind("what went wrong")


CLASSES = sorted(
    (
        k
        for k in (getattr(errors, n) for n in errors.__all__)
        if isinstance(k, type) and issubclass(k, LnkError) and k is not errors.RemoteError
    ),
    key=lambda k: k.__name__,
)


@pytest.mark.parametrize("kind", CLASSES, ids=lambda k: k.__name__)
def test_every_error_crosses_the_api_as_its_own_class_and_statuses(kind: type[LnkError]) -> None:
    sent = _made(kind)
    status, body = error_answer(sent)
    heard = refused_answer(status, json.loads(json.dumps(body)))  # as the wire carries it
    assert type(heard) is kind
    assert (heard.exit_code, heard.run_exit_code) == (sent.exit_code, sent.run_exit_code)
    assert str(sent) in str(heard) and str(heard).startswith("the controller refused: ")


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (UsageError("bad name"), 422),
        (SpecError("no such key"), 422),
        (CommandRefused("x", "y"), 403),
        (StateError("the freeze did not take"), 409),
        (errors.NotConfirmedError("not approved"), 409),
    ],
)
def test_the_http_status_follows_the_errors_exit_status(error: LnkError, status: int) -> None:
    assert error_answer(error)[0] == status


class _ServicesOwn(CommandRefused):
    """A subclass only a service knows: the client has never heard of it."""


def test_a_services_own_subclass_arrives_as_its_base_here() -> None:
    status, body = error_answer(_ServicesOwn("/usr/bin/x", "not granted"))
    assert body["error"][:3] == ["_ServicesOwn", "CommandRefused", "RefusedError"]
    heard = refused_answer(status, body)
    assert type(heard) is CommandRefused and heard.exit_code == 3 and heard.run_exit_code == 126


def test_a_program_not_found_keeps_127_in_a_run() -> None:
    status, body = error_answer(ProgramNotFoundError("no such program: x"))
    assert refused_answer(status, body).run_exit_code == 127


@pytest.mark.parametrize(
    ("names", "found"),
    [
        (["CommandRefused"], CommandRefused),
        (["Nope", "StateError"], StateError),
        ("StateError", None),  # not a list
        (["Exception"], None),  # not one of ours
        (["__class__"], None),  # an attribute, not a name in __all__
        (["EXIT_USAGE"], None),  # in __all__ but no class
        ([3, None, {"a": 1}], None),
        (["x"] * 16 + ["StateError"], None),  # past MAX_NAMES: not a tree of ours
        (None, None),
        (["RemoteError", "StateError"], StateError),  # the launch socket's: words shown already
    ],
)
def test_only_an_error_class_of_ours_is_known(names: object, found: type | None) -> None:
    assert known_error(names) is found


@pytest.mark.parametrize(
    ("doc", "kind", "codes"),
    [
        ({"detail": "x", "error": ["Exception"], "exit": 3}, RefusedError, (3, 126)),
        ({"detail": "x", "error": "RefusedError", "exit": 2}, UsageError, (2, 125)),
        ({"detail": "x", "error": ["LnkError"]}, LnkError, (1, 125)),
        ({"detail": "x", "exit": True}, StateError, (1, 125)),  # a bool is no status
    ],
)
def test_a_body_naming_no_class_we_know_falls_back_to_its_exit(
    doc: object, kind: type, codes: tuple[int, int]
) -> None:
    heard = refused_answer(409, doc)
    assert type(heard) is kind and (heard.exit_code, heard.run_exit_code) == codes


def test_a_refusal_heard_keeps_its_fields_readable() -> None:
    heard = refused_answer(
        *error_answer(CommandRefused("/tmp/x", "in a folder the sandbox writes"))
    )
    assert isinstance(heard, RefusedError)
    assert "/tmp/x" in heard.why and heard.rule == "command"
    spec = refused_answer(*error_answer(SpecError("bad", source="a.toml", key="k")))
    assert isinstance(spec, SpecError) and "a.toml: k: bad" in spec.problem
