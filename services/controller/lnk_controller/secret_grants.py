"""A sandbox's service secrets, from the owner's store to the proxy: at launch with its grant,
and again whenever the owner sets or removes one while the sandbox runs.

Only a sandbox whose approved spec has a `[[services]]` rule naming a secret gets that secret's
value, and only its owner's (the store is filtered by owner uid). A secret missing at launch
refuses the launch, naming the secret and `lnk secret set NAME`; one removed (or changed) while
the sandbox runs is sent again (`secret_changed`): the proxy drops a removed value, so the next
request of that rule is refused (fail closed). The value goes to the proxy in the admin frame
and nowhere else: never in the sandbox's environment (it gets the placeholder,
`placeholder_env`), a record, a log line or an error.

Security limitations: this does NOT reach a sandbox whose listener this controller does not
hold (a controller restarted since its launch): such a sandbox keeps the values it was started
with until it ends. A secret removed during the instant between a launch reading it and the
listener being held is not sent again (the sandbox keeps the value it read).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any

from lnk_controller import proxy_link
from lnk_controller.config import ControllerConfig
from lnk_controller.sandbox_store import SandboxStore
from lnk_controller.secret_store import SecretStore
from lnk_shared.errors import LaunchRefused, StateError
from lnk_shared.spec_models import HOSTED_KEY_VARIABLES, ModelRule, hosted_placeholder
from lnk_shared.spec_services import ServiceRule, service_placeholder

__all__ = ["check_present", "hosted_key_env", "placeholder_env", "secret_changed", "service_fields"]

log = logging.getLogger(__name__)

TELEGRAM_TOKEN_ENV = "TELEGRAM_BOT_TOKEN"  # noqa: S105 - a variable's name; its value a placeholder


def placeholder_env(rules: Sequence[ServiceRule]) -> dict[str, str]:
    """`LNK_SECRET_<NAME>` = each rule's placeholder; `TELEGRAM_BOT_TOKEN` for one bot."""
    env = {f"LNK_SECRET_{_env_name(r.secret)}": service_placeholder(r) for r in rules}
    bots = [r for r in rules if r.kind == "telegram"]
    if len(bots) == 1:
        env[TELEGRAM_TOKEN_ENV] = service_placeholder(bots[0])
    return env


def hosted_key_env(models: Sequence[ModelRule]) -> dict[str, str]:
    """`ANTHROPIC_API_KEY` / `OPENAI_API_KEY` = a hosted rule's placeholder (its SDK needs a
    key to send anything; the proxy puts the owner's in its place)."""
    return {
        HOSTED_KEY_VARIABLES[m.kind]: hosted_placeholder(m)
        for m in models
        if m.kind in HOSTED_KEY_VARIABLES
    }


def check_present(
    secrets: SecretStore | None,
    owner_uid: int,
    rules: Sequence[ServiceRule],
    models: Sequence[ModelRule] = (),
) -> None:
    """LaunchRefused naming the first secret a rule names that the owner does not keep."""
    named = [("[[services]]", r.kind, r.secret) for r in rules]
    named += [("[[models]]", m.kind, m.secret) for m in models if m.secret is not None]
    if not named:
        return
    kept = {s.name for s in secrets.list_for(owner_uid)} if secrets is not None else set()
    for section, kind, name in named:
        if name not in kept:
            raise LaunchRefused(
                f"{section} secret {name!r}",
                f"you keep no secret named {name!r} for this {kind} rule: set it "
                f"with `lnk secret set {name}` (the value on standard input), then run "
                "it again",
            )


def service_fields(
    secrets: SecretStore | None,
    owner_uid: int,
    rules: Sequence[ServiceRule],
    models: Sequence[ModelRule] = (),
) -> dict[str, Any]:
    """The admin frame's `services`, `models` and `service_secrets` (the values of the secrets
    either names) for the sandbox's rules ({} with none); LaunchRefused when a secret is
    missing or does not open (named, never a value)."""
    fields: dict[str, Any] = {}
    if models:
        fields["models"] = [m.canonical() for m in models]
    names = sorted({r.secret for r in rules} | {m.secret for m in models if m.secret})
    if rules:
        fields["services"] = [r.canonical() for r in rules]
    if not names:
        return fields
    check_present(secrets, owner_uid, rules, models)
    assert secrets is not None  # check_present refuses every rule without a store
    try:
        values = {n: secrets.reveal(owner_uid, n).decode("ascii") for n in names}
    except StateError as exc:
        raise LaunchRefused("[[services]]" if rules else "[[models]]", str(exc)) from None
    return {**fields, "service_secrets": values}


def secret_changed(
    cfg: ControllerConfig,
    store: SandboxStore,
    secrets: SecretStore,
    owner_uid: int,
    name: str,
) -> int:
    """Send the current values to every running sandbox of `owner_uid` whose rules name
    `name` (a removed one is left out: refused from the next request); how many."""
    sent = 0
    for sandbox_id in _held_using(name):
        row = store.get(sandbox_id)
        if row is None or row.owner_uid != owner_uid:
            continue
        names = proxy_link.held_secret_names(sandbox_id)
        values = {}
        for each in sorted(names):
            try:
                values[each] = secrets.reveal(owner_uid, each).decode("ascii")
            except StateError:
                continue  # removed or unopenable: left out, so its rule refuses
        proxy_link.send_secrets(cfg, sandbox_id, values)
        sent += 1
    if sent:
        log.info("secret %r of uid %d: sent again to %d sandbox(es)", name, owner_uid, sent)
    return sent


def _held_using(name: str) -> list[str]:
    return [
        sandbox_id
        for sandbox_id in proxy_link.HELD.snapshot()
        if name in proxy_link.held_secret_names(sandbox_id)
    ]


def _env_name(secret: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", secret).upper()
