"""`python -m lnk_proxy` runs as its own system user: never root, never a sandbox's uid."""

from __future__ import annotations

import pytest

from lnk_proxy.__main__ import main
from lnk_shared.service_identity import MIN_SANDBOX_UID, identity_refusal


@pytest.mark.parametrize("uid", [0, MIN_SANDBOX_UID, 2_000_000_000, 2**31 - 1])
def test_root_and_sandbox_uids_are_refused(uid: int) -> None:
    refusal = identity_refusal("lnk_proxy", uid)
    assert refusal is not None and "lnk_proxy runs as its own system user" in refusal


@pytest.mark.parametrize("uid", [998, 65534, MIN_SANDBOX_UID - 1])
def test_a_system_user_may_run_it(uid: int) -> None:
    assert identity_refusal("lnk_proxy", uid) is None


@pytest.mark.needs_root
def test_the_proxy_run_as_root_refuses_before_it_loads_anything(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LNK_CONFIG_DIR", "/nonexistent-lnk-config")  # never read: refused first
    assert main() == 2
    assert "lnk-proxy: lnk_proxy runs as its own system user, not root" in capsys.readouterr().err
