"""The proxy's event loop: uvloop where installed, the standard one on request or without it;
a bad choice is a ConfigError naming the variable and what to do."""

from __future__ import annotations

import asyncio
import importlib.util

import pytest

from lnk_proxy.event_loop import ENV_VAR, choose_loop, loop_factory
from lnk_shared.errors import ConfigError


@pytest.mark.parametrize(
    ("wanted", "installed", "chosen"),
    [
        (None, True, "uvloop"),
        (None, False, "asyncio"),
        ("", True, "uvloop"),
        ("auto", False, "asyncio"),
        (" AUTO ", True, "uvloop"),
        ("asyncio", True, "asyncio"),
        ("asyncio", False, "asyncio"),
        ("uvloop", True, "uvloop"),
    ],
)
def test_the_choice(wanted: str | None, installed: bool, chosen: str) -> None:
    assert choose_loop(wanted, installed) == chosen


def test_insisting_on_a_missing_uvloop_says_how_to_get_it() -> None:
    with pytest.raises(ConfigError, match=f"{ENV_VAR}=uvloop but uvloop is not installed"):
        choose_loop("uvloop", False)


@pytest.mark.parametrize("wanted", ["tokio", "uv loop", "1"])
def test_an_unknown_choice_names_the_choices(wanted: str) -> None:
    with pytest.raises(ConfigError, match="is not one of auto, uvloop, asyncio"):
        choose_loop(wanted, True)


def test_asyncio_on_request_is_the_standard_loop() -> None:
    assert loop_factory({ENV_VAR: "asyncio"}) is None


@pytest.mark.skipif(importlib.util.find_spec("uvloop") is None, reason="uvloop not installed")
def test_the_factory_makes_a_uvloop_loop_where_installed() -> None:
    factory = loop_factory({})
    assert factory is not None
    with asyncio.Runner(loop_factory=factory) as runner:
        name = runner.run(_loop_module())
    assert name.startswith("uvloop")


async def _loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__
