"""The same fault gives the same exit status whichever service it is in: a box service that does
not answer (the filtering proxy, the store bridge) is the box's state, exit 1, naming it and
`lnk box up`; neither is a rule's refusal (exit 3)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from lnk_controller import bridge_link, proxy_link
from lnk_controller.config import ControllerConfig
from lnk_shared.errors import EXIT_ERROR, LnkError, StateError


def _proxy(run_dir: Path) -> None:
    proxy_link._call(ControllerConfig(run_dir=run_dir, state_dir=run_dir), {"op": "ping"})


def _bridge(run_dir: Path) -> None:
    bridge_link.store_driver(run_dir)


@pytest.mark.parametrize(("service", "call"), [("proxy", _proxy), ("bridge", _bridge)])
def test_a_service_that_does_not_answer_is_exit_1(
    tmp_path: Path, service: str, call: Callable[[Path], None]
) -> None:
    with pytest.raises(LnkError) as caught:
        call(tmp_path)  # no socket there: the service is down
    assert isinstance(caught.value, StateError), service
    assert caught.value.exit_code == EXIT_ERROR
    assert "does not answer" in str(caught.value) and "lnk box up" in str(caught.value)
