"""The launch protocol's one definition: every frame has its fields and a sender, each builder
writes only its frame's fields in their order, and what the controller judges from a client is
refused outside the definition with the frame and the field named."""

from __future__ import annotations

import signal
from typing import Any

import pytest

from lnk_shared import errors
from lnk_shared import launch_protocol as protocol

NUMBERS = {name: int(getattr(signal, name)) for name in protocol.FORWARDED_SIGNALS}
LAUNCH = protocol.launch_frame(
    ["true"], cwd="/", path_env="/bin", flags={}, env={}, check=True, agent="a1"
)
BUILT = {
    protocol.LAUNCH: LAUNCH,
    protocol.APPROVE: protocol.approve_frame("h"),
    protocol.DECLINE: protocol.decline_frame(),
    protocol.OPENED: protocol.opened_frame(["/a", "/b"]),
    protocol.SIGNAL: protocol.signal_frame(2),
    protocol.APPROVE_QUESTION: protocol.approve_question_frame(["opens:"], "h"),
    protocol.OPEN: protocol.open_frame(["/a"]),
    protocol.APPROVED: protocol.approved_frame("h", True),
    protocol.STARTED: protocol.started_frame("s1", "64 processes", note="lnk: note: x"),
    protocol.EXIT: protocol.exit_frame(0, "the memory limit"),
    protocol.ERROR: protocol.error_frame(2, 125, "m"),
}


def test_each_frame_has_one_sender_and_its_fields() -> None:
    client, server = set(protocol.CLIENT_FRAMES), set(protocol.SERVER_FRAMES)
    assert not client & server
    assert client | server == set(protocol.FIELDS)
    for answered, answers in protocol.ORDER.items():
        assert answered in protocol.FIELDS
        assert set(answers) <= set(protocol.FIELDS)
    followers = {kind for answers in protocol.ORDER.values() for kind in answers}
    assert followers == set(protocol.FIELDS) - {protocol.LAUNCH}  # each has its place
    assert protocol.ERROR in protocol.ORDER[protocol.LAUNCH]


@pytest.mark.parametrize("kind", list(BUILT))
def test_each_builder_writes_only_its_frames_fields_in_their_order(kind: str) -> None:
    frame = BUILT[kind]
    assert frame[protocol.TYPE] == kind
    fields = [name for name in frame if name != protocol.TYPE]
    assert next(iter(frame)) == protocol.TYPE
    order = protocol.FIELDS[kind]
    assert set(fields) <= set(order)
    assert fields == sorted(fields, key=order.index)


def test_the_launch_frame_passes_stdio_first_and_takes_the_spec_and_with_fds() -> None:
    frame = protocol.launch_frame(["ls"], cwd="/w", path_env="", flags={}, env={})
    assert frame["fds"] == {"stdin": 0, "stdout": 1, "stderr": 2}
    assert "check" not in frame and "agent" not in frame  # written only when set
    protocol.add_spec(frame, 3)
    protocol.add_with_fd(frame, 7, 4)
    assert frame["fds"]["spec"] == 3 and frame["with_fds"] == {"7": 4}
    assert set(frame["fds"]) <= set(protocol.LAUNCH_FDS_FIELDS)
    assert set(protocol.terminal_size(24, 80)) == set(protocol.TERMINAL_FIELDS)


def test_a_launch_field_outside_the_definition_is_refused_naming_it() -> None:
    body = {**LAUNCH, "uid": 0}
    with pytest.raises(errors.FrameError, match="bad launch frame: uid is not a field") as caught:
        protocol.launch_fields(body)
    assert (caught.value.frame, caught.value.field) == (protocol.LAUNCH, "uid")
    assert isinstance(caught.value, errors.UsageError) and isinstance(caught.value, ValueError)
    assert protocol.launch_fields(dict(LAUNCH)) == LAUNCH


@pytest.mark.parametrize("frame", [{}, {"type": "open"}, {"type": ["launch"]}])
def test_a_frame_of_another_type_is_refused(frame: dict[str, Any]) -> None:
    with pytest.raises(errors.FrameError, match="bad launch frame: type must be 'launch'"):
        protocol.expect(frame, protocol.LAUNCH)


@pytest.mark.parametrize(
    ("frame", "approved"),
    [
        ({"type": "approve", "hash": "h"}, True),
        ({"type": "approve", "hash": "other"}, False),
        ({"type": "approve"}, False),
        ({"type": "decline"}, False),
        ({"type": "signal", "signal": 2}, False),
        ({"type": "approve?", "hash": "h"}, False),  # the question sent back is no answer
        ({}, False),
    ],
)
def test_only_an_approve_of_the_hash_asked_approves(frame: dict[str, Any], approved: bool) -> None:
    assert protocol.approval(frame, "h") is approved


@pytest.mark.parametrize(
    "frame", [{"type": "approve", "hash": "h", "yes": True}, {"type": "decline", "hash": "h"}]
)
def test_an_answer_with_a_field_outside_the_definition_is_refused(frame: dict[str, Any]) -> None:
    with pytest.raises(errors.FrameError, match="is not a field"):
        protocol.approval(frame, "h")


PATHS = ["/srv/a", "/srv/b"]


def test_opened_grants_are_exactly_the_paths_asked_each_a_passed_descriptor() -> None:
    grants = protocol.opened_grants(protocol.opened_frame(PATHS), PATHS, 2)
    assert grants == {"/srv/a": 0, "/srv/b": 1}


