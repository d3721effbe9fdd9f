"""Removing every record of an account that is gone (its uid now another person's: see
`lnk_controller.accounts`): its live sandboxes stopped and cleaned, its agents forgotten at the
store bridge (conversations, inbox, lease) and in the registry (with their keys), the records of
its ended sandboxes (the commands they ran) and their wire logs, its remembered specs, its
secrets, its placeholders' pool.

Each step raises StateError when it cannot be done (a sandbox with something left, a store
bridge that does not answer): the caller then keeps the old account's proof, so the next call
tries again, and the new account is never served next to a half-removed old one. Every step is
idempotent, so trying again is safe.

Security limitations: this does NOT touch the old account's own files (its home, its
`~/Link/Agents` folders): they are the administrator's to keep or remove with the account.
"""

from __future__ import annotations

import logging

from lnk_controller import bridge_link, placeholder_pool
from lnk_controller.agents import AgentRegistry
from lnk_controller.cleanup import clean_sandbox
from lnk_controller.config import ControllerConfig
from lnk_controller.remembered import RememberedSpecs
from lnk_controller.sandbox_store import SandboxStore
from lnk_controller.secret_store import SecretStore

__all__ = ["forget_account"]

log = logging.getLogger(__name__)


def forget_account(
    uid: int,
    *,
    cfg: ControllerConfig,
    store: SandboxStore,
    remembered: RememberedSpecs,
    agents: AgentRegistry,
    secrets: SecretStore | None = None,
) -> None:
    for row in store.find(owner_uid=uid, live_only=True):
        store.set(row.id, stop_requested=True)
        clean_sandbox(row.id, store, cfg)
    placeholder_pool.forget(uid)  # its placeholders' pool: never the new account's to be lent
    for agent in agents.find(uid):
        bridge_link.forget_agent(cfg.run_dir, agent.agent_id)
    forgotten_agents = agents.forget_all(uid)
    ended = store.forget_ended(uid)
    for sandbox_id in ended:
        (cfg.state_dir / "wire" / f"{sandbox_id}.log").unlink(missing_ok=True)
    specs = remembered.forget_all(uid)
    kept = secrets.forget_all(uid) if secrets is not None else 0
    log.warning(
        "uid %d: removed %d sandbox record(s), %d agent(s), %d remembered spec(s), %d secret(s) "
        "of its old account",
        uid,
        len(ended),
        len(forgotten_agents),
        specs,
        kept,
    )
