"""An admin command's list of rule tables (`[[models]]`, `[[services]]` as the controller
sends them), each read by the spec model's own rules (`parse_model_table`,
`parse_service_table`): a spec file's rules and the proxy's are one reading.

Trusts nothing of the list: its type and length are checked before any table is read; a
table the spec model refuses is refused by its place (`models[1]: …`), the spec model's
message kept whole; two rules on one key (a model port, a service host) are refused.
Does NOT judge the rules against each other beyond that key (the controller's spec did).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TypeVar

from lnk_shared.errors import SpecError
from lnk_shared.spec import MAX_ENTRIES, Origin

__all__ = ["parse_rules"]

RuleT = TypeVar("RuleT")


def parse_rules(
    untrusted: object,
    key: str,
    parse_table: Callable[[object, Origin], RuleT],
    one_per: Callable[[RuleT], Hashable],
    two_on_one: str,
) -> tuple[RuleT, ...]:
    """The rules of the list sent as `key`, in order; ValueError naming `key` when it is no
    list or longer than MAX_ENTRIES, naming the table's place when one is refused, and
    `"{key}: {two_on_one}"` when two rules share `one_per`."""
    if not isinstance(untrusted, list) or len(untrusted) > MAX_ENTRIES:
        raise ValueError(f"{key} must be a list of at most {MAX_ENTRIES} rules")
    rules = []
    for index, table in enumerate(untrusted):
        try:
            rules.append(parse_table(table, Origin("admin", f"{key}[{index}]")))
        except SpecError as exc:
            raise ValueError(str(exc)) from None
    if len({one_per(r) for r in rules}) != len(rules):
        raise ValueError(f"{key}: {two_on_one}")
    return tuple(rules)
