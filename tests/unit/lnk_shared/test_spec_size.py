"""A spec over MAX_SPEC_BYTES is refused before it is parsed: by the client's check on the file
it passes, and by the reader the controller uses on the descriptor it was passed."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from lnk_shared import spec_size
from lnk_shared.errors import SpecError
from lnk_shared.spec import SpecBuilder
from lnk_shared.spec_file import read_spec_text
from lnk_shared.spec_size import MAX_SPEC_BYTES, refuse_oversized_spec

VALID = b'[folders]\nread = ["/srv"]\n'


@contextmanager
def opened(path: Path) -> Iterator[int]:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        yield fd
    finally:
        os.close(fd)


@pytest.mark.parametrize(
    ("size", "refused"),
    [
        (0, False),
        (len(VALID), False),
        (MAX_SPEC_BYTES, False),
        (MAX_SPEC_BYTES + 1, True),
        (10 * 1024 * 1024, True),
    ],
)
def test_the_limit_is_exact_on_both_sides(tmp_path: Path, size: int, refused: bool) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_bytes((VALID + b"#" * size)[:size])
    with opened(spec) as fd:
        if refused:
            with pytest.raises(SpecError, match=f"larger than {MAX_SPEC_BYTES} bytes"):
                refuse_oversized_spec(fd, str(spec))
            with pytest.raises(SpecError, match=f"larger than {MAX_SPEC_BYTES} bytes"):
                read_spec_text(fd, str(spec))
        else:
            refuse_oversized_spec(fd, str(spec))
            assert len(read_spec_text(fd, str(spec)).encode()) == size


def test_a_valid_spec_padded_past_the_limit_is_not_parsed_cut_short(tmp_path: Path) -> None:
    """A reader that parsed only its first limit+1 bytes would see the grants in front and run:
    the whole file must be refused instead."""
    spec = tmp_path / "spec.toml"
    spec.write_bytes(VALID + b"#" * (10 * MAX_SPEC_BYTES))
    with opened(spec) as fd, pytest.raises(SpecError, match="larger than") as caught:
        read_spec_text(fd, str(spec))
    assert str(spec) in str(caught.value)


def test_the_controller_refuses_an_oversized_spec_descriptor(tmp_path: Path) -> None:
    """What the controller does with the descriptor a client passed (bypassing any client)."""
    from lnk_controller.launch_judge import _read_spec_fd

    spec = tmp_path / "spec.toml"
    spec.write_bytes(VALID + b"#" * MAX_SPEC_BYTES)
    builder = SpecBuilder()
    with opened(spec) as fd, pytest.raises(SpecError, match="larger than"):
        _read_spec_fd(fd, builder)
    assert builder.build().read == ()  # nothing of it was parsed into the spec


def test_a_fifo_is_not_read_by_the_controllers_reader(tmp_path: Path) -> None:
    fifo = tmp_path / "spec.toml"
    os.mkfifo(fifo)
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        refuse_oversized_spec(fd, str(fifo))  # the client leaves it to the controller
        with pytest.raises(SpecError, match="not a regular file"):
            read_spec_text(fd, str(fifo))
    finally:
        os.close(fd)


def test_not_utf8_is_refused_naming_the_byte(tmp_path: Path) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_bytes(b"# ok\n\xff")
    with opened(spec) as fd, pytest.raises(SpecError, match="byte 5"):
        read_spec_text(fd, str(spec))


def test_all_is_exported() -> None:
    assert sorted(spec_size.__all__) == sorted(set(spec_size.__all__))
    for name in spec_size.__all__:
        assert hasattr(spec_size, name)
