"""Which event loop the proxy runs on: uvloop's (libuv, written in C) where it is installed,
else the standard library's, and a log line saying which.

Why: a small plain-http request through the proxy is a handful of readiness waits and
callbacks; with asyncio's own loop (`selectors` and `_run_once` in Python) those were a large
share of the proxy's CPU per request (bench/proxy.py has the figures). The proxy uses only the
loop's low-level calls (`add_reader`, `add_writer`, `call_later`, `sock_connect`,
`sock_accept`, `run_in_executor`, `call_soon_threadsafe`, signal handlers), which uvloop
implements with the same meaning, so nothing the proxy decides depends on the choice.

`LNK_PROXY_EVENT_LOOP=asyncio` picks the standard loop even where uvloop is installed (to
compare the two, or to rule uvloop out when chasing a bug); `uvloop` insists on it (a missing
uvloop is then an error, not a fallback). Any other value is a ConfigError naming the choices.

Limits: this module does NOT change what the proxy does per request; it only picks the loop.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
from collections.abc import Callable, Mapping
from typing import Literal

from lnk_shared.errors import ConfigError

__all__ = ["ENV_VAR", "LoopChoice", "choose_loop", "loop_factory"]

log = logging.getLogger(__name__)

ENV_VAR = "LNK_PROXY_EVENT_LOOP"
LoopChoice = Literal["uvloop", "asyncio"]
_CHOICES = ("auto", "uvloop", "asyncio")


def choose_loop(wanted: str | None, uvloop_installed: bool) -> LoopChoice:
    """The loop to run, from the environment's wish (None or "" for auto) and whether uvloop
    can be imported. Pure: table-tested."""
    wish = (wanted or "auto").strip().lower()
    if wish not in _CHOICES:
        raise ConfigError(
            f"{ENV_VAR}={wanted!r} is not one of {', '.join(_CHOICES)}: unset it (auto) "
            "or set it to one of those"
        )
    if wish == "asyncio":
        return "asyncio"
    if wish == "uvloop" and not uvloop_installed:
        raise ConfigError(
            f"{ENV_VAR}=uvloop but uvloop is not installed in this Python: reinstall lnk box "
            "(scripts/install installs it) or unset the variable"
        )
    return "uvloop" if uvloop_installed else "asyncio"


def loop_factory(
    environ: Mapping[str, str] = os.environ,
) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """A factory for `asyncio.Runner(loop_factory=...)`: uvloop's, or None for the standard
    loop. ConfigError for a bad `LNK_PROXY_EVENT_LOOP`."""
    try:
        uvloop = importlib.import_module("uvloop")
    except ImportError:
        uvloop = None
    choice = choose_loop(environ.get(ENV_VAR), uvloop is not None)
    if choice == "uvloop" and uvloop is not None:
        log.info("event loop: uvloop %s", getattr(uvloop, "__version__", "?"))
        factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
        return factory
    log.info("event loop: asyncio's own (%s)", "chosen" if uvloop else "uvloop is not installed")
    return None
