"""`python -m lnk_proxy` runs as its own system user: never root, never a sandbox's uid."""

from __future__ import annotations

import pytest

from lnk_proxy.__main__ import refuse_identity
from lnk_shared.service_identity import MIN_SANDBOX_UID


@pytest.mark.parametrize("uid", [0, MIN_SANDBOX_UID, 2_000_000_000, 2**31 - 1])
def test_root_and_sandbox_uids_are_refused(uid: int) -> None:
    refusal = refuse_identity(uid)
    assert refusal is not None and "lnk_proxy runs as its own system user" in refusal


@pytest.mark.parametrize("uid", [998, 65534, MIN_SANDBOX_UID - 1])
def test_a_system_user_may_run_it(uid: int) -> None:
    assert refuse_identity(uid) is None
