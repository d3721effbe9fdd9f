"""Which uids a box service other than the controller may run as: its own system user only.

Never root (a bug in the service would then be root's) and never a uid from the range
sandboxes are given (a sandbox could then signal or trace it, or own its files).
"""

from __future__ import annotations

__all__ = ["MIN_SANDBOX_UID", "identity_refusal"]

# The controller gives sandboxes uids at or above this, never below (its config refuses a
# range that starts lower): above every system and login uid, and where subuid blocks start.
MIN_SANDBOX_UID = 100_000


def identity_refusal(service: str, uid: int) -> str | None:
    """Why `service` must not run as `uid`, or None when it may."""
    if uid == 0:
        return f"{service} runs as its own system user, not root"
    if uid >= MIN_SANDBOX_UID:
        return f"{service} runs as its own system user, not uid {uid} (the sandboxes' range)"
    return None