@pytest.mark.parametrize(
    ("grants", "fd_count"),
    [
        ({"/srv/a": 0}, 2),  # one missing
        ({"/srv/a": 0, "/srv/b": 1, "/etc": 1}, 2),  # one never asked for
        ({"/srv/a": 0, "/srv/b": 2}, 2),  # past the descriptors passed
        ({"/srv/a": 0, "/srv/b": -1}, 2),
        ({"/srv/a": 0, "/srv/b": True}, 2),  # True == 1, but it is not an index
        ({"/srv/a": 0, "/srv/b": "1"}, 2),
        (["/srv/a", "/srv/b"], 2),
        (None, 2),
    ],
)
def test_opened_grants_outside_the_definition_are_refused(grants: object, fd_count: int) -> None:
    with pytest.raises(errors.FrameError, match="bad opened frame: grants"):
        protocol.opened_grants({"type": "opened", "grants": grants}, PATHS, fd_count)


def test_an_opened_frame_with_another_field_or_another_frame_is_refused() -> None:
    with pytest.raises(errors.FrameError, match="bad opened frame: fds is not a field"):
        protocol.opened_grants({**protocol.opened_frame(PATHS), "fds": [0]}, PATHS, 2)
    with pytest.raises(errors.NotConfirmedError, match="did not open"):
        protocol.opened_grants({"type": "decline"}, PATHS, 2)


@pytest.mark.parametrize("name", protocol.FORWARDED_SIGNALS)
def test_a_forwarded_signal_is_read(name: str) -> None:
    frame = protocol.signal_frame(NUMBERS[name])
    assert protocol.forwarded_signal(frame, NUMBERS) == NUMBERS[name]


@pytest.mark.parametrize(
    "frame",
    [
        {"type": "signal", "signal": int(signal.SIGKILL)},  # never forwarded
        {"type": "signal", "signal": int(signal.SIGSTOP)},
        {"type": "signal", "signal": True},
        {"type": "signal", "signal": "2"},
        {"type": "signal"},
        {"type": "signal", "signal": 2, "pid": 1},
        {"type": "exit", "signal": 2},
    ],
)
def test_any_other_signal_frame_is_ignored(frame: dict[str, Any]) -> None:
    assert protocol.forwarded_signal(frame, NUMBERS) is None


def test_the_clients_read_the_controllers_answers_as_they_always_have() -> None:
    assert protocol.asked_paths({"type": "open", "paths": ["/a"]}) == ["/a"]
    for bad in ("/a", ["/a", 1], None):
        with pytest.raises(errors.StateError, match="not a list of paths"):
            protocol.asked_paths({"type": "open", "paths": bad})
    assert protocol.question({"lines": ["a", 5, None], "hash": "h"}) == (["a", "5", "None"], "h")
    assert protocol.approved_hash({"hash": 7}) == (False, "7")
    assert protocol.started_sandbox({}) == ("", "none")
    assert protocol.exit_status({"status": 3}) == (3, None)
    assert protocol.exit_status({"status": 3, "message": 5}) == (3, "5")
    for bad in ({"status": "3", "message": 5}, {}):  # refused now: the run's failure, said
        with pytest.raises(errors.StateError, match="bad frame") as caught:
            protocol.exit_status(bad)
        assert caught.value.run_exit_code == errors.EXIT_RUN_ERROR
    error = protocol.remote_error({"exit": 3, "run_exit": 126, "message": "refused"})
    assert isinstance(error, errors.RemoteError)
    assert (str(error), error.exit_code, error.run_exit_code) == ("refused", 3, 126)
    fallback = protocol.remote_error({"exit": "3"})
    assert (str(fallback), fallback.exit_code, fallback.run_exit_code) == (
        "None",
        errors.EXIT_ERROR,
        errors.EXIT_RUN_ERROR,
    )


def test_the_limits_are_the_transports_and_the_kernels() -> None:
    from lnk_shared import frames

    assert (protocol.MAX_FRAME, protocol.MAX_FDS, protocol.HEADER_BYTES) == (
        frames.MAX_FRAME,
        frames.MAX_FDS,
        frames.HEADER_BYTES,
    )
    assert protocol.MAX_ARG_BYTES == 32 * 4096  # MAX_ARG_STRLEN: 32 pages


def test_the_started_frame_carries_a_note_only_when_there_is_one() -> None:
    assert "note" not in protocol.started_frame("s1", "none")
    assert protocol.started_frame("s1", "none", note="lnk: note: x")["note"] == "lnk: note: x"


@pytest.mark.parametrize("status", [0, 1, 125, 137, 255])
def test_an_exit_status_is_read_as_it_is(status: int) -> None:
    assert protocol.exit_status(protocol.exit_frame(status)) == (status, None)
    assert protocol.exit_status(protocol.exit_frame(status, "m")) == (status, "m")


@pytest.mark.parametrize("status", [256, 512, -1, 2**40, None, "0", 1.0, True, [0]])
def test_an_exit_status_that_is_not_one_is_a_bad_frame(status: object) -> None:
    with pytest.raises(errors.StateError, match=r"the controller sent a bad frame \(an exit"):
        protocol.exit_status({"type": "exit", "status": status})
    with pytest.raises(errors.StateError):
        protocol.exit_status({"type": "exit"})
