"""The caller's terminal modes are put back after a launch, however it ended."""

from __future__ import annotations

import os
import termios
from collections.abc import Iterator

import pytest

from lnk_cli.terminal_modes import kept_modes, restore_modes, save_modes


@pytest.fixture
def pty() -> Iterator[int]:
    master, secondary = os.openpty()
    try:
        yield secondary
    finally:
        os.close(secondary)
        os.close(master)


def _echo_off(fd: int) -> None:
    modes = termios.tcgetattr(fd)
    modes[3] &= ~termios.ECHO
    termios.tcsetattr(fd, termios.TCSANOW, modes)


def test_only_terminals_are_saved(pty: int) -> None:
    read_end, write_end = os.pipe()
    try:
        assert [fd for fd, _ in save_modes((pty, read_end, write_end))] == [pty]
    finally:
        os.close(read_end)
        os.close(write_end)


def test_saved_modes_are_put_back(pty: int) -> None:
    before = termios.tcgetattr(pty)
    kept = save_modes((pty,))
    _echo_off(pty)
    restore_modes(kept)
    assert termios.tcgetattr(pty) == before


def test_a_terminal_gone_meanwhile_is_left_alone(pty: int) -> None:
    kept = save_modes((pty,))
    spare = os.dup(pty)
    os.close(spare)
    restore_modes([(spare, kept[0][1])])  # no error: there is nothing to restore on


def test_kept_modes_puts_them_back_after_an_error(
    pty: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = termios.tcgetattr(pty)
    with pytest.raises(OSError), kept_modes((pty,)):
        _echo_off(pty)
        raise OSError("the controller went away")
    assert termios.tcgetattr(pty) == before
