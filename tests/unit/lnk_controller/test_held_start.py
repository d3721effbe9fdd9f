"""A held start's release: the one byte the confiner waits for is written only once every
placeholder is made and sealed, and the pipe is closed either way (as any user: a real pipe)."""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

import pytest

from lnk_controller import held_start
from lnk_controller.held_start import HeldStart
from lnk_controller.spawn import RELEASE
from lnk_shared.errors import LaunchRefused

ROW = SimpleNamespace(id="sbx-1", owner_uid=1000)
JUDGED = SimpleNamespace(caller=SimpleNamespace(uid=1000))  # judged as this caller


def _starter() -> HeldStart:
    starter = HeldStart()
    starter.store = None  # type: ignore[assignment]  # nothing is written to it here
    return starter


def _release(staged: Any) -> bytes:
    read_end, write_end = os.pipe()
    starter = _starter()
    try:
        starter._release_held(ROW, staged, JUDGED, write_end)  # type: ignore[arg-type]
    finally:
        got = os.read(read_end, 16)  # the write end is closed either way: never blocks
        os.close(read_end)
    return got


def test_with_every_placeholder_made_the_program_is_released() -> None:
    assert _release(SimpleNamespace(held=())) == RELEASE


def test_a_placeholder_that_does_not_seal_leaves_the_program_unreleased(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(*_: object, **__: object) -> None:
        raise LaunchRefused("/home/o/project/.envrc", "it did not seal")

    monkeypatch.setattr(held_start, "make_held", refuse)
    read_end, write_end = os.pipe()
    with pytest.raises(LaunchRefused, match="did not seal"):
        _starter()._release_held(ROW, SimpleNamespace(held=("x",)), JUDGED, write_end)  # type: ignore[arg-type]
    assert os.read(read_end, 16) == b""  # the pipe's end, no release: the confiner refuses
    os.close(read_end)
