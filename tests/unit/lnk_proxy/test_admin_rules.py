"""lnk_proxy.admin_rules.parse_rules: an admin command's list of rule tables, trusted in
nothing, each table read by the rule reader it is given and refused by its place."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from lnk_proxy.admin_rules import parse_rules
from lnk_shared.spec import MAX_ENTRIES, Origin


@dataclass(frozen=True)
class Rule:
    port: int
    name: str


def _table(untrusted: object, origin: Origin) -> Rule:
    """A stand-in for the spec model's readers: a table of an int port and a str name."""
    if not isinstance(untrusted, dict):
        raise origin.error("expected a table")
    port, name = untrusted.get("port"), untrusted.get("name", "")
    if not isinstance(port, int) or not isinstance(name, str):
        raise origin.error("port must be a number")
    return Rule(port, name)


def _parse(untrusted: object) -> tuple[Rule, ...]:
    return parse_rules(untrusted, "models", _table, lambda r: r.port, "two rules on one port")


def test_the_rules_come_back_in_order() -> None:
    tables = [{"port": 2, "name": "b"}, {"port": 1, "name": "a"}]
    assert _parse(tables) == (Rule(2, "b"), Rule(1, "a"))
    assert _parse([]) == ()


@pytest.mark.parametrize(
    ("untrusted", "said"),
    [
        pytest.param({"port": 1}, "models must be a list of at most", id="a-table-not-a-list"),
        pytest.param("models", "models must be a list", id="a-string"),
        pytest.param(None, "models must be a list", id="nothing"),
        pytest.param(
            [{"port": i} for i in range(MAX_ENTRIES + 1)],
            f"at most {MAX_ENTRIES} rules",
            id="past-the-most-entries",
        ),
        pytest.param([{"port": 1}, "x"], r"models\[1\].*expected a table", id="second-not-a-table"),
        pytest.param([{"port": "1"}], r"models\[0\].*port must be a number", id="bad-value"),
        pytest.param(
            [{"port": 1}, {"port": 1, "name": "other"}],
            "models: two rules on one port",
            id="two-on-one-key",
        ),
    ],
)
def test_a_bad_list_is_refused_naming_what_and_where(untrusted: object, said: str) -> None:
    with pytest.raises(ValueError, match=said) as refused:
        _parse(untrusted)
    assert refused.value.__cause__ is None  # the spec model's message, not a chained traceback


def test_the_length_is_checked_before_any_table_is_read() -> None:
    read: list[object] = []

    def counting(untrusted: object, origin: Origin) -> Rule:
        read.append(untrusted)
        return _table(untrusted, origin)

    with pytest.raises(ValueError):
        parse_rules([{"port": 1}] * (MAX_ENTRIES + 1), "services", counting, id, "two")
    assert read == []
