"""lnk_controller.secrets_api.parse_secret_body: the one body the set route takes, and
refusals that never quote it."""

from __future__ import annotations

import json

import pytest

from lnk_controller.secrets_api import MAX_BODY_BYTES, parse_secret_body
from lnk_shared.errors import UsageError

VALUE = "1234567890:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"


def test_the_value_of_a_well_formed_body() -> None:
    assert parse_secret_body(json.dumps({"value": VALUE}).encode()) == VALUE.encode()


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"not json " + VALUE.encode(),
        json.dumps([VALUE]).encode(),
        json.dumps({"value": VALUE, "extra": 1}).encode(),
        json.dumps({"secret": VALUE}).encode(),
        json.dumps({"value": 12345}).encode(),
        json.dumps({"value": VALUE + "\u00e9"}, ensure_ascii=False).encode(),
        b'{"value": "' + b"a" * MAX_BODY_BYTES + b'"}',
    ],
)
def test_a_malformed_body_is_refused_without_quoting_it(body: bytes) -> None:
    with pytest.raises(UsageError) as raised:
        parse_secret_body(body)
    assert VALUE[:12] not in str(raised.value)
