"""A hosted model exchange's share of its sandbox's buffer budget: reserved from what its head
announces, resized to the serialisation it holds, refused past the budget, always given back."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from lnk_proxy.hosted_budget import HostedReservation, announced_body, reserve
from lnk_proxy.http_request import parse_request_head
from lnk_proxy.listeners import Refusal
from lnk_proxy.strict_json import MAX_BODY_BYTES
from lnk_proxy.tunnel_buffers import hosted_buffers, hosted_worst_case

MiB = 1024 * 1024
BUFFERS = hosted_buffers(4 * MiB)  # tcp_wmem's usual maximum
FIXED = hosted_worst_case(0, BUFFERS)


@dataclass
class Owner:
    sandbox: str = "sbx-a"
    buffers: int = 0


def head(framing: str) -> bytes:
    host = "Host: api.anthropic.com\r\n"
    return f"POST http://api.anthropic.com/v1/messages HTTP/1.1\r\n{host}{framing}\r\n".encode()


@pytest.mark.parametrize(
    ("framing", "announced"),
    [
        ("Content-Length: 1000\r\n", 1000),
        ("Content-Length: 0\r\n", 0),
        (f"Content-Length: {MAX_BODY_BYTES + 1}\r\n", MAX_BODY_BYTES),  # refused unread
        ("Transfer-Encoding: chunked\r\n", MAX_BODY_BYTES),  # its size known only once read
        ("", 0),  # no body
    ],
)
def test_the_body_reserved_is_the_most_the_framing_lets_in(framing: str, announced: int) -> None:
    assert announced_body(parse_request_head(head(framing))) == announced


def test_exchanges_are_reserved_until_the_budget_then_refused_with_the_budgets_rule() -> None:
    owner = Owner()
    request = parse_request_head(head(f"Content-Length: {6 * MiB}\r\n"))
    budget = 3 * hosted_worst_case(6 * MiB, BUFFERS)
    held = [reserve(owner, request, budget, BUFFERS) for _ in range(3)]
    assert all(isinstance(h, HostedReservation) for h in held)
    assert owner.buffers == budget
    refused = reserve(owner, request, budget, BUFFERS)
    assert isinstance(refused, Refusal) and refused.rule == "too-much-buffer"
    assert str(budget) in refused.reason and str(6 * MiB) in refused.reason
    assert owner.buffers == budget  # a refusal reserves nothing
    small = reserve(owner, parse_request_head(head("")), budget, BUFFERS)
    assert isinstance(small, Refusal)  # even a GET's fixed part does not fit
    for h in held:
        assert isinstance(h, HostedReservation)
        h.release()
    assert owner.buffers == 0


def test_the_budget_is_shared_with_what_the_sandbox_already_holds() -> None:
    owner = Owner(buffers=10 * MiB)  # its tunnels' and plain exchanges' reservations
    request = parse_request_head(head("Content-Length: 100\r\n"))
    assert isinstance(reserve(owner, request, 10 * MiB + FIXED + 99, BUFFERS), Refusal)
    held = reserve(owner, request, 10 * MiB + FIXED + 100, BUFFERS)
    assert isinstance(held, HostedReservation)
    held.release()
    assert owner.buffers == 10 * MiB


def test_settle_follows_the_serialisation_and_refuses_a_growth_past_the_budget() -> None:
    owner = Owner()
    chunked = parse_request_head(head("Transfer-Encoding: chunked\r\n"))
    budget = hosted_worst_case(MAX_BODY_BYTES, BUFFERS) + hosted_worst_case(MiB, BUFFERS)
    first = reserve(owner, chunked, budget, BUFFERS)
    assert isinstance(first, HostedReservation)
    assert first.settle(1000) is None  # the chunked body was small: the rest given back
    assert owner.buffers == hosted_worst_case(1000, BUFFERS)
    second = reserve(owner, chunked, budget, BUFFERS)  # room again for a body of up to the maximum
    assert isinstance(second, HostedReservation)
    assert second.settle(MAX_BODY_BYTES) is None
    grown = first.settle(2 * MiB)  # a serialisation larger than what is left
    assert isinstance(grown, Refusal) and grown.rule == "too-much-buffer"
    assert owner.buffers == hosted_worst_case(1000, BUFFERS) + hosted_worst_case(
        MAX_BODY_BYTES, BUFFERS
    )
    first.release()
    first.release()  # once only
    second.release()
    assert owner.buffers == 0


def test_unbounded_reserves_past_the_budget_still_counted_and_warns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    owner = Owner()
    request = parse_request_head(head(f"Content-Length: {MiB}\r\n"))
    held = [reserve(owner, request, FIXED, BUFFERS, unbounded=True) for _ in range(2)]
    assert all(isinstance(h, HostedReservation) for h in held)
    assert owner.buffers == 2 * hosted_worst_case(MiB, BUFFERS)
    assert "unsafe_unbounded_tunnels" in caplog.text
    for h in held:
        assert isinstance(h, HostedReservation)
        assert h.settle(2 * MiB) is None
        h.release()
    assert owner.buffers == 0
