"""The store bridge as a service: open the store, serve the admin socket until SIGTERM or
SIGINT, then close every agent's socket."""

from __future__ import annotations

import logging
import signal
from types import FrameType

from sqlalchemy import make_url

from lnk_bridge_store.admin import serve_admin
from lnk_bridge_store.config import StoreConfig
from lnk_bridge_store.db import open_store
from lnk_bridge_store.server import BridgeServer
from lnk_bridge_store.store import Store
from lnk_shared.waking_event import WakingEvent

__all__ = ["run_bridge"]

log = logging.getLogger(__name__)


def run_bridge(config: StoreConfig) -> None:
    engine = open_store(config.database_url)
    where = make_url(config.database_url).render_as_string(hide_password=True)
    server = BridgeServer(config, Store(engine, where))
    server.reopen_all()
    stop = WakingEvent()  # the admin loop sleeps on it and its socket, with no timeout

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %d: stopping", signum)
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_signal)
    log.info("lnk_bridge_store ready: admin socket %s, store %s", config.admin_socket, where)
    try:
        serve_admin(server, stop)
    finally:
        server.close_all()
        engine.dispose()
        log.info("lnk_bridge_store stopped")
