"""Interrupts during a check: the first is passed on to the running sandbox as SIGTERM (a
frame on the launch socket) and ends the check only once asked; a second ends it at once."""

from __future__ import annotations

import signal
import socket

import pytest

from lnk_cli.check.launch import Interrupts
from lnk_shared.unix import recv_frame


def test_an_interrupt_before_the_sandbox_runs_is_kept_and_forwarded_once_it_does() -> None:
    ours, controller = socket.socketpair()
    with ours, controller:
        interrupts = Interrupts()
        interrupts.signal(signal.SIGINT, None)  # nothing runs yet: only noted
        with pytest.raises(KeyboardInterrupt):
            interrupts.check()
        interrupts.sock, interrupts.started = ours, True
        interrupts.forward()
        controller.settimeout(5)
        message, _ = recv_frame(controller)
        assert message == {"type": "signal", "signal": int(signal.SIGTERM)}


def test_an_interrupt_while_it_runs_goes_to_the_sandbox_and_a_second_ends_the_check() -> None:
    ours, controller = socket.socketpair()
    with ours, controller:
        interrupts = Interrupts(sock=ours, started=True)
        interrupts.signal(signal.SIGTERM, None)
        controller.settimeout(5)
        assert recv_frame(controller)[0]["signal"] == int(signal.SIGTERM)
        with pytest.raises(KeyboardInterrupt):
            interrupts.signal(signal.SIGINT, None)


def test_no_interrupt_lets_the_check_go_on() -> None:
    Interrupts().check()
