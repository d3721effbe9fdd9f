"""The server's limits (`limits`) are the ones `server` exports, by name, as before they moved."""

from __future__ import annotations

from lnk_proxy import limits, server


def test_the_server_exports_the_limits_themselves() -> None:
    for name in ("FLAG_POLL_S", "HEAD_TIMEOUT_S", "IO_TIMEOUT_S", "LISTENER_MODE"):
        assert name in server.__all__
        assert getattr(server, name) == getattr(limits, name)
